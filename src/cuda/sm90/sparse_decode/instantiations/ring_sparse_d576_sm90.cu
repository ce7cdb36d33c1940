// The sparse decode kernel with the ring fill (traits.h kRing; OPENMLA_SPARSE_RING=1), d_qk 576, the sparse mode.
#include "cuda/sm90/sparse_decode/kernel.cuh"

namespace openmla::cuda::sm90 {
template cudaError_t launch_sparse_decode_ring<576, false>(const SparseDecodeParams&, cudaStream_t);
}  // namespace openmla::cuda::sm90
