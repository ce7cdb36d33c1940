// The sparse attention kernel, d_qk 576, sparse mode (index lists), the seesaw order (bf16 tiles).
#include "cuda/sm90/sparse_attention/forms.h"
#include "cuda/sm90/sparse_attention/kernel.cuh"

namespace openmla::cuda::sm90 {
template <>
cudaError_t launch_sparse_form<576, false, 1, true>(const SparseAttentionParams& params,
                                                     cudaStream_t stream) {
  return launch_sparse_traits<SparseTraits<576, false, 1, true>>(params, stream);
}
}  // namespace openmla::cuda::sm90
