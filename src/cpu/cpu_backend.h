// The CPU reference backend: every operation, exactly docs/semantics.md, float32 math with
// double-precision softmax sums where it is cheap, OpenMP over independent rows.
// Arguments arrive validated (src/core/validate.h); nothing here re-checks shapes.
#pragma once

#include "core/validate.h"
#include "openmla/ops.h"

namespace openmla::cpu {

Status dense_decode(const DenseDecodeArgs& args, const core::DenseDecodeShape& shape);
Status sparse_decode(const SparseDecodeArgs& args, const core::SparseDecodeShape& shape);
Status sparse_prefill(const SparsePrefillArgs& args, const core::SparsePrefillShape& shape);
// Sparse prefill from kv_cache with fp8_tensor_cores: the FP8 path's arithmetic (its roundings
// of q, keys and P), docs/semantics.md.
// One output row of a sparse prefill (query token s, head h): out = o (d_v floats, scaled here
// by the attention sink's factor unless the row is lonely, lse = +inf), max_logits and lse.
void store_prefill_row(const SparsePrefillArgs& args, int64_t s, int64_t h, float* o, int d_v,
                       float lse, float max_logit);
Status sparse_prefill_fp8(const SparsePrefillArgs& args, const core::SparsePrefillShape& shape);
Status merge_attention_states(const MergeStatesArgs& args, const core::MergeStatesShape& shape);
Status kv_cache_write(const KVCacheWriteArgs& args, const core::KVCacheWriteShape& shape);
Status kv_cache_gather(const KVCacheGatherArgs& args, const core::KVCacheWriteShape& shape);
Status plan_decode_schedule(const DecodeScheduleArgs& args, const core::DecodeScheduleShape& shape);
int num_threads();

}  // namespace openmla::cpu
