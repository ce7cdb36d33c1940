// Sparse prefill on FP8 tensor cores (fp8_kernel.cuh), d_qk 576.
#include "cuda/sm90/sparse_prefill/fp8_kernel.cuh"

namespace openmla::cuda::sm90 {
template cudaError_t launch_sparse_prefill_fp8<576>(const Fp8PrefillParams&, int, int, cudaStream_t);
}  // namespace openmla::cuda::sm90
