// One instantiation of the SM90 dense MHA prefill forward (kernel.cuh): bf16, d_qk 128, d_v 128.
#include "cuda/sm90/mha_prefill/kernel.cuh"
#include "cuda/sm90/mha_prefill/launch.h"

namespace openmla::cuda::sm90 {

template cudaError_t launch_mha_fwd_kernel<cute::bfloat16_t, 128>(const MhaFwdParams&, int, int,
                                                                    int, cudaStream_t);

}  // namespace openmla::cuda::sm90
