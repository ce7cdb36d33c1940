// The sparse attention kernel, d_qk 512, sparse mode (index lists), the standard order in 2-CTA
// clusters (each CTA decodes half of every tile).
#include "cuda/sm90/sparse_attention/forms.h"
#include "cuda/sm90/sparse_attention/kernel.cuh"

namespace openmla::cuda::sm90 {
template <>
cudaError_t launch_sparse_form<512, false, 2, false>(const SparseAttentionParams& params,
                                                     cudaStream_t stream) {
  return launch_sparse_traits<SparseTraits<512, false, 2, false>>(params, stream);
}
}  // namespace openmla::cuda::sm90
