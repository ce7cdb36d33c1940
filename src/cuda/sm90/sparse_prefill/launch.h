// Host side of SM90 sparse prefill: what cuda::sparse_prefill and its workspace size call. The
// prefill runs the sparse decode kernel family (src/cuda/sm90/sparse_decode) with one query token
// per problem: the token's index list, its heads, the same gather, softmax and splits.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "core/sparse_kernel_plan.h"
#include "core/validate.h"
#include "openmla/ops.h"

namespace openmla::cuda::sm90 {

Status sparse_prefill(const SparsePrefillArgs& args, const core::SparsePrefillShape& shape,
                      cudaStream_t stream, const core::SparseTuning& tuning = {});
size_t sparse_prefill_workspace_size(int device_index, int s_q, int h_q, int d_v);

// From a quantised paged cache (dequant_once.cu): the workspace that lets a call dequantise each
// slot its indices name once (at least the overload above's), whether this call does so (the
// plan in core/sparse_kernel_plan.h and the workspace given; `dequant_once` forces it off or on
// for tests, -1 in production), and the call itself.
size_t sparse_prefill_cache_workspace_size(int device_index, int s_q, int h_q, int d_v,
                                           int64_t topk, const KVCache& cache);
bool sparse_prefill_dequantizes_once(const SparsePrefillArgs& args,
                                     const core::SparsePrefillShape& shape, int dequant_once = -1);
Status sparse_prefill_dequant_once(const SparsePrefillArgs& args,
                                   const core::SparsePrefillShape& shape, cudaStream_t stream);
// The FP8 tensor-core path (args.fp8_tensor_cores; dequant_once.cu, fp8_kernel.cuh): the named
// slots as e4m3 rows of one scale each, then both products on FP8 tensor cores. Needs the
// workspace of sparse_prefill_cache_workspace_size.
Status sparse_prefill_fp8(const SparsePrefillArgs& args, const core::SparsePrefillShape& shape,
                          cudaStream_t stream);

}  // namespace openmla::cuda::sm90
