// The forms of the sparse attention kernel that exist, each one explicit instantiation
// (instantiations/<mode>_d<d_qk>_<order>.cu; configuring fails when that folder and this
// list differ: cmake/cuda_kernels.cmake). Which form runs for which grid: core/sparse_kernel_plan.h.
#pragma once

#include <cuda_runtime.h>

#include "cuda/sm90/sparse_attention/params.h"

// X(d_qk, dense mode, cluster size, seesaw order, file name's mode and order)
#define OPENMLA_SM90_SPARSE_FORMS(X)            \
  X(576, false, 1, false, sparse, standard)     \
  X(576, false, 2, false, sparse, crossover)    \
  X(576, false, 1, true, sparse, seesaw)        \
  X(576, true, 1, false, dense, standard)       \
  X(576, true, 2, false, dense, crossover)      \
  X(512, false, 1, false, sparse, standard)     \
  X(512, false, 2, false, sparse, crossover)    \
  X(512, false, 1, true, sparse, seesaw)        \
  X(512, true, 1, false, dense, standard)       \
  X(512, true, 2, false, dense, crossover)

namespace openmla::cuda::sm90 {

// One launch of a form; defined (specialised) only for the forms listed, each in its own file.
template <int kHeadDimQK, bool kDense, int kCluster, bool kSeesaw>
cudaError_t launch_sparse_form(const SparseAttentionParams& params, cudaStream_t stream);

#define OPENMLA_SPARSE_FORM_DECLARE(d, dense, cluster, seesaw, mode, order) \
  template <>                                                              \
  cudaError_t launch_sparse_form<d, dense, cluster, seesaw>(const SparseAttentionParams&, \
                                                            cudaStream_t);
OPENMLA_SM90_SPARSE_FORMS(OPENMLA_SPARSE_FORM_DECLARE)
#undef OPENMLA_SPARSE_FORM_DECLARE

}  // namespace openmla::cuda::sm90
