// The GPU merge of partial attention states (docs/semantics.md, merge), behind cuda::merge_attention_states.
// Arguments arrive validated; this layer only picks the vector width and launches.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "openmla/tensor.h"

namespace openmla::cuda {

// Strides are in elements. part_out's and out's last dim is contiguous.
struct MergeStatesParams {
  const void* part_out = nullptr;  // [num_parts, tokens, heads, d_v]
  DType part_out_dtype = DType::kFP32;
  int64_t part_out_strides[3] = {};  // parts, tokens, heads
  const float* part_lse = nullptr;   // [num_parts, tokens, heads]
  int64_t part_lse_strides[3] = {};
  void* out = nullptr;  // [tokens, heads, d_v]
  DType out_dtype = DType::kFP32;
  int64_t out_strides[2] = {};  // tokens, heads
  float* lse = nullptr;         // [tokens, heads], nullptr when not asked for
  int64_t lse_strides[2] = {};
  int64_t num_parts = 0, tokens = 0, heads = 0, d_v = 0;
};

// One launch on `stream`; 16-byte loads when part_out (and 16-byte-or-narrower stores when out)
// is aligned for them, scalar otherwise. Returns the launch's error.
cudaError_t launch_merge_states(const MergeStatesParams& params, cudaStream_t stream);

}  // namespace openmla::cuda
