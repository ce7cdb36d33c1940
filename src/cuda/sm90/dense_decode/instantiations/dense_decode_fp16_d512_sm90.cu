// Dense decode, fp16 q/k_cache, d_qk 512, SM90 (one instantiation per file: parallel builds).
#include "cuda/sm90/dense_decode/kernel.cuh"

namespace openmla::cuda::sm90 {
template cudaError_t launch_dense_decode_kernel<cute::half_t, 512>(const DenseDecodeParams&, int, int,
                                                           int, cudaStream_t);
}  // namespace openmla::cuda::sm90
