// Validation of the fused norm-rope-attention-rope-cast operations (include/openmla/fused_attention.h),
// shared by both backends. Messages name the argument, the expected and the received value.
#pragma once

#include <cstdint>

#include "openmla/fused_attention.h"

namespace openmla::core {

struct FusedShape {
  int64_t s_q, h_q, d_qk, d_v, topk, extra_topk;  // extra_topk 0 without extra cache
  int64_t s_kv;                                   // prefill: kv rows; decode: 0
  int64_t n_wv_group, wv_group_size, num_positions, rope_dim;
  float softmax_scale;                            // resolved
  Device device;
};

// Both check the tensors' shapes, dtypes, strides and devices. On the CPU they also read
// token_positions and refuse a position outside [0, num_positions).
Status validate_fused_prefill(const FusedPrefillArgs& args, FusedShape* shape);
Status validate_fused_decode(const FusedDecodeArgs& args, FusedShape* shape);

}  // namespace openmla::core
