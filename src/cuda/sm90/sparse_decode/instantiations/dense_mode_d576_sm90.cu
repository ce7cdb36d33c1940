// The sparse decode kernel's dense mode (dense decode over a KVCache), d_qk 576 (fp8_v32 and
// bf16 caches).
#include "cuda/sm90/sparse_decode/kernel.cuh"

namespace openmla::cuda::sm90 {
template cudaError_t launch_sparse_decode_kernel<576, true>(const SparseDecodeParams&, cudaStream_t);
}  // namespace openmla::cuda::sm90
