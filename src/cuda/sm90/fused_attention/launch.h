// Host side of the fused V4 attention on SM90 (include/openmla/fused_attention.h): the sparse
// attention kernel (src/cuda/sm90/sparse_decode) with its fused steps on (params.h
// SparseFusedParams), one query token a problem, d_qk = d_v = 512.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/sparse_kernel_plan.h"
#include "core/validate_fused.h"
#include "openmla/fused_attention.h"

namespace openmla::cuda::sm90 {

// Validated arguments in (core/validate_fused.h), kernels out. NotImplemented naming what the
// kernel cannot serve (d_qk or d_v other than 512, alignments). `tuning`: the defaults in
// production (tests reach others).
Status fused_prefill(const FusedPrefillArgs& args, const core::FusedShape& shape,
                     cudaStream_t stream, const core::SparseTuning& tuning = {});
Status fused_decode(const FusedDecodeArgs& args, const core::FusedShape& shape,
                    cudaStream_t stream, const core::SparseTuning& tuning = {});
size_t fused_workspace_size(int device_index, int64_t s_q, int64_t h_q);

}  // namespace openmla::cuda::sm90
