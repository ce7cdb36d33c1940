// The GPU's KV-cache codec (src/cuda/common/kv_codec.cuh) compiled for the host, against the host
// codec (src/core/codec.cc) — no GPU needed:
//  - its portable scalar conversions on ~2^22 float bit patterns spread over all 2^32 (plus the
//    boundaries), every code of the decoders (all 2^32 floats were checked once, offline); fp4's
//    division-free element encoder against the division for every scale code;
//  - the lane-level token codec, run lane by lane for the 32 lanes of a warp with the group amax
//    reduced as the kernel's shuffles do, against codec::encode_token / decode_token byte for
//    byte (bits for bits, NaN payloads included): every format, default and interleaved layouts,
//    random tokens at many magnitudes, special values (±inf, NaN, tiny, huge, exact scale
//    boundaries, all-zero groups) and blocks of random bytes (every NaN/inf scale a foreign
//    cache could hold).
// What stays for the GPU tier: the device-only fast paths (hardware e4m3/fp16 conversions,
// __fdiv_rn/__fmul_rn) and the kernels' addressing; tests/gpu/test_kv_cache_kernels.cu.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/kv_test_tokens.h"
#include "common/test_data.h"
#include "core/codec.h"
#include "cuda/common/kv_codec.cuh"
#include "openmla/kv_format.h"

