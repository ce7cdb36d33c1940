// Dense decode, bf16 q/k_cache, d_qk 576, SM90 (one instantiation per file: parallel builds).
#include "cuda/sm90/dense_decode/kernel.cuh"

namespace openmla::cuda::sm90 {
template cudaError_t launch_dense_decode_kernel<cute::bfloat16_t, 576>(const DenseDecodeParams&, int, int,
                                                           int, cudaStream_t);
}  // namespace openmla::cuda::sm90
