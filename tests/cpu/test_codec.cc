// Host codecs (src/core/codec.h): scalar conversions against golden codes and independent
// oracles, the scale rules, whole tokens' golden bytes, round-trip bounds, special values and
// layouts (strided blocks, token-interleaved variants).
#include "core/codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/codec_test_vectors.h"
#include "openmla/kv_format.h"

namespace openmla {
namespace {

using codec::decode_token;
using codec::encode_token;
using testing::e2m1_value;
using testing::e4m3_value;
using testing::oracle_e2m1;
using testing::oracle_e4m3;
using testing::oracle_pow2_exponent;
using testing::random_bf16_token;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr KVFormat kAllFormats[] = {KVFormat::kBF16,       KVFormat::kFP16,   KVFormat::kFP8_V32,
                                    KVFormat::kFP8_Model1, KVFormat::kFP8_MX, KVFormat::kFP4};
constexpr KVFormat kFp8Formats[] = {KVFormat::kFP8_V32, KVFormat::kFP8_Model1, KVFormat::kFP8_MX};

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Every (offset, bytes) part of token `t` under `layout`.
struct PartSpan {
  int64_t begin, bytes;
};
std::vector<PartSpan> token_spans(const KVLayout& layout, int t) {
  const KVFormatInfo info = kv_format_info(layout.format, layout.d_qk);
  std::vector<PartSpan> spans = {{layout.data_offset + t * layout.data_stride, info.data_bytes}};
  if (info.scale_bytes)
    spans.push_back({layout.scale_offset + t * layout.scale_stride, info.scale_bytes});
  if (info.rope_bytes)
    spans.push_back({layout.rope_offset + t * layout.rope_stride, info.rope_bytes});
  return spans;
}

// The token's bytes, parts concatenated in data, scale, rope order.
std::vector<uint8_t> token_bytes(const KVLayout& layout, const uint8_t* block, int t) {
  std::vector<uint8_t> bytes;
  for (const PartSpan& s : token_spans(layout, t)) {
    bytes.insert(bytes.end(), block + s.begin, block + s.begin + s.bytes);
  }
  return bytes;
}

std::vector<float> decode(const KVLayout& layout, const uint8_t* block, int t) {
  std::vector<float> out(layout.d_qk);
  decode_token(layout, block, t, out.data());
  return out;
}

int group_size_or_all(const KVFormatInfo& info) {
  return info.group_size > 0 ? info.group_size : info.d_qk;
}

// --- scalar conversions -----------------------------------------------------------------------

TEST(CodecScalar, Bf16GoldenAndRoundToNearestEven) {
  EXPECT_EQ(codec::float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(codec::float_to_bf16(-2.0f), 0xC000);
  EXPECT_EQ(codec::float_to_bf16(1.5f), 0x3FC0);
  // 1 + 2^-8 is half a bf16 ulp above 1: ties to the even 0x3F80; 1 + 3*2^-8 ties up to 0x3F82.
  EXPECT_EQ(codec::float_to_bf16(1.0f + 0x1p-8f), 0x3F80);
  EXPECT_EQ(codec::float_to_bf16(1.0f + 0x3p-8f), 0x3F82);
  EXPECT_EQ(codec::float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);
  EXPECT_EQ(codec::float_to_bf16(kInf), 0x7F80);
  EXPECT_EQ(codec::float_to_bf16(-kInf), 0xFF80);
  EXPECT_EQ(codec::float_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // RNE overflows
  EXPECT_EQ(codec::bf16_to_float(0x3F80), 1.0f);
  EXPECT_EQ(codec::bf16_to_float(0xC040), -3.0f);
}

TEST(CodecScalar, Bf16NanStaysNanAndRandomMatchesRounding) {
  EXPECT_TRUE(std::isnan(codec::bf16_to_float(codec::float_to_bf16(kNaN))));
  EXPECT_TRUE(std::isnan(codec::bf16_to_float(codec::float_to_bf16(-kNaN))));
  // A signalling-looking NaN whose payload lives only in the dropped bits must stay NaN.
  const float low_payload_nan = std::bit_cast<float>(0x7F800001u);
  EXPECT_TRUE(std::isnan(codec::bf16_to_float(codec::float_to_bf16(low_payload_nan))));
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 100.0f);
  for (int i = 0; i < 10000; ++i) {
    const float x = normal(rng);
    const float y = codec::bf16_to_float(codec::float_to_bf16(x));
    EXPECT_EQ(y, testing::round_to_bf16(x));
    EXPECT_LE(std::fabs(y - x), std::ldexp(std::fabs(x), -8));  // half an ulp of 7 bits
  }
}

TEST(CodecScalar, Fp16GoldenAndOverflow) {
  EXPECT_EQ(codec::float_to_fp16(1.0f), 0x3C00);
  EXPECT_EQ(codec::float_to_fp16(-2.5f), 0xC100);
  EXPECT_EQ(codec::float_to_fp16(65504.0f), 0x7BFF);
  EXPECT_EQ(codec::float_to_fp16(65519.0f), 0x7BFF);         // below the midpoint to inf
  EXPECT_EQ(codec::float_to_fp16(65520.0f), 0x7C00);         // the midpoint ties to "even" inf
  EXPECT_EQ(codec::float_to_fp16(1.0f + 0x1p-11f), 0x3C00);  // tie to even
  EXPECT_EQ(codec::float_to_fp16(1.0f + 0x3p-11f), 0x3C02);  // tie to even, up
  EXPECT_EQ(codec::float_to_fp16(0x1p-24f), 0x0001);         // smallest subnormal
  EXPECT_EQ(codec::fp16_to_float(0x3555), 0x1.554p-2f);
  EXPECT_TRUE(std::isnan(codec::fp16_to_float(codec::float_to_fp16(kNaN))));
}

TEST(CodecScalar, E4M3Golden) {
  EXPECT_EQ(codec::float_to_e4m3(1.0f), 0x38);
  EXPECT_EQ(codec::float_to_e4m3(448.0f), 0x7E);
  EXPECT_EQ(codec::float_to_e4m3(-448.0f), 0xFE);
  EXPECT_EQ(codec::float_to_e4m3(-2.0f), 0xC0);
  EXPECT_EQ(codec::float_to_e4m3(1.5f), 0x3C);
  EXPECT_EQ(codec::float_to_e4m3(0.0625f), 0x18);
  EXPECT_EQ(codec::float_to_e4m3(0x1p-6f), 0x08);  // smallest normal
  EXPECT_EQ(codec::float_to_e4m3(0x1p-9f), 0x01);  // smallest subnormal
  EXPECT_EQ(codec::float_to_e4m3(0x7p-9f), 0x07);  // largest subnormal
  EXPECT_EQ(codec::float_to_e4m3(0.0f), 0x00);
  EXPECT_EQ(codec::float_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(codec::e4m3_to_float(0x01), 0x1p-9f);
  EXPECT_EQ(codec::e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(codec::e4m3_to_float(0xC0), -2.0f);
  EXPECT_TRUE(std::isnan(codec::e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(codec::e4m3_to_float(0xFF)));
}

TEST(CodecScalar, E4M3DecodeEveryCodeMatchesFieldFormula) {
  for (int bits = 0; bits < 256; ++bits) {
    const double expected = e4m3_value(bits);
    const float got = codec::e4m3_to_float(static_cast<uint8_t>(bits));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(got)) << bits;
    } else {
      EXPECT_EQ(got, static_cast<float>(expected)) << bits;
      EXPECT_EQ(std::signbit(got), bits >= 0x80) << bits;
    }
  }
}

TEST(CodecScalar, E4M3EncodeIsNearestEvenAtEveryMidpoint) {
  // Every code, and the midpoint (exactly a float) between neighbouring codes, both signs.
  for (int c = 0; c < 126; ++c) {
    for (float sign : {1.0f, -1.0f}) {
      const float lo = sign * static_cast<float>(e4m3_value(c));
      const float mid = sign * static_cast<float>((e4m3_value(c) + e4m3_value(c + 1)) / 2);
      EXPECT_EQ(codec::float_to_e4m3(lo), oracle_e4m3(lo)) << lo;
      EXPECT_EQ(codec::float_to_e4m3(mid), oracle_e4m3(mid)) << mid;
      const uint8_t even = (c % 2 == 0) ? c : c + 1;
      EXPECT_EQ(codec::float_to_e4m3(mid) & 0x7F, even) << mid;
      EXPECT_EQ(codec::float_to_e4m3(std::nextafter(mid, 0.0f)) & 0x7F, c) << mid;
      EXPECT_EQ(codec::float_to_e4m3(std::nextafter(mid, sign * kInf)) & 0x7F, c + 1) << mid;
    }
  }
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> log_magnitude(-14.0f, 10.0f);
  for (int i = 0; i < 20000; ++i) {
    const float x = (i % 2 ? -1.0f : 1.0f) * std::exp2(log_magnitude(rng));
    ASSERT_EQ(codec::float_to_e4m3(x), oracle_e4m3(x)) << x;
  }
}

TEST(CodecScalar, E4M3SaturatesAndPinsNan) {
  for (float x : {449.0f, 464.0f, 465.0f, 1e30f, kInf}) {
    EXPECT_EQ(codec::float_to_e4m3(x), 0x7E) << x;
    EXPECT_EQ(codec::float_to_e4m3(-x), 0xFE) << x;
  }
  EXPECT_EQ(codec::float_to_e4m3(kNaN), 0x7F);
  EXPECT_EQ(codec::float_to_e4m3(-kNaN), 0x7F);  // sign dropped
  EXPECT_EQ(codec::float_to_e4m3(std::bit_cast<float>(0xFF800001u)), 0x7F);
  EXPECT_EQ(codec::float_to_e4m3(0x1p-10f), 0x00);  // half the smallest subnormal: ties to 0
  EXPECT_EQ(codec::float_to_e4m3(0x3p-10f), 0x02);  // 1.5 subnormal steps: ties to even 2
  EXPECT_EQ(codec::float_to_e4m3(0x1.000002p-10f), 0x01);
}

TEST(CodecScalar, E2M1EveryCode) {
  const float magnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int c = 0; c < 8; ++c) {
    EXPECT_EQ(codec::e2m1_to_float(static_cast<uint8_t>(c)), magnitudes[c]);
    EXPECT_EQ(codec::e2m1_to_float(static_cast<uint8_t>(c | 8)), -magnitudes[c]);
    EXPECT_EQ(codec::float_to_e2m1(magnitudes[c]), c);
    if (c > 0) {
      EXPECT_EQ(codec::float_to_e2m1(-magnitudes[c]), c | 8);
    }
  }
  EXPECT_TRUE(std::signbit(codec::e2m1_to_float(0x8)));
  EXPECT_EQ(codec::e2m1_to_float(0x37), 6.0f);  // only the low nibble counts
}

TEST(CodecScalar, E2M1TiesSaturationAndNan) {
  EXPECT_EQ(codec::float_to_e2m1(0.25f), 0x0);  // ties to even: 0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0
  EXPECT_EQ(codec::float_to_e2m1(0.75f), 0x2);
  EXPECT_EQ(codec::float_to_e2m1(1.25f), 0x2);
  EXPECT_EQ(codec::float_to_e2m1(1.75f), 0x4);
  EXPECT_EQ(codec::float_to_e2m1(2.5f), 0x4);
  EXPECT_EQ(codec::float_to_e2m1(3.5f), 0x6);
  EXPECT_EQ(codec::float_to_e2m1(5.0f), 0x6);
  EXPECT_EQ(codec::float_to_e2m1(-5.0001f), 0xF);
  EXPECT_EQ(codec::float_to_e2m1(7.0f), 0x7);
  EXPECT_EQ(codec::float_to_e2m1(kInf), 0x7);
  EXPECT_EQ(codec::float_to_e2m1(-kInf), 0xF);
  EXPECT_EQ(codec::float_to_e2m1(kNaN), 0x0);  // the toolkit alone would give +6
  EXPECT_EQ(codec::float_to_e2m1(-kNaN), 0x0);
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> uniform(-8.0f, 8.0f);
  for (int i = 0; i < 20000; ++i) {
    const float x = uniform(rng);
    ASSERT_EQ(codec::float_to_e2m1(x), oracle_e2m1(x)) << x;
  }
}

TEST(CodecScalar, E8M0) {
  EXPECT_EQ(codec::e8m0_from_exponent(0), 127);
  EXPECT_EQ(codec::e8m0_to_float(127), 1.0f);
  EXPECT_EQ(codec::e8m0_to_float(120), 0x1p-7f);
  EXPECT_EQ(codec::e8m0_to_float(0), 0x1p-127f);
  EXPECT_EQ(codec::e8m0_to_float(254), 0x1p127f);
  EXPECT_TRUE(std::isnan(codec::e8m0_to_float(255)));
  EXPECT_EQ(codec::e8m0_from_exponent(-13), 114);
  EXPECT_EQ(codec::e8m0_from_exponent(-500), 0);
  EXPECT_EQ(codec::e8m0_from_exponent(500), 254);  // never the NaN code
  for (int e = -127; e <= 127; ++e) {
    EXPECT_EQ(codec::e8m0_to_float(codec::e8m0_from_exponent(e)), std::ldexp(1.0f, e));
  }
}

TEST(CodecScalar, Fp4PackingLowNibbleIsEvenDim) {
  EXPECT_EQ(codec::fp4_pack(0x7, 0x4), 0x47);
  EXPECT_EQ(codec::fp4_pack(0x1F, 0x2), 0x2F);  // extra bits dropped
  for (int lo = 0; lo < 16; ++lo) {
    for (int hi = 0; hi < 16; ++hi) {
      const uint8_t byte = codec::fp4_pack(lo, hi);
      EXPECT_EQ(codec::fp4_unpack(byte, 10), lo);
      EXPECT_EQ(codec::fp4_unpack(byte, 11), hi);
    }
  }
}

// --- group scales ---------------------------------------------------------------------------

TEST(CodecScale, FiniteAmaxIgnoresNanAndInf) {
  const float x[] = {1.0f, -3.5f, kNaN, kInf, -kInf, 2.0f};
  EXPECT_EQ(codec::finite_amax(x, 6), 3.5f);
  const float none[] = {kNaN, -kInf};
  EXPECT_EQ(codec::finite_amax(none, 2), 0.0f);
  EXPECT_EQ(codec::finite_amax(x, 0), 0.0f);
}

TEST(CodecScale, Pow2ExactPowerOfTwoBoundary) {
  for (int k = -12; k <= 100; ++k) {
    const float amax = std::ldexp(448.0f, k);  // amax / 448 == 2^k exactly
    EXPECT_EQ(codec::pow2_scale_exponent(amax), k) << k;
    EXPECT_EQ(codec::pow2_scale_exponent(std::nextafter(amax, kInf)), k + 1) << k;
    EXPECT_EQ(codec::pow2_scale_exponent(std::nextafter(amax, 0.0f)), k) << k;
  }
}

TEST(CodecScale, Pow2FloorAndRandom) {
  // 1e-4 lies in (2^-14, 2^-13], so the floor gives 2^-13.
  EXPECT_EQ(codec::pow2_scale_exponent(0.0f), -13);
  EXPECT_EQ(codec::pow2_scale_exponent(1e-30f), -13);
  EXPECT_EQ(codec::pow2_scale_exponent(448.0f * 1e-4f), -13);
  EXPECT_EQ(codec::pow2_scale_exponent(448.0f * 0x1p-13f), -13);
  EXPECT_EQ(codec::pow2_scale_exponent(std::nextafter(448.0f * 0x1p-13f, kInf)), -12);
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> log_amax(-20.0f, 40.0f);
  for (int i = 0; i < 10000; ++i) {
    const float amax = std::exp2(log_amax(rng));
    const int e = codec::pow2_scale_exponent(amax);
    ASSERT_EQ(e, oracle_pow2_exponent(amax)) << amax;
    ASSERT_LE(amax / std::ldexp(1.0f, e), 448.0f);  // elements never saturate
  }
}

TEST(CodecScale, Fp4ScaleRoundsToNearestE4M3WithFloor) {
  EXPECT_EQ(codec::fp4_scale_e4m3(3.0f), 0x30);            // 0.5
  EXPECT_EQ(codec::fp4_scale_e4m3(7.5f), 0x3A);            // 1.25 exactly
  EXPECT_EQ(codec::fp4_scale_e4m3(6.375f), 0x38);          // 1.0625 ties down to 1.0
  EXPECT_EQ(codec::fp4_scale_e4m3(6.0f * 1.1875f), 0x3A);  // 1.1875 ties up to 1.25
  EXPECT_EQ(codec::fp4_scale_e4m3(0.0f), 0x01);            // 1e-4 rounds to e4m3 0: floor 2^-9
  EXPECT_EQ(codec::fp4_scale_e4m3(6.0f * 0x1p-10f), 0x01);
  EXPECT_EQ(codec::fp4_scale_e4m3(6.0f * 0x3p-10f), 0x02);
  EXPECT_EQ(codec::fp4_scale_e4m3(1e9f), 0x7E);  // saturates at 448
  std::mt19937 rng(19);
  std::uniform_real_distribution<float> log_amax(-16.0f, 12.0f);
  for (int i = 0; i < 10000; ++i) {
    const float amax = std::exp2(log_amax(rng));
    const uint8_t oracle = oracle_e4m3(std::max(amax / 6.0f, 1e-4f));
    ASSERT_EQ(codec::fp4_scale_e4m3(amax), std::max<uint8_t>(oracle, 1)) << amax;
  }
}

// --- whole tokens: golden bytes ---------------------------------------------------------------

TEST(CodecToken, FP8MXGoldenBytes) {
  std::vector<float> x(512, 0.0f);
  // Group 0: amax 3 → 3/448 in (2^-8, 2^-7] → scale 2^-7 (e8m0 120).
  x[0] = 3.0f, x[1] = 1.0f, x[2] = -0.5f, x[31] = 0x1p-7f;
  // Group 1: amax 448 → scale 1 (e8m0 127); 2^-10 ties to 0, 1.0625 ties to 1.0.
  x[32] = 448.0f, x[33] = -1.0f, x[34] = 0x1p-9f, x[35] = 0x1p-10f, x[36] = 1.0625f;
  // Group 2: amax 1e-6 → the 1e-4 floor → 2^-13 (e8m0 114); 1e-6 * 2^13 = 0.0082 ≈ 4 * 2^-9.
  x[64] = 1e-6f;
  // Group 15: inf ignored by amax (2 → 2^-7); inf saturates, NaN → 0x7F.
  x[509] = kNaN, x[510] = 2.0f, x[511] = -kInf;

  std::vector<uint8_t> data(512, 0x00), scales(16, 114);
  data[0] = 0x7C, data[1] = 0x70, data[2] = 0xE8, data[31] = 0x38;  // 384, 128, -64, 1
  data[32] = 0x7E, data[33] = 0xB8, data[34] = 0x01, data[35] = 0x00, data[36] = 0x38;
  data[64] = 0x04;
  data[509] = 0x7F, data[510] = 0x78, data[511] = 0xFE;  // NaN, 256, -448
  scales[0] = 120, scales[1] = 127, scales[15] = 120;

  // Token 1 of a 2-token block: data at 512, scales at 2 * 512 + 16.
  const KVLayout layout = default_kv_layout(KVFormat::kFP8_MX, 2);
  std::vector<uint8_t> block(layout.block_stride, 0xA5);
  encode_token(layout, x.data(), block.data(), 1);
  EXPECT_EQ(std::vector<uint8_t>(block.begin() + 512, block.begin() + 1024), data);
  EXPECT_EQ(std::vector<uint8_t>(block.begin() + 1040, block.begin() + 1056), scales);
  for (int i : {0, 511, 1024, 1039}) EXPECT_EQ(block[i], 0xA5) << i;  // token 0 untouched

  const std::vector<float> y = decode(layout, block.data(), 1);
  EXPECT_EQ(y[0], 3.0f);
  EXPECT_EQ(y[2], -0.5f);
  EXPECT_EQ(y[35], 0.0f);
  EXPECT_EQ(y[64], 4.0f * 0x1p-9f * 0x1p-13f);
  EXPECT_TRUE(std::isnan(y[509]));
  EXPECT_EQ(y[511], -448.0f * 0x1p-7f);
}

TEST(CodecToken, FP8V32GoldenBytesAtPowerOfTwoBoundary) {
  std::vector<float> x(576, 0.0f);
  x[0] = 1792.0f, x[1] = 4.0f, x[2] = -6.0f;  // amax 448 * 4 → scale exactly 4
  x[128] = 56.0f, x[129] = 0.125f;            // amax 448 / 8 → scale exactly 1/8
  // Group 2 all zero → 2^-13. Group 3: one ulp above 56 → amax/448 rounds above 1/8 → 1/4,
  // and the element 56.0000038 / 0.25 rounds to 224 (0x76).
  x[384] = std::nextafter(56.0f, kInf);
  x[512] = 1.5f, x[513] = -2.0f, x[514] = 1.0f + 0x1p-8f, x[515] = 1.0f + 0x3p-8f;

  const KVLayout layout = default_kv_layout(KVFormat::kFP8_V32, 1);
  std::vector<uint8_t> block(656, 0xA5);
  encode_token(layout, x.data(), block.data(), 0);
  std::vector<uint8_t> data(512, 0x00);
  data[0] = 0x7E, data[1] = 0x38, data[2] = 0xBC, data[128] = 0x7E, data[129] = 0x38;
  data[384] = 0x76;
  EXPECT_EQ(std::vector<uint8_t>(block.begin(), block.begin() + 512), data);
  EXPECT_EQ(load_u32(&block[512]), 0x40800000u);  // 4.0f
  EXPECT_EQ(load_u32(&block[516]), 0x3E000000u);  // 0.125f
  EXPECT_EQ(load_u32(&block[520]), 0x39000000u);  // 2^-13
  EXPECT_EQ(load_u32(&block[524]), 0x3E800000u);  // 0.25f
  EXPECT_EQ(load_u16(&block[528]), 0x3FC0);
  EXPECT_EQ(load_u16(&block[530]), 0xC000);
  EXPECT_EQ(load_u16(&block[532]), 0x3F80);  // tie to even
  EXPECT_EQ(load_u16(&block[534]), 0x3F82);
  for (int i = 536; i < 656; i += 2) EXPECT_EQ(load_u16(&block[i]), 0) << i;

  const std::vector<float> y = decode(layout, block.data(), 0);
  EXPECT_EQ(y[0], 1792.0f);
  EXPECT_EQ(y[2], -6.0f);
  EXPECT_EQ(y[384], 56.0f);
  EXPECT_EQ(y[512], 1.5f);
  EXPECT_EQ(y[515], 1.0f + 0x1p-6f);
}

TEST(CodecToken, FP8Model1GoldenBytesAndPadByte) {
  std::vector<float> x(512, 0.0f);
  x[0] = 14.0f, x[1] = -0.03125f;  // amax 448 * 2^-5 → scale 2^-5 (e8m0 122)
  // Group 6: 100/448 in (2^-3, 2^-2] → scale 1/4 (e8m0 125); 400 ties between 384 and 416 → 384.
  x[447] = 100.0f;
  x[448] = 3.0f, x[511] = -0.5f;  // rope, bf16
  const KVLayout layout = default_kv_layout(KVFormat::kFP8_Model1, 2);
  std::vector<uint8_t> block(layout.block_stride, 0xA5);
  encode_token(layout, x.data(), block.data(), 1);
  const uint8_t* data = &block[576];
  EXPECT_EQ(data[0], 0x7E);
  EXPECT_EQ(data[1], 0xB8);
  EXPECT_EQ(data[447], 0x7C);
  for (int i = 2; i < 447; ++i) EXPECT_EQ(data[i], 0x00) << i;
  EXPECT_EQ(load_u16(&block[576 + 448]), 0x4040);
  EXPECT_EQ(load_u16(&block[576 + 448 + 126]), 0xBF00);
  const std::vector<uint8_t> scales(block.begin() + 2 * 576 + 8, block.begin() + 2 * 576 + 16);
  EXPECT_EQ(scales, (std::vector<uint8_t>{122, 114, 114, 114, 114, 114, 125, 0}));
  EXPECT_EQ(block[2 * 576 + 7], 0xA5);  // token 0's pad byte untouched

  const std::vector<float> y = decode(layout, block.data(), 1);
  EXPECT_EQ(y[0], 14.0f);
  EXPECT_EQ(y[447], 96.0f);
  EXPECT_EQ(y[448], 3.0f);
  EXPECT_EQ(y[511], -0.5f);
}

TEST(CodecToken, FP4GoldenBytes) {
  std::vector<float> x(512, 0.0f);
  x[0] = 3.0f, x[1] = 1.0f, x[2] = -0.25f, x[3] = 0.75f;  // scale 0.5: codes 7, 4, 9, 3
  x[32] = 6.375f, x[33] = -1.25f;  // scale 1.0 (rounded down): 6.375 saturates to 6, -1.25 → -1
  x[48] = 7.5f, x[49] = kNaN, x[50] = -kInf, x[51] = 0.625f;  // scale 1.25: 7, 0, F, 1
  const KVLayout layout = default_kv_layout(KVFormat::kFP4, 1);
  std::vector<uint8_t> block(288, 0xA5);
  encode_token(layout, x.data(), block.data(), 0);
  std::vector<uint8_t> data(256, 0x00), scales(32, 0x01);
  data[0] = 0x47, data[1] = 0x39, data[16] = 0xA7, data[24] = 0x07, data[25] = 0x1F;
  scales[0] = 0x30, scales[2] = 0x38, scales[3] = 0x3A;
  EXPECT_EQ(std::vector<uint8_t>(block.begin(), block.begin() + 256), data);
  EXPECT_EQ(std::vector<uint8_t>(block.begin() + 256, block.end()), scales);

  const std::vector<float> y = decode(layout, block.data(), 0);
  EXPECT_EQ(y[0], 3.0f);
  EXPECT_EQ(y[2], -0.25f);
  EXPECT_EQ(y[32], 6.0f);
  EXPECT_EQ(y[33], -1.0f);
  EXPECT_EQ(y[49], 0.0f);
  EXPECT_EQ(y[50], -7.5f);
  EXPECT_EQ(y[51], 0.625f);
}

TEST(CodecToken, PlainFormatsStoreRoundedElements) {
  std::mt19937 rng(23);
  std::normal_distribution<float> normal(0.0f, 10.0f);
  for (KVFormat format : {KVFormat::kBF16, KVFormat::kFP16}) {
    for (int d_qk : {576, 512}) {
      std::vector<float> x(d_qk);
      for (float& v : x) v = normal(rng);
      const KVLayout layout = default_kv_layout(format, 1, d_qk);
      std::vector<uint8_t> block(layout.block_stride);
      encode_token(layout, x.data(), block.data(), 0);
      const std::vector<float> y = decode(layout, block.data(), 0);
      for (int d = 0; d < d_qk; ++d) {
        const uint16_t expected =
            format == KVFormat::kBF16 ? codec::float_to_bf16(x[d]) : codec::float_to_fp16(x[d]);
        ASSERT_EQ(load_u16(&block[2 * d]), expected) << d;
        ASSERT_EQ(y[d], format == KVFormat::kBF16 ? codec::bf16_to_float(expected)
                                                  : codec::fp16_to_float(expected));
      }
    }
  }
}

// --- round trips against an independent reference quantiser --------------------------------

// Decodes what docs/formats.md says token `x` must decode to, from the oracles of codec_test_vectors.h.
std::vector<float> reference_round_trip(KVFormat format, const std::vector<float>& x) {
  const KVFormatInfo info = kv_format_info(format, static_cast<int>(x.size()));
  std::vector<float> y(x.size());
  if (format == KVFormat::kBF16 || format == KVFormat::kFP16) {
    for (size_t i = 0; i < x.size(); ++i) {
      // bf16 by the test's own rounding; fp16 by the codec's (checked against goldens above).
      y[i] = format == KVFormat::kBF16 ? testing::round_to_bf16(x[i])
                                       : codec::fp16_to_float(codec::float_to_fp16(x[i]));
    }
    return y;
  }
  for (int g = 0; g < info.num_scales; ++g) {
    const int first = g * info.group_size;
    float amax = 0.0f;
    for (int i = 0; i < info.group_size; ++i) {
      if (std::isfinite(x[first + i])) amax = std::max(amax, std::fabs(x[first + i]));
    }
    const bool fp4 = format == KVFormat::kFP4;
    const float scale = fp4 ? static_cast<float>(e4m3_value(
                                  std::max<uint8_t>(oracle_e4m3(std::max(amax / 6.0f, 1e-4f)), 1)))
                            : std::ldexp(1.0f, oracle_pow2_exponent(amax));
    for (int i = first; i < first + info.group_size; ++i) {
      const float q = x[i] / scale;
      const double element = fp4 ? e2m1_value(oracle_e2m1(q)) : e4m3_value(oracle_e4m3(q));
      y[i] = static_cast<float>(element) * scale;
    }
  }
  for (int i = info.quantized_dims; i < info.d_qk; ++i) {
    y[i] = testing::round_to_bf16(x[i]);  // rope dims (inputs are finite)
  }
  return y;
}

TEST(CodecRoundTrip, QuantisedFormatsMatchReferenceQuantiser) {
  std::mt19937 rng(29);
  for (KVFormat format :
       {KVFormat::kFP8_V32, KVFormat::kFP8_Model1, KVFormat::kFP8_MX, KVFormat::kFP4}) {
    const KVFormatInfo info = kv_format_info(format);
    const KVLayout layout = default_kv_layout(format, 1);
    std::vector<uint8_t> block(layout.block_stride);
    for (int trial = 0; trial < 200; ++trial) {
      // Not only bf16 data here: arbitrary floats exercise every rounding path.
      std::vector<float> x = random_bf16_token(rng, info.d_qk, info.group_size, -12, 12);
      std::uniform_real_distribution<float> jitter(0.9f, 1.1f);
      if (trial % 2)
        for (float& v : x) v *= jitter(rng);
      encode_token(layout, x.data(), block.data(), 0);
      const std::vector<float> y = decode(layout, block.data(), 0);
      const std::vector<float> expected = reference_round_trip(format, x);
      for (int d = 0; d < info.d_qk; ++d) {
        ASSERT_EQ(y[d], expected[d])
            << kv_format_name(format) << " trial " << trial << " dim " << d << " x " << x[d];
      }
    }
  }
}

TEST(CodecRoundTrip, Fp8ErrorBound) {
  // With s = 2^e >= amax / 448 no element saturates. e4m3 keeps 3 mantissa bits: RNE error is at
  // most 2^-4 |x/s| in the normal range and half a subnormal step (2^-10) below 2^-6, so
  //   |dec - x| <= 2^-4 |x| + 2^-10 s.
  // Also s < 2 * max(amax / 448, 1e-4): the scale wastes less than one binade.
  std::mt19937 rng(31);
  for (KVFormat format : kFp8Formats) {
    const KVFormatInfo info = kv_format_info(format);
    const KVLayout layout = default_kv_layout(format, 1);
    std::vector<uint8_t> block(layout.block_stride);
    for (int trial = 0; trial < 100; ++trial) {
      const std::vector<float> x = random_bf16_token(rng, info.d_qk, info.group_size);
      encode_token(layout, x.data(), block.data(), 0);
      const std::vector<float> y = decode(layout, block.data(), 0);
      for (int g = 0; g < info.num_scales; ++g) {
        const float amax = codec::finite_amax(&x[g * info.group_size], info.group_size);
        const float s = std::ldexp(1.0f, codec::pow2_scale_exponent(amax));
        ASSERT_LT(s, 2.0f * std::max(amax / 448.0f, 1e-4f));
        for (int d = g * info.group_size; d < (g + 1) * info.group_size; ++d) {
          ASSERT_LE(std::fabs(y[d] - x[d]), 0x1p-4f * std::fabs(x[d]) + 0x1p-10f * s)
              << kv_format_name(format) << " dim " << d;
        }
      }
      for (int d = info.quantized_dims; d < info.d_qk; ++d) ASSERT_EQ(y[d], x[d]);  // bf16 rope
    }
  }
}

TEST(CodecRoundTrip, Fp4ErrorBound) {
  // The stored scale S is RNE e4m3 of amax/6; in e4m3's normal range |S - amax/6| <= 2^-4 amax/6,
  // so |x/S| <= 6 / (1 - 2^-4) = 6.4 and saturation costs at most 0.4 < |x/S| / 4. e2m1 keeps 1
  // mantissa bit: RNE error <= |x/S| / 4 for |x/S| >= 1 and <= 0.25 below, so
  //   |dec - x| <= |x| / 4 + S / 4.
  std::mt19937 rng(37);
  const KVFormatInfo info = kv_format_info(KVFormat::kFP4);
  const KVLayout layout = default_kv_layout(KVFormat::kFP4, 1);
  std::vector<uint8_t> block(layout.block_stride);
  for (int trial = 0; trial < 200; ++trial) {
    const std::vector<float> x = random_bf16_token(rng, info.d_qk, info.group_size, -3, 6);
    encode_token(layout, x.data(), block.data(), 0);
    const std::vector<float> y = decode(layout, block.data(), 0);
    for (int g = 0; g < info.num_scales; ++g) {
      const float amax = codec::finite_amax(&x[g * info.group_size], info.group_size);
      const float s = codec::e4m3_to_float(codec::fp4_scale_e4m3(amax));
      if (amax / 6.0f < 0x1p-6f) continue;  // the bound needs a normal e4m3 scale
      ASSERT_LE(std::fabs(s - amax / 6.0f), 0x1p-4f * amax / 6.0f);
      for (int d = g * info.group_size; d < (g + 1) * info.group_size; ++d) {
        ASSERT_LE(std::fabs(y[d] - x[d]), 0.25f * std::fabs(x[d]) + 0.25f * s) << d;
      }
    }
  }
}

TEST(CodecRoundTrip, PlainFormatsAreExactOnRepresentableData) {
  std::mt19937 rng(41);
  for (KVFormat format : {KVFormat::kBF16, KVFormat::kFP16}) {
    const KVLayout layout = default_kv_layout(format, 4);
    std::vector<uint8_t> block(layout.block_stride);
    std::vector<float> x = random_bf16_token(rng, 576, 0);
    if (format == KVFormat::kFP16) {
      for (float& v : x) v = codec::fp16_to_float(codec::float_to_fp16(v));
    }
    encode_token(layout, x.data(), block.data(), 3);
    EXPECT_EQ(decode(layout, block.data(), 3), x) << kv_format_name(format);
  }
}

// --- special values -------------------------------------------------------------------------

TEST(CodecSpecial, Fp8NanDecodesNanAndInfSaturatesToTheGroupScale) {
  for (KVFormat format : kFp8Formats) {
    const KVFormatInfo info = kv_format_info(format);
    std::vector<float> x(info.d_qk, 0.0f);
    x[0] = 1.0f;  // group 0's finite amax: scale 2^-8
    x[1] = kNaN, x[2] = kInf, x[3] = -kInf;
    // Group 1: only non-finite values → amax 0 → the floor scale 2^-13.
    x[info.group_size] = kInf, x[info.group_size + 1] = kNaN;
    const KVLayout layout = default_kv_layout(format, 1);
    std::vector<uint8_t> block(layout.block_stride);
    encode_token(layout, x.data(), block.data(), 0);
    const std::vector<float> y = decode(layout, block.data(), 0);
    EXPECT_EQ(y[0], 1.0f);
    EXPECT_TRUE(std::isnan(y[1])) << kv_format_name(format);
    EXPECT_EQ(y[2], 448.0f * 0x1p-8f);
    EXPECT_EQ(y[3], -448.0f * 0x1p-8f);
    EXPECT_EQ(y[info.group_size], 448.0f * 0x1p-13f);
    EXPECT_TRUE(std::isnan(y[info.group_size + 1]));
    EXPECT_EQ(block[1], 0x7F);
    EXPECT_EQ(block[2], 0x7E);
    EXPECT_EQ(block[3], 0xFE);
  }
}

TEST(CodecSpecial, AllZeroGroupsGetTheFloorScale) {
  for (KVFormat format :
       {KVFormat::kFP8_V32, KVFormat::kFP8_Model1, KVFormat::kFP8_MX, KVFormat::kFP4}) {
    const KVFormatInfo info = kv_format_info(format);
    const std::vector<float> x(info.d_qk, 0.0f);
    const KVLayout layout = interleaved_kv_layout(format, 1);
    std::vector<uint8_t> block(layout.block_stride, 0xA5);
    encode_token(layout, x.data(), block.data(), 0);
    for (int i = 0; i < info.data_bytes; ++i) ASSERT_EQ(block[i], 0x00) << i;
    const uint8_t* scales = &block[layout.scale_offset];
    for (int g = 0; g < info.num_scales; ++g) {
      switch (format) {
        case KVFormat::kFP8_V32: EXPECT_EQ(load_u32(scales + 4 * g), 0x39000000u); break;
        case KVFormat::kFP4: EXPECT_EQ(scales[g], 0x01); break;  // 2^-9
        default: EXPECT_EQ(scales[g], 114); break;               // 2^-13
      }
    }
    EXPECT_EQ(decode(layout, block.data(), 0), x);
  }
}

TEST(CodecSpecial, Fp8SaturatesValuesAboveTheScaleOfAnotherGroup) {
  // A scale written for one group's data, reused for another's (what a cache reader sees when a
  // group's amax is exceeded), must saturate elements at ±448, never produce 0x7F.
  const float scale = std::ldexp(1.0f, codec::pow2_scale_exponent(10.0f));  // 2^-5
  for (float x : {15.0f, 100.0f, -1e6f}) {
    const uint8_t bits = codec::float_to_e4m3(x / scale);
    EXPECT_EQ(bits & 0x7F, 0x7E) << x;
    EXPECT_EQ(codec::e4m3_to_float(bits) * scale, std::copysign(448.0f * scale, x));
  }
  EXPECT_EQ(codec::float_to_e4m3(14.0f / scale), 0x7E);  // 14 = 448 * 2^-5 is exact
}

TEST(CodecSpecial, Fp4NanLostInfSaturates) {
  std::vector<float> x(512, 0.0f);
  x[0] = 1.5f, x[1] = kNaN, x[2] = kInf, x[3] = -kInf;  // scale 0.25
  const KVLayout layout = default_kv_layout(KVFormat::kFP4, 1);
  std::vector<uint8_t> block(layout.block_stride);
  encode_token(layout, x.data(), block.data(), 0);
  const std::vector<float> y = decode(layout, block.data(), 0);
  EXPECT_EQ(y[0], 1.5f);
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_FALSE(std::signbit(y[1]));
  EXPECT_EQ(y[2], 1.5f);
  EXPECT_EQ(y[3], -1.5f);
  EXPECT_EQ(block[0], 0x07);  // 1.5 / 0.25 = 6 (code 7) | NaN → 0 in the high nibble
  EXPECT_EQ(block[1], 0xF7);  // +inf → 7 | -inf → F
}

TEST(CodecSpecial, RopeDimsAreBf16RoundedWithNanAndInfKept) {
  for (KVFormat format : {KVFormat::kFP8_V32, KVFormat::kFP8_Model1}) {
    const KVFormatInfo info = kv_format_info(format);
    std::vector<float> x(info.d_qk, 0.0f);
    const int r = info.quantized_dims;
    x[r] = 1.0f + 0x1p-10f, x[r + 1] = kNaN, x[r + 2] = -kInf, x[r + 3] = 1e20f;
    x[0] = 1e20f;  // a huge quantised dim does not affect rope dims
    const KVLayout layout = default_kv_layout(format, 1);
    std::vector<uint8_t> block(layout.block_stride);
    encode_token(layout, x.data(), block.data(), 0);
    const std::vector<float> y = decode(layout, block.data(), 0);
    EXPECT_EQ(y[r], 1.0f);
    EXPECT_TRUE(std::isnan(y[r + 1]));
    EXPECT_EQ(y[r + 2], -kInf);
    EXPECT_EQ(y[r + 3], codec::bf16_to_float(codec::float_to_bf16(1e20f)));
  }
}

// --- layouts --------------------------------------------------------------------------------

// A layout of `format` with gaps everywhere: parts shifted and padded, block stride beyond the
// footprint. Offsets and strides keep each part's alignment.
KVLayout gappy_layout(KVFormat format, int page_size) {
  const KVFormatInfo info = kv_format_info(format);
  KVLayout layout;
  layout.format = format;
  layout.d_qk = info.d_qk;
  layout.page_size = page_size;
  layout.data_offset = 16;
  layout.data_stride = info.data_bytes + 48;
  int64_t end = layout.data_offset + page_size * layout.data_stride;
  if (info.scale_bytes) {
    layout.scale_offset = end + 8;
    layout.scale_stride = info.scale_bytes + 4;
    end = layout.scale_offset + page_size * layout.scale_stride;
  }
  if (info.rope_bytes) {
    layout.rope_offset = end + 6;
    layout.rope_stride = info.rope_bytes + 2;
    end = layout.rope_offset + page_size * layout.rope_stride;
  }
  layout.block_stride = (end + 3) / 4 * 4 + 100;
  return layout;
}

TEST(CodecLayout, StridedBlocksWriteEveryPartByteAndNothingElse) {
  std::mt19937 rng(43);
  for (KVFormat format : kAllFormats) {
    const KVFormatInfo info = kv_format_info(format);
    const int page_size = 5, num_blocks = 3;
    const KVLayout layout = gappy_layout(format, page_size);
    ASSERT_TRUE(check_kv_layout(layout, "cache.layout").ok())
        << check_kv_layout(layout, "cache.layout").message();
    ASSERT_GT(layout.block_stride, kv_block_footprint_bytes(layout));
    const KVLayout packed = default_kv_layout(format, page_size);

    std::vector<uint8_t> in_part(num_blocks * layout.block_stride, 0);
    for (int b = 0; b < num_blocks; ++b) {
      for (int t = 0; t < page_size; ++t) {
        for (const PartSpan& s : token_spans(layout, t)) {
          for (int64_t i = 0; i < s.bytes; ++i) in_part[b * layout.block_stride + s.begin + i] = 1;
        }
      }
    }
    std::vector<uint8_t> first(in_part.size(), 0xA5), second(in_part.size(), 0x5A);
    std::vector<uint8_t> reference(num_blocks * packed.block_stride);
    std::vector<std::vector<float>> tokens;
    for (int slot = 0; slot < num_blocks * page_size; ++slot) {
      tokens.push_back(random_bf16_token(rng, info.d_qk, group_size_or_all(info)));
    }
    for (int slot = 0; slot < num_blocks * page_size; ++slot) {
      const int b = slot / page_size, t = slot % page_size;
      encode_token(layout, tokens[slot].data(), &first[b * layout.block_stride], t);
      encode_token(layout, tokens[slot].data(), &second[b * layout.block_stride], t);
      encode_token(packed, tokens[slot].data(), &reference[b * packed.block_stride], t);
    }
    for (size_t i = 0; i < in_part.size(); ++i) {
      if (in_part[i]) {
        ASSERT_EQ(first[i], second[i]) << kv_format_name(format) << " byte " << i << " unwritten";
      } else {
        ASSERT_EQ(first[i], 0xA5) << kv_format_name(format) << " byte " << i << " written";
        ASSERT_EQ(second[i], 0x5A) << kv_format_name(format) << " byte " << i << " written";
      }
    }
    for (int slot = 0; slot < num_blocks * page_size; ++slot) {
      const int b = slot / page_size, t = slot % page_size;
      EXPECT_EQ(token_bytes(layout, &first[b * layout.block_stride], t),
                token_bytes(packed, &reference[b * packed.block_stride], t));
      EXPECT_EQ(decode(layout, &first[b * layout.block_stride], t),
                decode(packed, &reference[b * packed.block_stride], t));
    }
  }
}

TEST(CodecLayout, InterleavedMatchesDefaultAtDocumentedOffsets) {
  std::mt19937 rng(47);
  for (KVFormat format : kAllFormats) {
    const KVFormatInfo info = kv_format_info(format);
    const int page_size = 4;
    const KVLayout def = default_kv_layout(format, page_size);
    const KVLayout inter = interleaved_kv_layout(format, page_size);
    std::vector<uint8_t> a(def.block_stride), b(inter.block_stride);
    for (int t = 0; t < page_size; ++t) {
      const std::vector<float> x = random_bf16_token(rng, info.d_qk, group_size_or_all(info));
      encode_token(def, x.data(), a.data(), t);
      encode_token(inter, x.data(), b.data(), t);
    }
    for (int t = 0; t < page_size; ++t) {
      EXPECT_EQ(decode(def, a.data(), t), decode(inter, b.data(), t)) << kv_format_name(format);
      // Interleaved: the whole token is bytes_per_token contiguous bytes at t * bytes_per_token,
      // data first; fp8_v32 then scales then rope, fp8_model1 rope then scales.
      const uint8_t* token = &b[t * info.bytes_per_token];
      const std::vector<uint8_t> data(token, token + info.data_bytes);
      EXPECT_EQ(data,
                std::vector<uint8_t>(&a[def.data_offset + t * def.data_stride],
                                     &a[def.data_offset + t * def.data_stride] + info.data_bytes));
      int64_t scale_at = info.data_bytes, rope_at = info.data_bytes;
      if (format == KVFormat::kFP8_V32) rope_at += info.scale_bytes;
      if (format == KVFormat::kFP8_Model1) scale_at += info.rope_bytes;
      const uint8_t* def_scale = &a[def.scale_offset + t * def.scale_stride];
      const uint8_t* def_rope = &a[def.rope_offset + t * def.rope_stride];
      EXPECT_EQ(std::vector<uint8_t>(token + scale_at, token + scale_at + info.scale_bytes),
                std::vector<uint8_t>(def_scale, def_scale + info.scale_bytes));
      EXPECT_EQ(std::vector<uint8_t>(token + rope_at, token + rope_at + info.rope_bytes),
                std::vector<uint8_t>(def_rope, def_rope + info.rope_bytes));
    }
  }
}

TEST(CodecLayout, Model1DefaultBlocksPadToMultiplesOf576) {
  // page_size 3: 3 * 584 = 1752 B rounded up to 4 * 576 = 2304 B; the padding is never written.
  const KVLayout layout = default_kv_layout(KVFormat::kFP8_Model1, 3);
  ASSERT_EQ(layout.block_stride, 2304);
  std::vector<uint8_t> cache(2 * layout.block_stride, 0xA5);
  std::mt19937 rng(53);
  for (int b = 0; b < 2; ++b) {
    for (int t = 0; t < 3; ++t) {
      const std::vector<float> x = random_bf16_token(rng, 512, 64);
      encode_token(layout, x.data(), &cache[b * layout.block_stride], t);
      EXPECT_EQ(cache[b * layout.block_stride + 3 * 576 + 8 * t + 7], 0) << "pad byte";
    }
    for (int64_t i = 3 * 584; i < layout.block_stride; ++i) {
      ASSERT_EQ(cache[b * layout.block_stride + i], 0xA5) << i;
    }
  }
}

TEST(CodecLayout, SlotsAddressBlockAndOffset) {
  std::mt19937 rng(59);
  for (KVFormat format : kAllFormats) {
    const KVFormatInfo info = kv_format_info(format);
    KVCache cache;
    cache.layout = default_kv_layout(format, 8);
    cache.layout.block_stride += 64;  // a strided view of a larger buffer
    cache.num_blocks = 4;
    std::vector<uint8_t> buffer(cache.num_blocks * cache.layout.block_stride);
    cache.data = buffer.data();
    std::vector<std::vector<float>> tokens(cache.num_tokens());
    std::vector<int> order(cache.num_tokens());
    for (int i = 0; i < cache.num_tokens(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    for (int slot : order) {
      tokens[slot] = random_bf16_token(rng, info.d_qk, group_size_or_all(info));
      codec::encode_slot(cache, slot, tokens[slot].data());
    }
    std::vector<float> out(info.d_qk);
    for (int slot = 0; slot < cache.num_tokens(); ++slot) {
      codec::decode_slot(cache, slot, out.data());
      const uint8_t* block =
          codec::block_ptr(static_cast<const void*>(cache.data), cache.layout, slot / 8);
      EXPECT_EQ(out, decode(cache.layout, block, slot % 8));
      EXPECT_EQ(out, reference_round_trip(format, tokens[slot])) << kv_format_name(format);
    }
  }
}

}  // namespace
}  // namespace openmla