namespace openmla::testing {
namespace {

namespace kc = openmla::cuda::kvcodec;

uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}
float float_of(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

// --- scalar conversions ------------------------------------------------------------------------
std::vector<uint32_t> sample_float_bits() {
  std::vector<uint32_t> v;
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 1021) v.push_back(static_cast<uint32_t>(u));
  // Around every boundary the conversions care about, and the specials.
  const float edges[] = {0.0f,
                         0.25f,
                         0.75f,
                         1.25f,
                         1.75f,
                         2.5f,
                         3.5f,
                         5.0f,
                         6.0f,
                         448.0f,
                         464.0f,
                         480.0f,
                         65504.0f,
                         65520.0f,
                         0.015625f,
                         0.001953125f,
                         0.0009765625f,
                         6.103515625e-05f,
                         5.9604644775390625e-08f,
                         2.98023223876953125e-08f,
                         1e-4f,
                         1e-30f,
                         3e38f,
                         std::numeric_limits<float>::max(),
                         std::numeric_limits<float>::min(),
                         std::numeric_limits<float>::denorm_min(),
                         std::numeric_limits<float>::infinity()};
  for (float e : edges) {
    for (int sign = 0; sign < 2; ++sign) {
      const uint32_t b = bits_of(e) | (sign ? 0x80000000u : 0);
      for (int d = -64; d <= 64; ++d) v.push_back(b + d);
    }
  }
  for (uint32_t nan : {0x7F800001u, 0x7FC00000u, 0x7FFFFFFFu, 0xFF800001u, 0xFFC00000u, 0xFFFFFFFFu,
                       0x7FA00000u}) {
    v.push_back(nan);
  }
  return v;
}

TEST(KVDeviceCodec, ScalarConversionsMatchHostCodec) {
  int64_t bad = 0;
  for (uint32_t b = 0; b < 256; ++b) {
    bad +=
        bits_of(kc::e4m3_to_float_sw(b)) != bits_of(codec::e4m3_to_float(static_cast<uint8_t>(b)));
    bad += bits_of(kc::e4m3_to_float(b)) != bits_of(codec::e4m3_to_float(static_cast<uint8_t>(b)));
    bad += bits_of(kc::e8m0_to_float(b)) != bits_of(codec::e8m0_to_float(static_cast<uint8_t>(b)));
    if (b < 16)
      bad +=
          bits_of(kc::e2m1_to_float(b)) != bits_of(codec::e2m1_to_float(static_cast<uint8_t>(b)));
  }
  EXPECT_EQ(bad, 0) << "byte-code decoders";
  for (uint32_t h = 0; h < 65536; ++h) {
    ASSERT_EQ(bits_of(kc::fp16_to_float_sw(h)),
              bits_of(codec::fp16_to_float(static_cast<uint16_t>(h))))
        << h;
    ASSERT_EQ(bits_of(kc::bf16_to_float(h)),
              bits_of(codec::bf16_to_float(static_cast<uint16_t>(h))))
        << h;
  }
  for (int e = -130; e <= 130; ++e)
    ASSERT_EQ(kc::e8m0_from_exponent(e), codec::e8m0_from_exponent(e)) << e;

  for (uint32_t u : sample_float_bits()) {
    const float x = float_of(u);
    ASSERT_EQ(kc::float_to_e4m3_sw(x), codec::float_to_e4m3(x)) << std::hex << u;
    ASSERT_EQ(kc::float_to_fp16_sw(x), codec::float_to_fp16(x)) << std::hex << u;
    ASSERT_EQ(kc::float_to_bf16(x), codec::float_to_bf16(x)) << std::hex << u;
    ASSERT_EQ(kc::float_to_e2m1(x), codec::float_to_e2m1(x)) << std::hex << u;
    if ((u & 0x80000000u) == 0 && !std::isnan(x) && !std::isinf(x)) {  // amax: finite, >= 0
      ASSERT_EQ(kc::pow2_scale_exponent(x), codec::pow2_scale_exponent(x)) << std::hex << u;
      ASSERT_EQ(kc::fp4_scale_code(x), codec::fp4_scale_e4m3(x)) << std::hex << u;
      const int e = codec::pow2_scale_exponent(x);
      ASSERT_EQ(bits_of(kc::exp2_int(e)), bits_of(std::ldexp(1.0f, e))) << e;
      ASSERT_EQ(bits_of(kc::exp2_int(-e)), bits_of(std::ldexp(1.0f, -e))) << e;
    }
  }
}

// fp4's division-free element encoder: e2m1(x / s) for every stored scale code, on floats spread
// over all 2^32 and on every float within 4 ulps of each of the scale's bounds t * s.
TEST(KVDeviceCodec, Fp4QuotientWithoutDivisionMatchesDivision) {
  for (uint32_t code = 0x01; code <= 0x7E; ++code) {
    const float scale = codec::e4m3_to_float(static_cast<uint8_t>(code));
    const kc::Fp4Bounds bounds = kc::fp4_bounds(scale);
    std::vector<uint32_t> inputs;
    for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 65521)
      inputs.push_back(static_cast<uint32_t>(u));
    for (float t : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f}) {
      for (uint32_t sign : {0u, 0x80000000u}) {
        for (int d = -4; d <= 4; ++d) inputs.push_back((bits_of(t * scale) + d) | sign);
      }
    }
    for (uint32_t special :
         {0x0u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00001u, 0x1u}) {
      inputs.push_back(special);
    }
    for (uint32_t u : inputs) {
      const float x = float_of(u);
      ASSERT_EQ(kc::e2m1_of_quotient(x, bounds), codec::float_to_e2m1(x / scale))
          << "scale code 0x" << std::hex << code << ", x 0x" << u;
    }
    // The FMA-pipe encoder (NaN-free words): the same inputs, eight at a time, each input in
    // every nibble position.
    const kc::Fp4SatBounds sat_bounds = kc::fp4_sat_bounds(bounds);
    std::vector<float> finite;
    for (uint32_t u : inputs) {
      if ((u & 0x7FFFFFFFu) <= 0x7F800000u) finite.push_back(float_of(u));
    }
    for (size_t first = 0; first < finite.size(); ++first) {
      float x[8];
      uint32_t expected = 0;
      for (int i = 0; i < 8; ++i) {
        x[i] = finite[(first + 977 * i) % finite.size()];
        expected |= uint32_t{codec::float_to_e2m1(x[i] / scale)} << (4 * i);
      }
      ASSERT_EQ(kc::fp4_word_no_nan(x, sat_bounds), expected)
          << "scale code 0x" << std::hex << code << ", x[0] 0x" << bits_of(x[0]);
    }
  }
}

