#include "cpu/attention_row.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "core/codec.h"
#include "cpu/cpu_backend.h"

// The build has no -march flag, so the hot loops carry their own: one clone per x86-64 level
// (v3 = AVX2 + FMA, v4 = AVX-512), picked at load time.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define OPENMLA_HOT __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define OPENMLA_HOT
#endif

namespace openmla::cpu {

OPENMLA_HOT void tile_scores(const float* q, int rows, const float* keys, int num_keys, int d_qk,
                             float* scores) {
  // Four rows per pass: each key element is loaded once for four FMAs.
  for (int r = 0; r < rows; r += kRowBlock) {
    const float* q0 = q + static_cast<int64_t>(r) * d_qk;
    const float* q1 = q0 + d_qk;
    const float* q2 = q1 + d_qk;
    const float* q3 = q2 + d_qk;
    float* s = scores + static_cast<int64_t>(r) * kKeyTile;
    for (int t = 0; t < num_keys; ++t) {
      const float* k = keys + static_cast<int64_t>(t) * d_qk;
      float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
      for (int d = 0; d < d_qk; ++d) {
        s0 += q0[d] * k[d];
        s1 += q1[d] * k[d];
        s2 += q2[d] * k[d];
        s3 += q3[d] * k[d];
      }
      s[t] = s0;
      s[kKeyTile + t] = s1;
      s[2 * kKeyTile + t] = s2;
      s[3 * kKeyTile + t] = s3;
    }
  }
}

OPENMLA_HOT void tile_accumulate(const float* p, const float* keys, int num_keys, int d_qk, int d_v,
                                 float* acc) {
  // Four keys per pass over the accumulator: one load and store of acc per four FMAs.
  int t = 0;
  for (; t + 4 <= num_keys; t += 4) {
    const float* v0 = keys + static_cast<int64_t>(t) * d_qk;
    const float* v1 = v0 + d_qk;
    const float* v2 = v1 + d_qk;
    const float* v3 = v2 + d_qk;
    const float p0 = p[t], p1 = p[t + 1], p2 = p[t + 2], p3 = p[t + 3];
#pragma omp simd
    for (int d = 0; d < d_v; ++d) acc[d] += p0 * v0[d] + p1 * v1[d] + p2 * v2[d] + p3 * v3[d];
  }
  for (; t < num_keys; ++t) {
    const float* v = keys + static_cast<int64_t>(t) * d_qk;
    const float pt = p[t];
#pragma omp simd
    for (int d = 0; d < d_v; ++d) acc[d] += pt * v[d];
  }
}

OPENMLA_HOT void bf16_to_float(const uint16_t* src, int64_t stride, int n, float* dst) {
  if (stride == 1) {
    for (int i = 0; i < n; ++i) {
      const uint32_t bits = static_cast<uint32_t>(src[i]) << 16;
      std::memcpy(dst + i, &bits, sizeof(float));
    }
    return;
  }
  for (int i = 0; i < n; ++i) dst[i] = codec::bf16_to_float(src[i * stride]);
}

// Branch-free bit arithmetic, so the loop vectorises: normals and inf/NaN move their
// exponent/mantissa into place and rebias; subnormals are exact as mantissa * 2^-24.
static inline float fp16_bits_to_float(uint32_t h) {
  const uint32_t magnitude = h & 0x7FFF;
  const uint32_t normal = (magnitude << 13) + ((127u - 15u) << 23) +
                          static_cast<uint32_t>(magnitude >= 0x7C00) * ((255u - 31u - 112u) << 23);
  const float subnormal = static_cast<float>(static_cast<int32_t>(magnitude)) * 0x1p-24f;
  const uint32_t is_subnormal = 0u - static_cast<uint32_t>(magnitude < 0x0400);
  const uint32_t bits =
      (std::bit_cast<uint32_t>(subnormal) & is_subnormal) | (normal & ~is_subnormal);
  return std::bit_cast<float>(bits | ((h & 0x8000) << 16));
}

OPENMLA_HOT void fp16_to_float(const uint16_t* src, int64_t stride, int n, float* dst) {
  if (stride == 1) {
#pragma omp simd
    for (int i = 0; i < n; ++i) dst[i] = fp16_bits_to_float(src[i]);
    return;
  }
  for (int i = 0; i < n; ++i) dst[i] = fp16_bits_to_float(src[i * stride]);
}

void store_floats(DType dtype, const float* src, int n, void* dst, int64_t stride) {
  switch (dtype) {
    case DType::kFP32: {
      auto* out = static_cast<float*>(dst);
      for (int i = 0; i < n; ++i) out[i * stride] = src[i];
      return;
    }
    case DType::kFP16: {
      auto* out = static_cast<uint16_t*>(dst);
      for (int i = 0; i < n; ++i) out[i * stride] = codec::float_to_fp16(src[i]);
      return;
    }
    default: {
      auto* out = static_cast<uint16_t*>(dst);
      for (int i = 0; i < n; ++i) out[i * stride] = codec::float_to_bf16(src[i]);
      return;
    }
  }
}

int row_chunk(int64_t rows, int64_t outer_units) {
  const int64_t want_units = 2 * static_cast<int64_t>(num_threads());
  const int64_t max_chunks = std::max<int64_t>(1, (rows + kMinRowChunk - 1) / kMinRowChunk);
  const int64_t chunks = std::clamp<int64_t>(
      (want_units + std::max<int64_t>(outer_units, 1) - 1) / std::max<int64_t>(outer_units, 1), 1,
      max_chunks);
  const int64_t chunk = (rows + chunks - 1) / chunks;
  return static_cast<int>((chunk + kRowBlock - 1) / kRowBlock * kRowBlock);
}

RowsAttention::RowsAttention(int rows, int d_qk, int d_v, float scale)
    : rows_(rows),
      padded_rows_((rows + kRowBlock - 1) / kRowBlock * kRowBlock),
      d_qk_(d_qk),
      d_v_(d_v),
      scale_(scale),
      q_(static_cast<size_t>(padded_rows_) * d_qk, 0.f),
      acc_(static_cast<size_t>(rows) * d_v, 0.f),
      scores_(static_cast<size_t>(padded_rows_) * kKeyTile, 0.f),
      max_(rows, -kInf),
      sum_(rows, 0.0),
      attended_(rows, 0) {}

void RowsAttention::attend(const float* keys, int num_keys, const int* key_limit) {
  if (num_keys <= 0) return;
  tile_scores(q_.data(), padded_rows_, keys, num_keys, d_qk_, scores_.data());
  for (int r = 0; r < rows_; ++r) {
    const int n = key_limit ? std::min(key_limit[r], num_keys) : num_keys;
    if (n <= 0) continue;
    float* s = scores_.data() + static_cast<int64_t>(r) * kKeyTile;
    float tile_max = -kInf;
    for (int t = 0; t < n; ++t) {
      s[t] *= scale_;
      tile_max = std::max(tile_max, s[t]);
    }
    float* acc = acc_.data() + static_cast<int64_t>(r) * d_v_;
    if (tile_max > max_[r]) {
      // Rescale what was summed under the old max (nothing yet when it was -inf).
      if (max_[r] != -kInf) {
        const float factor = std::exp(max_[r] - tile_max);
        sum_[r] *= factor;
        for (int d = 0; d < d_v_; ++d) acc[d] *= factor;
      }
      max_[r] = tile_max;
    }
    attended_[r] += n;
    // A NaN logit is skipped by the max above but still reaches the sum (and so the output).
    const float m = max_[r];
    if (m == -kInf) {
      for (int t = 0; t < n; ++t) {
        if (std::isnan(s[t])) sum_[r] = std::numeric_limits<double>::quiet_NaN();
      }
      continue;
    }
    double sum = 0.0;
    for (int t = 0; t < n; ++t) {
      s[t] = std::exp(s[t] - m);
      sum += s[t];
    }
    sum_[r] += sum;
    tile_accumulate(s, keys, n, d_qk_, d_v_, acc);
  }
}

RowsAttention::Result RowsAttention::finish(int r, float* out) const {
  if (attended_[r] == 0) {
    std::fill(out, out + d_v_, 0.f);
    return {kInf, -kInf};
  }
  const float* acc = acc_.data() + static_cast<int64_t>(r) * d_v_;
  const float inv = static_cast<float>(1.0 / sum_[r]);
  for (int d = 0; d < d_v_; ++d) out[d] = acc[d] * inv;
  return {static_cast<float>(max_[r] + std::log(sum_[r])), max_[r]};
}

}  // namespace openmla::cpu
