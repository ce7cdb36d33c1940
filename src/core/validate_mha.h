// Validation of dense MHA prefill, forward and backward (include/openmla/ops.h, MhaPrefillArgs).
// Messages name the argument, the expected and the received value, as src/core/validate.h does.
#pragma once

#include <cstdint>

#include "openmla/ops.h"

namespace openmla::core {

struct MhaPrefillShape {
  int64_t batch;             // b (cu_seqlens hold b + 1 entries)
  int64_t total_q, total_kv;
  int64_t h_q, h_kv, d_qk, d_v;
  int64_t max_seqlen_q, max_seqlen_kv;
  float softmax_scale;       // resolved (never the <= 0 "default" marker)
  Device device;
};

// Checks shapes, dtypes, strides and devices of every tensor; on the CPU also the cu_seqlens
// values (a CUDA tensor's values are not read here).
Status validate_mha_prefill(const MhaPrefillArgs& args, MhaPrefillShape* shape);
Status validate_mha_prefill_backward(const MhaPrefillBackwardArgs& args, MhaPrefillShape* shape);

}  // namespace openmla::core
