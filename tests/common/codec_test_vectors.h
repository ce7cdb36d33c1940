// Test helpers for the KV-cache codecs: random bf16-representable data and small oracles
// written from the format definitions (docs/formats.md), independent of src/core/codec.cc.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace openmla::testing {

// Rounds to the nearest bf16 (ties to even) by bit arithmetic; finite inputs only.
inline float round_to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000u;
  float y;
  std::memcpy(&y, &bits, sizeof(y));
  return y;
}

// d floats, bf16-representable, N(0, 1) times 2^k with k drawn per `group` dims from
// [min_exp, max_exp], so the groups of a token have different scales. About 1 in 16 is zero.
inline std::vector<float> random_bf16_token(std::mt19937& rng, int d, int group, int min_exp = -6,
                                            int max_exp = 6) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(min_exp, max_exp);
  std::uniform_int_distribution<int> zero(0, 15);
  std::vector<float> x(d);
  int k = 0;
  for (int i = 0; i < d; ++i) {
    if (group > 0 && i % group == 0) k = exponent(rng);
    x[i] = zero(rng) == 0 ? 0.0f : std::ldexp(round_to_bf16(normal(rng)), k);
  }
  return x;
}

// Value of e4m3 "fn" code `bits` from its fields: 1 sign, 4 exponent (bias 7), 3 mantissa bits.
inline double e4m3_value(int bits) {
  const int sign = bits >> 7, exp = (bits >> 3) & 0xF, man = bits & 7;
  if (exp == 0xF && man == 7) return std::numeric_limits<double>::quiet_NaN();
  const double magnitude = exp == 0 ? std::ldexp(man, -9) : std::ldexp(1.0 + man / 8.0, exp - 7);
  return sign ? -magnitude : magnitude;
}

// Value of e2m1 code `nibble`: 1 sign, 2 exponent (bias 1), 1 mantissa bit.
inline double e2m1_value(int nibble) {
  static constexpr double kMagnitudes[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  const double magnitude = kMagnitudes[nibble & 7];
  return (nibble & 8) ? -magnitude : magnitude;
}

// Nearest of the codes [0, num_codes) of a sign-magnitude format, ties to the even code,
// saturating at the largest magnitude.
template <typename ValueOf>
int nearest_code(double x, int num_codes, int sign_bit, ValueOf value_of) {
  const double a = std::fabs(x);
  int best = 0;
  if (std::isinf(a)) best = num_codes - 1;
  for (int c = 1; c < num_codes && !std::isinf(a); ++c) {
    const double err = std::fabs(value_of(c) - a), best_err = std::fabs(value_of(best) - a);
    if (err < best_err || (err == best_err && c % 2 == 0)) best = c;
  }
  return std::signbit(x) ? (best | sign_bit) : best;
}

// Oracle e4m3 encoding: nearest-even over the 127 finite magnitudes, saturating, NaN → 0x7F.
inline uint8_t oracle_e4m3(float x) {
  if (std::isnan(x)) return 0x7F;
  return static_cast<uint8_t>(nearest_code(x, 127, 0x80, e4m3_value));
}

// Oracle e2m1 encoding: nearest-even over the 8 magnitudes, saturating, NaN → +0.
inline uint8_t oracle_e2m1(float x) {
  if (std::isnan(x)) return 0;
  return static_cast<uint8_t>(nearest_code(x, 8, 0x8, e2m1_value));
}

// Oracle power-of-two scale exponent: the smallest e with 2^e >= max(amax / 448, 1e-4).
inline int oracle_pow2_exponent(float amax) {
  const float scale = std::max(amax / 448.0f, 1e-4f);
  int e = -140;
  while (std::ldexp(1.0, e) < scale) ++e;
  return e;
}

}  // namespace openmla::testing