// The f16x2 encoder for bf16 sources (fp4_word_from_bf16): every bf16 it takes (|bits| < 0x7C00,
// both signs, ±0 and subnormals included) for every scale code, against the division, each value
// once per scale code at a nibble position that moves with it (all 8 positions × all values ×
// all codes, 64M elements, were checked once offline: 0 differences). The host emulation of the
// f16 arithmetic counts any operation it could not do exactly; there must be none.
TEST(KVDeviceCodec, Fp4FromBf16MatchesDivision) {
  std::vector<uint32_t> values;
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    if ((b & 0x7FFFu) < kc::kFp4H2MaxBits) values.push_back(b);
  }
  const size_t n = values.size();
  const unsigned long long inexact_before = kc::detail::h2_inexact_emulations;
  for (uint32_t code = 0x01; code <= 0x7E; ++code) {
    const float scale = codec::e4m3_to_float(static_cast<uint8_t>(code));
    const kc::Fp4H2Bounds bounds = kc::fp4_h2_bounds(scale);
    for (size_t first = code % 8; first < n; first += 8) {
      uint32_t w[4] = {0, 0, 0, 0}, expected = 0;
      for (int i = 0; i < 8; ++i) {
        const uint32_t b = values[(first + 7919 * static_cast<size_t>(i)) % n];
        w[i / 2] |= b << (16 * (i % 2));
        expected |= uint32_t{codec::float_to_e2m1(float_of(b << 16) / scale)} << (4 * i);
      }
      ASSERT_EQ(kc::fp4_word_from_bf16(w, bounds), expected)
          << "scale code 0x" << std::hex << code << ", words 0x" << w[0] << " 0x" << w[1] << " 0x"
          << w[2] << " 0x" << w[3];
    }
  }
  EXPECT_EQ(kc::detail::h2_inexact_emulations, inexact_before);
}

// The bf16 path's group scale and amax: fp4_scale_code_bf16 (a multiplication by RN(1/6), no
// division, no floor) against fp4_scale_code and the host codec for every amax the path takes
// (all bf16 below 2^121); max_abs_bf16x16 (16-bit-lane integer maxima, run here with the same
// algorithm on emulated VIMNMX3) against a plain loop on random and special words.
TEST(KVDeviceCodec, Fp4ScaleCodeOfBf16Amax) {
  for (uint32_t b = 0; b < kc::kFp4H2MaxBits; ++b) {
    const float amax = kc::bf16_to_float(b);
    const uint32_t want = codec::fp4_scale_e4m3(amax);
    ASSERT_EQ(kc::fp4_scale_code(amax), want) << "bf16 0x" << std::hex << b;
    ASSERT_EQ(kc::fp4_scale_code_bf16(amax), want) << "bf16 0x" << std::hex << b;
    ASSERT_EQ(bits_of(kc::e4m3_to_float_finite(want)), bits_of(codec::e4m3_to_float(want)));
  }
}

TEST(KVDeviceCodec, MaxAbsBf16MatchesScalarMax) {
  Rng rng(11);
  const uint32_t specials[] = {0x0000u, 0x8000u, 0x0001u, 0x8001u, 0x7FFFu, 0xFFFFu,
                               0x7C00u, 0xFC00u, 0x7BFFu, 0xFBFFu, 0x3F80u, 0xBF80u};
  for (int trial = 0; trial < 200000; ++trial) {
    uint32_t w[8];
    uint32_t want = 0;
    const int mode = trial % 4;  // random, all negative, all positive, specials mixed in
    for (int i = 0; i < 16; ++i) {
      uint32_t h = static_cast<uint32_t>(rng.randint(0, 0xFFFF));
      if (mode == 1) h |= 0x8000u;
      if (mode == 2) h &= 0x7FFFu;
      if (mode == 3 && rng.coin()) h = specials[rng.randint(0, 11)];
      w[i / 2] = i % 2 == 0 ? h : w[i / 2] | (h << 16);
      want = std::max(want, h & 0x7FFFu);
    }
    ASSERT_EQ(bits_of(kc::max_abs_bf16x16(w)), want << 16) << "trial " << trial;
  }
}

// --- the lane-level token codec, one warp emulated -----------------------------------------------
struct Target {
  KVFormat format;
  int d_qk;
};
const Target kTargets[] = {{KVFormat::kBF16, 576},    {KVFormat::kBF16, 512},
                           {KVFormat::kFP16, 576},    {KVFormat::kFP16, 512},
                           {KVFormat::kFP8_V32, 576}, {KVFormat::kFP8_Model1, 512},
                           {KVFormat::kFP8_MX, 512},  {KVFormat::kFP4, 512}};

