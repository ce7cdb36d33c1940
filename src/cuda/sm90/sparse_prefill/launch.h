// Host side of SM90 sparse prefill: what cuda::sparse_prefill and its workspace size call. The
// prefill runs the sparse decode kernel family (src/cuda/sm90/sparse_decode) with one query token
// per problem: the token's index list, its heads, the same gather, softmax and splits.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "core/validate.h"
#include "openmla/ops.h"

namespace openmla::cuda::sm90 {

Status sparse_prefill(const SparsePrefillArgs& args, const core::SparsePrefillShape& shape,
                      cudaStream_t stream);
size_t sparse_prefill_workspace_size(int device_index, int s_q, int h_q, int d_v);

}  // namespace openmla::cuda::sm90
