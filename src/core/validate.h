// One validation function per operation, shared by both backends. Each checks dtypes, ranks,
// shapes, strides, formats, head dims and devices, and fills the derived sizes the backends need.
// Messages name the argument, the expected and the received value:
//   "dense_decode: k_cache: expected dtype bf16 (q's dtype), got fp16".
#pragma once

#include <cstdint>

#include "openmla/ops.h"

namespace openmla::core {

struct DenseDecodeShape {
  int64_t batch, s_q, h_q, h_kv, d_qk, d_v;
  int64_t num_blocks, page_size, max_blocks;
  float softmax_scale;  // resolved (never the <= 0 "default" marker)
  Device device;
};
Status validate_dense_decode(const DenseDecodeArgs& args, DenseDecodeShape* shape);

struct SparseDecodeShape {
  int64_t batch, s_q, h_q, d_qk, d_v, topk, extra_topk;  // extra_topk 0 without extra cache
  float softmax_scale;
  Device device;
};
Status validate_sparse_decode(const SparseDecodeArgs& args, SparseDecodeShape* shape);

struct SparsePrefillShape {
  int64_t s_q, s_kv, h_q, h_kv, d_qk, d_v, topk;
  float softmax_scale;
  Device device;
};
Status validate_sparse_prefill(const SparsePrefillArgs& args, SparsePrefillShape* shape);

struct MergeStatesShape {
  int64_t num_parts, tokens, heads, d_v;
  Device device;
};
Status validate_merge_states(const MergeStatesArgs& args, MergeStatesShape* shape);

struct KVCacheWriteShape {
  int64_t num_tokens, d_qk;
  Device device;
};
Status validate_kv_cache_write(const KVCacheWriteArgs& args, KVCacheWriteShape* shape);
Status validate_kv_cache_gather(const KVCacheGatherArgs& args, KVCacheWriteShape* shape);

struct DecodeScheduleShape {
  int64_t batch, num_sm_parts;
  Device device;
};
Status validate_decode_schedule(const DecodeScheduleArgs& args, DecodeScheduleShape* shape);

// Helpers shared by the validators (and the Python layer's messages stay the same shape).
Status check_dtype(const TensorView& t, DType expected, const char* op, const char* arg);
Status check_rank(const TensorView& t, int rank, const char* op, const char* arg);
Status check_dim(const TensorView& t, int dim, int64_t expected, const char* op, const char* arg,
                 const char* dim_name);
Status check_last_dim_contiguous(const TensorView& t, const char* op, const char* arg);
Status check_device(const TensorView& t, Device expected, const char* op, const char* arg);

}  // namespace openmla::core