template <typename Byte>
kc::TokenPtrT<Byte> parts(const KVLayout& l, Byte* block, int token) {
  return {block + l.data_offset + token * l.data_stride,
          block + l.scale_offset + token * l.scale_stride,
          block + l.rope_offset + token * l.rope_stride};
}

template <kc::Codec C, int D>
void emulate_decode(const kc::ConstTokenPtr& t, float* out) {
  for (int lane = 0; lane < 32; ++lane) {
    kc::LaneVals v{};
    kc::decode_lane<C, D>(t, lane, v);
    for (int i = 0; i < 16; ++i) out[16 * lane + i] = v.main[i];
    if (D == 576) out[512 + 2 * lane] = v.tail[0], out[513 + 2 * lane] = v.tail[1];
  }
}

template <kc::Codec C, int D>
void emulate_encode(const float* x, const kc::TokenPtr& t) {
  kc::LaneVals v[32];
  float amax[32];
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 16; ++i) v[lane].main[i] = x[16 * lane + i];
    v[lane].tail[0] = D == 576 ? x[512 + 2 * lane] : 0.0f;
    v[lane].tail[1] = D == 576 ? x[513 + 2 * lane] : 0.0f;
    amax[lane] = kc::group_lanes<C>() > 0 ? kc::lane_amax<C>(v[lane], lane) : 0.0f;
  }
  const int g = kc::group_lanes<C>() > 0 ? kc::group_lanes<C>() : 1;
  for (int lane = 0; lane < 32; ++lane) {
    float m = 0.0f;
    for (int j = lane & ~(g - 1); j < (lane & ~(g - 1)) + g; ++j) m = std::fmax(m, amax[j]);
    kc::encode_lane<C, D>(t, lane, v[lane], m);
  }
}

template <typename F>
void with_codec(const Target& target, F&& f) {
  switch (target.format) {
    case KVFormat::kBF16:
      if (target.d_qk == 576) return f.template operator()<kc::Codec::kBF16, 576>();
      return f.template operator()<kc::Codec::kBF16, 512>();
    case KVFormat::kFP16:
      if (target.d_qk == 576) return f.template operator()<kc::Codec::kFP16, 576>();
      return f.template operator()<kc::Codec::kFP16, 512>();
    case KVFormat::kFP8_V32:
      return f.template operator()<kc::Codec::kFP8_V32, 576>();
    case KVFormat::kFP8_Model1:
      return f.template operator()<kc::Codec::kFP8_Model1, 512>();
    case KVFormat::kFP8_MX:
      return f.template operator()<kc::Codec::kFP8_MX, 512>();
    case KVFormat::kFP4:
      return f.template operator()<kc::Codec::kFP4, 512>();
  }
}

