// The sparse decode kernel with the ring fill (traits.h kRing: the forms core/sparse_kernel_plan.cc picks), d_qk 576, the sparse mode.
#include "cuda/sm90/sparse_decode/kernel.cuh"

namespace openmla::cuda::sm90 {
template cudaError_t launch_sparse_decode_ring<576, false>(const SparseDecodeParams&, cudaStream_t);
}  // namespace openmla::cuda::sm90
