// A double-precision oracle of the fused norm-rope-attention-rope-cast operations, written from
// docs/semantics.md and independently of src/cpu: the q layout, norm and rotations in double,
// the attention through oracle_attend, and an e4m3 / UE8M0 quantiser of its own. It shares only
// the codec's decode of quantised caches with the library (as oracle.h does).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/test_data.h"
#include "cpu/oracle.h"

namespace openmla::testing {

// Flat index, inside one token's h_q * d_qk values, of natural q[h][d] in the permute_q_b_proj
// layout (16-dim chunks interleaved across heads).
inline int64_t fused_q_index(int64_t h_q, int64_t h, int64_t d) {
  return (d / 16) * (h_q * 16) + h * 16 + d % 16;
}
// Index, inside one group's wv_group_size * d_v values of out_fp8, of head hg's dim d.
inline int64_t fused_out_index(int64_t group_size, int64_t hg, int64_t d) {
  return (d / 32) * (group_size * 32) + hg * 32 + d % 32;
}

// Rotation of the interleaved pairs of the last `rope` dims of x by (cos, sin) rows, in double.
inline void oracle_rotate(std::vector<double>& x, const std::vector<double>& cos_sin, int rope,
                          bool inverse) {
  const int half = rope / 2;
  const size_t base = x.size() - rope;
  for (int i = 0; i < half; ++i) {
    const double c = cos_sin[i], s = inverse ? -cos_sin[half + i] : cos_sin[half + i];
    const double x0 = x[base + 2 * i], x1 = x[base + 2 * i + 1];
    x[base + 2 * i] = x0 * c - x1 * s;
    x[base + 2 * i + 1] = x0 * s + x1 * c;
  }
}

// The exponent e of the chunk scale 2^e: the smallest e with max(amax, 1e-4) <= 448 * 2^e.
inline int oracle_scale_exponent(double amax) {
  const double a = std::max(amax, static_cast<double>(1e-4f)) / 448.0;
  int e = static_cast<int>(std::ceil(std::log2(a)));
  while (std::ldexp(1.0, e - 1) >= a) --e;  // guard log2's rounding
  while (std::ldexp(1.0, e) < a) ++e;
  return e;
}

// e4m3 (fn) bits of y, round to nearest even, saturating at 448; |y| finite. A value that
// rounds to zero keeps its sign.
inline uint8_t oracle_e4m3(double y) {
  if (y == 0.0) return 0;  // a zero is +0, whatever its sign
  const uint8_t sign = std::signbit(y) ? 0x80 : 0;
  double a = std::fabs(y);
  int exponent = static_cast<int>(std::floor(std::log2(a)));
  if (std::ldexp(1.0, exponent) > a) --exponent;
  if (std::ldexp(1.0, exponent + 1) <= a) ++exponent;
  const int quantum_exp = std::max(exponent, -6) - 3;  // subnormals share 2^-9
  double q = std::nearbyint(std::ldexp(a, -quantum_exp));
  a = std::min(std::ldexp(q, quantum_exp), 448.0);
  if (a == 0.0) return sign;
  if (a < std::ldexp(1.0, -6)) return sign | static_cast<uint8_t>(std::ldexp(a, 9));
  int e = static_cast<int>(std::floor(std::log2(a)));
  if (std::ldexp(1.0, e) > a) --e;
  const int mantissa = static_cast<int>(std::ldexp(a, 3 - e)) - 8;
  return sign | static_cast<uint8_t>((e + 7) << 3) | static_cast<uint8_t>(mantissa);
}

inline double oracle_e4m3_value(uint8_t bits) {
  const int sign = bits >> 7, field = (bits >> 3) & 0xF, mantissa = bits & 7;
  double v = field == 0 ? std::ldexp(mantissa, -9) : std::ldexp(8 + mantissa, field - 10);
  return sign ? -v : v;
}

// Query (s, h): q's token row `token` (h_q * d_qk bf16 values as doubles, permuted layout).
inline std::vector<double> oracle_fused_query(const std::vector<double>& token, int64_t h_q,
                                              int64_t h, int64_t d_qk, bool norm, double eps,
                                              const std::vector<double>& cos_sin, int rope) {
  std::vector<double> x(d_qk);
  for (int64_t d = 0; d < d_qk; ++d) x[d] = token[fused_q_index(h_q, h, d)];
  double r = 1.0;
  if (norm) {
    double sum = 0.0;
    for (double v : x) sum += v * v;
    r = 1.0 / std::sqrt(sum / static_cast<double>(d_qk) + eps);
  }
  oracle_rotate(x, cos_sin, rope, /*inverse=*/false);
  for (int64_t d = d_qk - rope; d < d_qk; ++d) x[d] = bf16_bits_to_double(double_to_bf16_bits(x[d]));
  for (double& v : x) v *= r;
  return x;
}

// The output row after the sink and the inverse rotation (what the cast quantises).
inline std::vector<double> oracle_fused_output(OracleRow row, const double* sink,
                                               const std::vector<double>& cos_sin, int rope) {
  if (sink != nullptr) oracle_apply_sink(*sink, &row);
  oracle_rotate(row.out, cos_sin, rope, /*inverse=*/true);
  return row.out;
}

// The cast of one group's rows [wv_group_size][d_v] into bytes (permuted layout) and scale
// exponents per chunk position c * wv_group_size + hg.
struct OracleCast {
  std::vector<uint8_t> bytes;
  std::vector<int> exponents;
};
inline OracleCast oracle_cast_group(const std::vector<std::vector<double>>& rows, int64_t d_v) {
  const int64_t g = static_cast<int64_t>(rows.size());
  OracleCast cast;
  cast.bytes.assign(g * d_v, 0);
  cast.exponents.assign(g * d_v / 32, 0);
  for (int64_t hg = 0; hg < g; ++hg) {
    for (int64_t c = 0; c < d_v / 32; ++c) {
      double amax = 0.0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(rows[hg][c * 32 + j]));
      const int e = oracle_scale_exponent(amax);
      cast.exponents[c * g + hg] = e;
      for (int j = 0; j < 32; ++j) {
        cast.bytes[fused_out_index(g, hg, c * 32 + j)] =
            oracle_e4m3(std::ldexp(rows[hg][c * 32 + j], -e));
      }
    }
  }
  return cast;
}

}  // namespace openmla::testing
