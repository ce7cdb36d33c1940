// The fused V4 attention's sparse kernels (traits.h kFused), d_qk 512, the sparse mode: the
// forms core/sparse_kernel_plan.cc picks for a fused call's caches.
#include "cuda/sm90/sparse_decode/kernel.cuh"

namespace openmla::cuda::sm90 {

cudaError_t launch_sparse_decode_fused(const SparseDecodeParams& params, cudaStream_t stream) {
  if (params.ring == 2) {  // quantised keys of one format: the round slots
    return launch_sparse_decode_traits<SparseDecodeTraits<512, false, false, false, 2, true>>(
        params, stream);
  }
  if (params.ring != 0) return cudaErrorInvalidValue;  // (never: the plan's fused forms)
  if (params.seesaw) {  // bf16 kv: the staggered seesaw (launch.cu sets the stagger)
    if (!params.stagger) return cudaErrorInvalidValue;
    return launch_sparse_decode_traits<SparseDecodeTraits<512, false, true, true, 0, true>>(
        params, stream);
  }
  // caches of two formats (the token fill reading each format) and other quantised layouts
  return launch_sparse_decode_traits<SparseDecodeTraits<512, false, false, false, 0, true>>(
      params, stream);
}

}  // namespace openmla::cuda::sm90
