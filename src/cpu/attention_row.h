// The attention core the CPU operations share: a set of query rows that see the same keys, fed
// tiles of up to kKeyTile keys already converted to float, with an online softmax (float32
// logits and accumulator, double exp-sum). Dense decode, sparse decode and sparse prefill differ
// only in how they find and convert keys; this header is the math they have in common.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "openmla/tensor.h"

namespace openmla::cpu {

// Keys converted to float at once and then used by every row of a work unit.
constexpr int kKeyTile = 64;
// Rows per score micro-kernel. Row counts are padded to it so every real row goes through the same
// code path: a row's result then does not depend on how rows are chunked over threads.
constexpr int kRowBlock = 4;
// A work unit never holds fewer rows than this: every unit re-converts its keys.
constexpr int kMinRowChunk = 16;

constexpr float kInf = std::numeric_limits<float>::infinity();

// --- hot loops (attention_row.cc, one clone per x86-64 level) --------------------------------
// scores[r * kKeyTile + t] = q_r · k_t for r < rows (a multiple of kRowBlock), t < num_keys.
void tile_scores(const float* q, int rows, const float* keys, int num_keys, int d_qk,
                 float* scores);
// acc[:d_v] += Σ_{t < num_keys} p[t] · keys[t * d_qk + :d_v]  (V = first d_v dims of each key).
void tile_accumulate(const float* p, const float* keys, int num_keys, int d_qk, int d_v,
                     float* acc);
// dst[i] = float(src[i * stride]) for bf16 / fp16 bits.
void bf16_to_float(const uint16_t* src, int64_t stride, int n, float* dst);
void fp16_to_float(const uint16_t* src, int64_t stride, int n, float* dst);

// Converts `n` elements of a bf16/fp16 tensor (element stride `stride`) to float.
inline void half_to_float(DType dtype, const void* src, int64_t stride, int n, float* dst) {
  const auto* bits = static_cast<const uint16_t*>(src);
  if (dtype == DType::kFP16) {
    fp16_to_float(bits, stride, n, dst);
  } else {
    bf16_to_float(bits, stride, n, dst);
  }
}

// Writes `n` floats into a bf16/fp16/fp32 tensor (element stride `stride`), rounding to nearest
// even.
void store_floats(DType dtype, const float* src, int n, void* dst, int64_t stride);

// Address of element `offset` (in elements) of `t`.
inline void* element_ptr(const TensorView& t, int64_t offset) {
  return static_cast<char*>(t.data) + offset * static_cast<int64_t>(dtype_size_bytes(t.dtype));
}

// n contiguous elements of a bf16 / fp16 / fp32 tensor from element `offset` on, as floats. The
// public operations take bf16 queries; the fused operation hands the attention fp32 ones.
inline void load_floats(const TensorView& t, int64_t offset, int n, float* dst) {
  if (t.dtype == DType::kFP32) {
    const float* src = t.data_as<const float>() + offset;
    for (int i = 0; i < n; ++i) dst[i] = src[i];
  } else {
    half_to_float(t.dtype, element_ptr(t, offset), 1, n, dst);
  }
}

// Number of rows per work unit for `rows` rows in each of `outer_units` independent problems:
// enough units to keep every thread busy, a multiple of kRowBlock, at least kMinRowChunk.
int row_chunk(int64_t rows, int64_t outer_units);

// --- the online softmax of a set of rows ------------------------------------------------------
class RowsAttention {
 public:
  struct Result {
    float lse;        // +inf for a lonely row
    float max_logit;  // -inf for a lonely row
  };

  RowsAttention(int rows, int d_qk, int d_v, float scale);

  int rows() const { return rows_; }
  // Row r's query, d_qk floats; the caller fills it (padding rows stay zero).
  float* q(int r) { return q_.data() + static_cast<int64_t>(r) * d_qk_; }

  // Attends `num_keys` (<= kKeyTile) keys at `keys` (d_qk floats each). Row r attends only the
  // first key_limit[r] keys of the tile (key_limit == nullptr: all).
  void attend(const float* keys, int num_keys, const int* key_limit = nullptr);

  // Row r's normalised output (d_v floats, zeros for a lonely row) and its lse / max logit.
  Result finish(int r, float* out) const;

 private:
  int rows_, padded_rows_, d_qk_, d_v_;
  float scale_;
  std::vector<float> q_;           // [padded_rows, d_qk]
  std::vector<float> acc_;         // [rows, d_v], unnormalised
  std::vector<float> scores_;      // [padded_rows, kKeyTile]
  std::vector<float> max_;         // running max of scaled logits, -inf before any key
  std::vector<double> sum_;        // running Σ exp(logit - max)
  std::vector<int64_t> attended_;  // keys seen; 0 makes the row lonely
};

// The attention-sink factor 1 / (1 + exp(sink - lse)) (sink = +inf: 0; -inf: 1).
inline float sink_factor(float sink, float lse) {
  return static_cast<float>(1.0 / (1.0 + std::exp(static_cast<double>(sink) - lse)));
}

}  // namespace openmla::cpu
