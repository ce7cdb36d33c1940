// Dense MHA prefill backward main kernel, fp16, d_qk 192, SM90 (one instantiation per file).
#include "cuda/sm90/mha_prefill/backward/kernel.cuh"
#include "cuda/sm90/mha_prefill/backward/launch.h"

namespace openmla::cuda::sm90::mha_bwd {
template cudaError_t launch_main<cute::half_t, 192>(const MhaBwdParams&, cudaStream_t);
}  // namespace openmla::cuda::sm90::mha_bwd