// bf16 -> fp4 lane by lane (encode_lane_fp4_from_bf16: the f16x2 path, or the float path for
// lanes holding inf, NaN or |x| >= 2^121) against codec::encode_token of the same bf16 values,
// with a warp per token (32 lanes, one group each) and a half-warp per token (16 lanes, groups
// lane and lane + 16: the convert kernel's layout).
TEST(KVDeviceCodec, Fp4LaneFromBf16MatchesHostEncode) {
  Rng rng(10);
  std::vector<std::vector<uint32_t>> tokens;  // 512 bf16 bit patterns each
  for (const std::vector<float>& x : hard_tokens(512, rng)) {
    std::vector<uint32_t> t(512);
    for (int d = 0; d < 512; ++d) t[d] = kc::float_to_bf16(x[d]);
    tokens.push_back(t);
  }
  const uint32_t specials[] = {0x0000u, 0x8000u, 0x7F80u, 0xFF80u, 0x7FC1u, 0xFF81u, 0x7BFFu,
                               0x7C00u, 0xFC00u, 0x7F7Fu, 0x0001u, 0x8001u, 0x3E80u, 0xBE80u};
  for (int trial = 0; trial < 60; ++trial) {
    std::vector<uint32_t> t(512);
    for (int d = 0; d < 512; ++d) {
      t[d] = trial < 20 ? static_cast<uint32_t>(rng.randint(0, 0xFFFF))  // anything
                        : (static_cast<uint32_t>(rng.randint(0, 0x7FFF)) & 0x47FFu) |
                              (static_cast<uint32_t>(rng.randint(0, 1)) << 15);
      if (trial >= 40 && d % (trial - 37) == 0) t[d] = specials[(d + trial) % 14];
    }
    tokens.push_back(t);
  }
  for (bool interleaved : {false, true}) {
    const int page = 3;
    const KVLayout layout = test_layout(KVFormat::kFP4, page, 512, interleaved, 8);
    for (size_t c = 0; c < tokens.size(); ++c) {
      SCOPED_TRACE(::testing::Message() << "token " << c << (interleaved ? " interleaved" : ""));
      const std::vector<uint32_t>& t = tokens[c];
      std::vector<float> x(512);
      for (int d = 0; d < 512; ++d) x[d] = kc::bf16_to_float(t[d]);
      std::vector<uint8_t> want(layout.block_stride, 0xA5);
      const int token = static_cast<int>(c % page);
      codec::encode_token(layout, x.data(), want.data(), token);
      std::vector<uint8_t> src(1024);  // the bf16 row as stored (little-endian)
      for (int d = 0; d < 512; ++d) src[2 * d] = t[d] & 0xFFu, src[2 * d + 1] = t[d] >> 8;
      std::vector<uint8_t> got32(layout.block_stride, 0xA5), got16(layout.block_stride, 0xA5);
      for (int lane = 0; lane < 32; ++lane) {
        kc::transcode_lane_fp4_from_bf16<32>(src.data(),
                                             parts<uint8_t>(layout, got32.data(), token), lane);
      }
      for (int lane = 0; lane < 16; ++lane) {
        kc::transcode_lane_fp4_from_bf16<16>(src.data(),
                                             parts<uint8_t>(layout, got16.data(), token), lane);
      }
      ASSERT_EQ(got32, want);
      ASSERT_EQ(got16, want);
    }
  }
}

TEST(KVDeviceCodec, LaneEncodeMatchesHostEncodeByteForByte) {
  Rng rng(7);
  for (const Target& target : kTargets) {
    for (bool interleaved : {false, true}) {
      SCOPED_TRACE(::testing::Message() << kv_format_name(target.format) << " d=" << target.d_qk
                                        << (interleaved ? " interleaved" : " default"));
      const int page = 3;
      const KVLayout layout = test_layout(target.format, page, target.d_qk, interleaved, 8);
      int case_index = 0;
      for (const std::vector<float>& x : hard_tokens(target.d_qk, rng)) {
        SCOPED_TRACE(case_index++);
        std::vector<uint8_t> got(layout.block_stride, 0xA5), want(layout.block_stride, 0xA5);
        const int token = case_index % page;
        codec::encode_token(layout, x.data(), want.data(), token);
        with_codec(target, [&]<kc::Codec C, int D>() {
          emulate_encode<C, D>(x.data(), parts<uint8_t>(layout, got.data(), token));
        });
        ASSERT_EQ(got, want);
      }
    }
  }
}

