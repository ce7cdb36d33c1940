// Sparse decode, d_qk 512 (fp8_model1, fp8_mx, fp4 and bf16 caches).
#include "cuda/sm90/sparse_decode/kernel.cuh"

namespace openmla::cuda::sm90 {
template cudaError_t launch_sparse_decode_kernel<512, false>(const SparseDecodeParams&, cudaStream_t);
}  // namespace openmla::cuda::sm90
