// KV-cache test inputs shared by the CPU and GPU tiers: tokens that stress the quantisers of
// every format (docs/formats.md): random normals at magnitudes from 1e-30 to 3e38, exact powers of two
// at the scale boundaries (group amax = 448 * 2^k, 6 * an e4m3 code, and their float neighbours),
// specials (±inf, NaNs with payloads, ±0, float and bf16 subnormals, the e2m1 ties), all-zero,
// all-inf and all-NaN groups, exact rounding ties of e2m1 and e4m3, and ordinary random tokens.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/test_data.h"

namespace openmla::testing {

inline float float_from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

// Tokens that stress the quantisers (d floats each).
inline std::vector<std::vector<float>> hard_tokens(int d, Rng& rng) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<std::vector<float>> tokens;
  for (double magnitude : {1.0, 1e-30, 1e-20, 1e-6, 1e-3, 0.1, 10.0, 448.0, 1e4, 1e20, 3e38}) {
    std::vector<float> x(d);
    for (float& v : x) v = static_cast<float>(magnitude * rng.normal());
    tokens.push_back(x);
  }
  {  // exact powers of two at the scale boundaries: group amax = 448 * 2^k and 6 * e4m3 codes
    std::vector<float> x(d);
    for (int i = 0; i < d; ++i) {
      const int group = i / 16;
      x[i] = static_cast<float>(
          std::ldexp(i % 16 == 0 ? 448.0 : rng.uniform(-448, 448), group % 24 - 12));
      if (group % 3 == 1 && i % 16 == 0)
        x[i] = static_cast<float>(6.0 * std::ldexp(1.0, group % 16 - 9));
      if (group % 3 == 2 && i % 16 == 0) x[i] = std::nextafter(x[i], inf);
    }
    tokens.push_back(x);
  }
  {  // specials scattered over otherwise normal data, and an all-zero (and -0) stretch
    std::vector<float> x = random_token(rng, d);
    const float specials[] = {inf,
                              -inf,
                              std::numeric_limits<float>::quiet_NaN(),
                              -0.0f,
                              0.0f,
                              float_from_bits(0x7FA00001u),
                              float_from_bits(0xFFC00000u),
                              1e-45f,
                              -1e-40f,
                              3e38f,
                              -3.4e38f,
                              5.0f,
                              2.5f,
                              0.25f,
                              0.75f};
    for (int i = 0; i < d; i += 7) x[i] = specials[(i / 7) % (sizeof(specials) / sizeof(float))];
    for (int i = 64; i < 160 && i < d; ++i) x[i] = (i & 1) ? -0.0f : 0.0f;
    tokens.push_back(x);
  }
  {  // groups that are entirely inf or NaN, and subnormal bf16 values
    std::vector<float> x(d, 0.0f);
    for (int i = 0; i < d; ++i) {
      const int group = (i / 16) % 4;
      x[i] = group == 0   ? inf
             : group == 1 ? std::numeric_limits<float>::quiet_NaN()
             : group == 2 ? float_from_bits(0x00010000u * static_cast<uint32_t>(1 + i % 100))
                          : static_cast<float>(rng.normal());
    }
    tokens.push_back(x);
  }
  {  // exact ties: of e2m1 where a group's amax is 6 (fp4 scale 1), of e4m3 where it is 448
     // (power-of-two scale 1): the midpoints between neighbouring codes, both signs
    const float e2m1_ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    std::vector<float> x(d);
    for (int i = 0; i < d; ++i) {
      const int group = i / 16, k = i % 16;
      const float sign = (i / 3) % 2 ? -1.0f : 1.0f;
      if (k == 0) {
        x[i] = group % 2 ? 448.0f : 6.0f;
      } else if (group % 2 == 0) {
        x[i] = sign * e2m1_ties[k % 7];
      } else if (k < 9) {
        x[i] = sign * static_cast<float>(std::ldexp(2 * (k - 1) + 1, -10));  // subnormal e4m3 ties
      } else {
        const int m = k % 7, e = (i * 5) % 14 - 6;  // (1 + (2m+1)/16) * 2^e, e in [-6, 7]
        x[i] = sign * static_cast<float>(std::ldexp(1.0 + (2 * m + 1) / 16.0, e));
      }
    }
    tokens.push_back(x);
  }
  for (int i = 0; i < 20; ++i) tokens.push_back(random_token(rng, d));
  return tokens;
}

// Every (format, d_qk) a cache can hold: the targets of the write/convert tests.
struct Target {
  KVFormat format;
  int d_qk;
};
inline constexpr Target kTargets[] = {{KVFormat::kBF16, 576},    {KVFormat::kFP16, 576},
                                      {KVFormat::kFP8_V32, 576}, {KVFormat::kBF16, 512},
                                      {KVFormat::kFP16, 512},    {KVFormat::kFP8_Model1, 512},
                                      {KVFormat::kFP8_MX, 512},  {KVFormat::kFP4, 512}};

inline std::string target_name(const Target& t) {
  return std::string(kv_format_name(t.format)) + "/" + std::to_string(t.d_qk);
}

}  // namespace openmla::testing