TEST(KVDeviceCodec, LaneDecodeMatchesHostDecodeBitForBit) {
  Rng rng(8);
  for (const Target& target : kTargets) {
    for (bool interleaved : {false, true}) {
      SCOPED_TRACE(::testing::Message() << kv_format_name(target.format) << " d=" << target.d_qk
                                        << (interleaved ? " interleaved" : " default"));
      const int page = 4;
      const KVLayout layout = test_layout(target.format, page, target.d_qk, interleaved, 0);
      const KVFormatInfo info = kv_format_info(target.format, target.d_qk);
      const std::vector<std::vector<float>> tokens = hard_tokens(target.d_qk, rng);
      for (int trial = 0; trial < 80; ++trial) {
        std::vector<uint8_t> block(layout.block_stride);
        if (trial < 40) {
          for (uint8_t& b : block) b = static_cast<uint8_t>(rng.randint(0, 255));  // anything
        } else {
          std::memset(block.data(), trial % 2 ? 0xFF : 0x7F, block.size());
          for (int t = 0; t < page; ++t) {
            if ((trial + t) % 3 == 0) continue;
            const std::vector<float>& x = tokens[(trial * 5 + t) % tokens.size()];
            codec::encode_token(layout, x.data(), block.data(), t);
          }
        }
        if (trial >= 64 && info.quantized()) {
          // Scales a foreign cache may hold: inf (inf x 0 is x86's indefinite NaN), signalling
          // and negative NaNs, zeros, extremes; elements 0, -0 and NaN next to them.
          const uint32_t f32_scales[] = {0x7F800000u, 0xFF800000u, 0x7F800001u, 0xFFC00001u,
                                         0x00000000u, 0x80000000u, 0x00000001u, 0x7F7FFFFFu};
          const uint8_t byte_scales[] = {0xFF, 0x00, 0xFE, 0x7F, 0x80, 0x01, 0x7E, 0xFE};
          for (int t = 0; t < page; ++t) {
            uint8_t* scale = block.data() + layout.scale_offset + t * layout.scale_stride;
            uint8_t* data = block.data() + layout.data_offset + t * layout.data_stride;
            for (int g = 0; g < info.num_scales; ++g) {
              const int pick = static_cast<int>((g + t + trial) % 8);
              if (target.format == KVFormat::kFP8_V32) {
                std::memcpy(scale + 4 * g, &f32_scales[pick], 4);
              } else {
                scale[g] = byte_scales[pick];
              }
            }
            const uint8_t elements[] = {0x00, 0x80, 0x7F, 0xFF, 0x08};
            for (int i = 0; i < info.data_bytes; i += 3) data[i] = elements[(i / 3 + trial) % 5];
          }
        }
        for (int t = 0; t < page; ++t) {
          std::vector<float> got(target.d_qk), want(target.d_qk);
          codec::decode_token(layout, block.data(), t, want.data());
          with_codec(target, [&]<kc::Codec C, int D>() {
            emulate_decode<C, D>(parts<const uint8_t>(layout, block.data(), t), got.data());
          });
          for (int d = 0; d < target.d_qk; ++d) {
            ASSERT_EQ(bits_of(got[d]), bits_of(want[d]))
                << "trial " << trial << " token " << t << " dim " << d;
          }
          // Re-encoding what was decoded (the convert path) into every format of the same d_qk.
          for (const Target& to : kTargets) {
            if (to.d_qk != target.d_qk) continue;
            const KVLayout to_layout = test_layout(to.format, 1, to.d_qk, !interleaved, 4);
            std::vector<uint8_t> g(to_layout.block_stride, 0x5A), w(to_layout.block_stride, 0x5A);
            codec::encode_token(to_layout, want.data(), w.data(), 0);
            with_codec(to, [&]<kc::Codec C, int D>() {
              emulate_encode<C, D>(got.data(), parts<uint8_t>(to_layout, g.data(), 0));
            });
            ASSERT_EQ(g, w) << "re-encoded into " << kv_format_name(to.format) << ", trial "
                            << trial;
          }
        }
      }
    }
  }
}

// The dense rows of the write's input and the gather's output: fp32 (raw) and bf16.
TEST(KVDeviceCodec, DenseRowsMatchHostConversions) {
  Rng rng(9);
  for (int d : {576, 512}) {
    for (const std::vector<float>& x : hard_tokens(d, rng)) {
      std::vector<float> f32(d, -1.0f), back(d);
      std::vector<uint16_t> bf16(d, 0xDEAD);
      const auto run = [&]<int D>() {
        emulate_encode<kc::Codec::kF32, D>(
            x.data(), {reinterpret_cast<uint8_t*>(f32.data()), nullptr, nullptr});
        emulate_encode<kc::Codec::kBF16, D>(
            x.data(), {reinterpret_cast<uint8_t*>(bf16.data()), nullptr, nullptr});
        emulate_decode<kc::Codec::kF32, D>(
            {reinterpret_cast<const uint8_t*>(x.data()), nullptr, nullptr}, back.data());
      };
      if (d == 576)
        run.template operator()<576>();
      else
        run.template operator()<512>();
      for (int i = 0; i < d; ++i) {
        ASSERT_EQ(bits_of(f32[i]), bits_of(x[i])) << i;
        ASSERT_EQ(bits_of(back[i]), bits_of(x[i])) << i;
        ASSERT_EQ(bf16[i], codec::float_to_bf16(x[i])) << i;
      }
    }
  }
}

}  // namespace
}  // namespace openmla::testing
