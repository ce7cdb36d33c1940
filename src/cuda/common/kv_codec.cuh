// Device mirror of the host KV-cache codecs (src/core/codec.cc): the same bytes for every input,
// NaN payloads included, so a cache written, read or converted on the GPU is identical to one
// done with codec::encode_slot / codec::decode_slot.
//
// Compiled three ways: by nvcc for the device (the fast paths below: the hardware e4m3 and fp16
// conversions), by nvcc's host pass, and by the host C++ compiler (tests/cpu), where every
// conversion is the portable bit-arithmetic version (the `_sw` functions). The CPU tests check
// the `_sw` functions and the lane-level token codec against src/core on the host; the GPU tests
// check the device fast paths against the `_sw` functions on all 2^32 floats (all 256 / 65536
// codes for the decoders), and the kernels against the host codec byte for byte.
//
// Rules mirrored from codec.cc (see codec.h):
//  - group amax over finite values only; scale = amax / max_representable as one float32
//    division, floored at 1e-4 (the floor also catches NaN);
//  - fp8_v32/model1/mx: scale = 2^ceil(log2(scale)); element = e4m3(x / 2^e) computed as
//    x * 2^-e, which is the same correctly rounded float32 (2^-e is exact for every reachable e,
//    subnormal results included), so no division per element;
//  - fp4: scale = e4m3(scale) (>= the code 0x01 = 2^-9); element = e2m1(x / stored scale), the
//    quotient a float32 division, computed exactly without dividing (e2m1_count_biased); the
//    group scales' divisions use __fdiv_rn (nvcc's default -prec-div is not relied upon);
//  - e4m3 saturates (inf -> ±448) and NaN -> 0x7F; e2m1 saturates and NaN -> +0 (the hardware
//    and the toolkit's emulation give +6; codec.h promises +0);
//  - bf16: RNE, NaN keeps sign and payload (bits >> 16 | 0x40); fp16: RNE, NaN -> 0x7FFF;
//  - decode: e4m3 and fp16 NaN -> 0x7FFFFFFF, e8m0 255 -> 0x7FC00000, and the product
//    element × scale follows x86 SSE's NaN rules (the host's): a NaN element wins, then a NaN
//    scale (quietened), and inf × 0 gives the "indefinite" 0xFFC00000. The GPU's own NaN
//    results are canonical (0x7FFFFFFF), so those cases are pinned here explicitly.
//  - products use __fmul_rn so that nvcc's default -fmad=true can never contract them.
#pragma once

#include "cuda/common/kv_codec_scalar.cuh"
#include "cuda/common/kv_codec_vector.cuh"

namespace openmla::cuda::kvcodec {

// --- the lane-level token codec ----------------------------------------------------------------
// One warp holds one token: lane l (0..31) owns dims [16l, 16l + 16) in `main` and, for the
// 576-dim codecs, dims 512 + 2l and 513 + 2l in `tail`. Every format's groups fall on lane
// boundaries: fp8_v32 128 dims = 8 lanes, fp8_model1 64 = 4 lanes (its bf16 rope, dims
// 448..511, is lanes 28..31), fp8_mx 32 = 2 lanes, fp4 16 = 1 lane. A token's data is read as
// 16 B (e4m3), 32 B (bf16/fp16), 64 B (fp32) or 8 B (fp4) per lane: one contiguous run per warp.
enum class Codec : int {
  kBF16,  // plain bf16 (a cache's data part, or a dense bf16 row)
  kFP16,  // plain fp16
  kF32,   // dense float32 row (write input, gather output; not a cache format)
  kFP8_V32,
  kFP8_Model1,
  kFP8_MX,
  kFP4,
};

struct LaneVals {
  float main[16];
  float tail[2];
};

// A token's three parts (data, scale, rope), as in codec.cc's TokenParts.
template <typename Byte>
struct TokenPtrT {
  Byte* data;
  Byte* scale;
  Byte* rope;
};
using TokenPtr = TokenPtrT<uint8_t>;
using ConstTokenPtr = TokenPtrT<const uint8_t>;

// Lanes sharing one scale (the width of the amax reduction); 0 for plain codecs.
template <Codec C>
constexpr int group_lanes() {
  return C == Codec::kFP8_V32      ? 8
         : C == Codec::kFP8_Model1 ? 4
         : C == Codec::kFP8_MX     ? 2
         : C == Codec::kFP4        ? 1
                                   : 0;
}
// The dims a codec stores (0: any, plain codecs take d_qk from the template argument D).
template <Codec C>
constexpr int codec_dims() {
  return C == Codec::kFP8_V32                                                   ? 576
         : (C == Codec::kFP8_Model1 || C == Codec::kFP8_MX || C == Codec::kFP4) ? 512
                                                                                : 0;
}
template <Codec C, int D>
constexpr bool codec_supports() {
  return (D == 576 || D == 512) && (codec_dims<C>() == 0 || codec_dims<C>() == D);
}

namespace detail {
// 16 bf16 or fp16 in 8 words <-> 16 floats.
template <bool kFp16>
OPENMLA_HD void halves_to_float(const uint32_t* w, int n_words, float* out) {
  for (int k = 0; k < n_words; ++k) {
    if constexpr (kFp16) {
      out[2 * k] = fp16_to_float(w[k] & 0xFFFFu);
      out[2 * k + 1] = fp16_to_float(w[k] >> 16);
    } else {
      out[2 * k] = bf16_to_float(w[k] & 0xFFFFu);
      out[2 * k + 1] = bf16_to_float(w[k] >> 16);
    }
  }
}
template <bool kFp16>
OPENMLA_HD void float_to_halves(const float* x, int n_words, uint32_t* w) {
  for (int k = 0; k < n_words; ++k) {
    if constexpr (kFp16) {
      w[k] = float_to_fp16(x[2 * k]) | (float_to_fp16(x[2 * k + 1]) << 16);
    } else {
      w[k] = float_to_bf16(x[2 * k]) | (float_to_bf16(x[2 * k + 1]) << 16);
    }
  }
}
// 16 e4m3 codes (4 words) times one scale.
OPENMLA_HD void decode_e4m3x16(const uint32_t (&w)[4], float scale, float* out) {
  OPENMLA_UNROLL
  for (int k = 0; k < 4; ++k) {
    float e[4];
    e4m3x4_to_float(w[k], e);
    OPENMLA_UNROLL
    for (int i = 0; i < 4; ++i)
      out[4 * k + i] = host_mul_e4m3((w[k] >> (8 * i)) & 0xFFu, e[i], scale);
  }
}
// 16 floats times 2^-e to 16 e4m3 codes (4 words).
OPENMLA_HD void encode_e4m3x16(const float* x, float inv_scale, uint32_t (&w)[4]) {
  OPENMLA_UNROLL
  for (int k = 0; k < 4; ++k) {
    const uint32_t lo =
        float2_to_e4m3x2(mul_rn(x[4 * k], inv_scale), mul_rn(x[4 * k + 1], inv_scale));
    const uint32_t hi =
        float2_to_e4m3x2(mul_rn(x[4 * k + 2], inv_scale), mul_rn(x[4 * k + 3], inv_scale));
    w[k] = lo | (hi << 16);
  }
}
// The largest |x| bit pattern: an integer max, the float order for non-NaN values; > 0x7F800000
// exactly when a NaN is there, 0x7F800000 when the largest is an infinity.
OPENMLA_HD uint32_t max_abs_bits16(const float* x) {
  uint32_t m = 0;
  OPENMLA_UNROLL
  for (int i = 0; i < 16; ++i) {
    const uint32_t a = f2u(x[i]) & 0x7FFFFFFFu;
    m = a > m ? a : m;
  }
  return m;
}
// Largest finite |x| (0 if none): the integer max above, redone without the infinities and NaNs
// in the rare case one was picked.
OPENMLA_HD float finite_amax16(const float* x) {
  float amax = u2f(max_abs_bits16(x));
  if (f2u(amax) >= 0x7F800000u) {
    amax = 0.0f;
    for (int i = 0; i < 16; ++i) {
      const float a = abs_f(x[i]);
      if (f2u(a) < 0x7F800000u && a > amax) amax = a;
    }
  }
  return amax;
}
}  // namespace detail

// The lane's share of its group's finite amax (the caller reduces it over group_lanes()).
template <Codec C>
OPENMLA_HD float lane_amax(const LaneVals& v, int lane) {
  if constexpr (C == Codec::kFP8_Model1) {
    if (lane >= 28) return 0.0f;  // rope lanes
  }
  return detail::finite_amax16(v.main);
}

// Reads token `t` into lane `lane`'s values.
template <Codec C, int D>
OPENMLA_HD void decode_lane(const ConstTokenPtr& t, int lane, LaneVals& v) {
  static_assert(codec_supports<C, D>(), "codec and d_qk");
  if constexpr (C == Codec::kBF16 || C == Codec::kFP16) {
    constexpr bool kFp16 = C == Codec::kFP16;
    uint32_t w[8];
    load_bytes<32>(t.data + 32 * lane, w);
    detail::halves_to_float<kFp16>(w, 8, v.main);
    if constexpr (D == 576) {
      uint32_t tw[1];
      load_bytes<4>(t.data + 1024 + 4 * lane, tw);
      detail::halves_to_float<kFp16>(tw, 1, v.tail);
    }
  } else if constexpr (C == Codec::kF32) {
    uint32_t w[16];
    load_bytes<64>(t.data + 64 * lane, w);
    OPENMLA_UNROLL
    for (int i = 0; i < 16; ++i) v.main[i] = u2f(w[i]);
    if constexpr (D == 576) {
      uint32_t tw[2];
      load_bytes<8>(t.data + 2048 + 8 * lane, tw);
      v.tail[0] = u2f(tw[0]), v.tail[1] = u2f(tw[1]);
    }
  } else if constexpr (C == Codec::kFP8_V32) {
    uint32_t w[4], tw[1];
    load_bytes<16>(t.data + 16 * lane, w);
    const float scale = load_f32(t.scale + 4 * (lane >> 3));
    load_bytes<4>(t.rope + 4 * lane, tw);
    detail::decode_e4m3x16(w, scale, v.main);
    detail::halves_to_float<false>(tw, 1, v.tail);
  } else if constexpr (C == Codec::kFP8_Model1) {
    if (lane < 28) {
      uint32_t w[4];
      load_bytes<16>(t.data + 16 * lane, w);
      const float scale = e8m0_to_float(load_u8(t.scale + (lane >> 2)));
      detail::decode_e4m3x16(w, scale, v.main);
    } else {
      uint32_t w[8];
      load_bytes<32>(t.rope + 32 * (lane - 28), w);
      detail::halves_to_float<false>(w, 8, v.main);
    }
  } else if constexpr (C == Codec::kFP8_MX) {
    uint32_t w[4];
    load_bytes<16>(t.data + 16 * lane, w);
    const float scale = e8m0_to_float(load_u8(t.scale + (lane >> 1)));
    detail::decode_e4m3x16(w, scale, v.main);
  } else if constexpr (C == Codec::kFP4) {
    uint32_t w[2];
    load_bytes<8>(t.data + 8 * lane, w);
    const float scale = e4m3_to_float(load_u8(t.scale + lane));
    OPENMLA_UNROLL
    for (int i = 0; i < 16; ++i) {
      v.main[i] = host_mul(e2m1_to_float((w[i / 8] >> (4 * (i % 8))) & 0xFu), scale);
    }
  }
}

// Writes lane `lane`'s share of token `t`; `group_amax` is the finite amax of the lane's group
// (the max of lane_amax over its group_lanes() lanes; ignored by plain codecs).
template <Codec C, int D>
OPENMLA_HD void encode_lane(const TokenPtr& t, int lane, const LaneVals& v, float group_amax) {
  static_assert(codec_supports<C, D>(), "codec and d_qk");
  if constexpr (C == Codec::kBF16 || C == Codec::kFP16) {
    constexpr bool kFp16 = C == Codec::kFP16;
    uint32_t w[8];
    detail::float_to_halves<kFp16>(v.main, 8, w);
    store_bytes<32>(t.data + 32 * lane, w);
    if constexpr (D == 576) {
      uint32_t tw[1];
      detail::float_to_halves<kFp16>(v.tail, 1, tw);
      store_bytes<4>(t.data + 1024 + 4 * lane, tw);
    }
  } else if constexpr (C == Codec::kF32) {
    uint32_t w[16];
    OPENMLA_UNROLL
    for (int i = 0; i < 16; ++i) w[i] = f2u(v.main[i]);
    store_bytes<64>(t.data + 64 * lane, w);
    if constexpr (D == 576) {
      const uint32_t tw[2] = {f2u(v.tail[0]), f2u(v.tail[1])};
      store_bytes<8>(t.data + 2048 + 8 * lane, tw);
    }
  } else if constexpr (C == Codec::kFP8_V32 || C == Codec::kFP8_Model1 || C == Codec::kFP8_MX) {
    if (C != Codec::kFP8_Model1 || lane < 28) {
      const int e = pow2_scale_exponent(group_amax);
      uint32_t w[4];
      detail::encode_e4m3x16(v.main, exp2_int(-e), w);
      store_bytes<16>(t.data + 16 * lane, w);
      if constexpr (C == Codec::kFP8_V32) {
        if ((lane & 7) == 0) {
          const uint32_t s[1] = {f2u(exp2_int(e))};
          store_bytes<4>(t.scale + 4 * (lane >> 3), s);
        }
      } else if constexpr (C == Codec::kFP8_Model1) {
        if ((lane & 3) == 0) t.scale[lane >> 2] = static_cast<uint8_t>(e8m0_from_exponent(e));
      } else {
        if ((lane & 1) == 0) t.scale[lane >> 1] = static_cast<uint8_t>(e8m0_from_exponent(e));
      }
    } else {
      // fp8_model1's rope lanes: dims 448 + 16 (lane - 28) ... as bf16; lane 28 also writes the
      // scale part's pad byte.
      uint32_t w[8];
      detail::float_to_halves<false>(v.main, 8, w);
      store_bytes<32>(t.rope + 32 * (lane - 28), w);
      if (lane == 28) t.scale[7] = 0;
    }
    if constexpr (C == Codec::kFP8_V32) {
      uint32_t tw[1];
      detail::float_to_halves<false>(v.tail, 1, tw);
      store_bytes<4>(t.rope + 4 * lane, tw);
    }
  } else if constexpr (C == Codec::kFP4) {
    const uint32_t scale_code = fp4_scale_code(group_amax);
    const float scale = e4m3_to_float(scale_code);
    // e2m1(x / scale) without dividing, on the FMA pipe. NaN elements encode as +0 (codec.h), so
    // a lane holding one (the amax's integer max tells, rarely true) zeroes them first.
    float x[16];
    OPENMLA_UNROLL
    for (int i = 0; i < 16; ++i) x[i] = v.main[i];
    if (detail::max_abs_bits16(x) > 0x7F800000u) {
      OPENMLA_UNROLL
      for (int i = 0; i < 16; ++i) x[i] = is_nan(x[i]) ? 0.0f : x[i];
    }
    const Fp4SatBounds sat_bounds = fp4_sat_bounds(fp4_bounds(scale));
    const uint32_t w[2] = {fp4_word_no_nan(x, sat_bounds), fp4_word_no_nan(x + 8, sat_bounds)};
    store_bytes<8>(t.data + 8 * lane, w);
    t.scale[lane] = static_cast<uint8_t>(scale_code);
  }
}

// bf16 (d_qk 512) -> fp4 for lane `lane`, from the 16 source bf16 as loaded (8 words, dim 2k in
// word k's low half): the same bytes as decode_lane<kBF16, 512> then encode_lane<kFP4, 512> (fp4's
// group is one lane, so the lane's own finite amax is the group's). The f16x2 encoder where the
// lane's |x| are all below 2^121 (kFp4H2MaxBits; then all are finite and the amax is the largest
// bits), else (inf, NaN or absurd magnitudes, rare) the float path.
OPENMLA_HD void encode_lane_fp4_from_bf16(const TokenPtr& t, int lane, const uint32_t (&w)[8]) {
  const float amax = max_abs_bf16x16(w);
  if (f2u(amax) < kFp4H2MaxBits << 16) {
    const uint32_t scale_code = fp4_scale_code_bf16(amax);
    const Fp4H2Bounds bounds = fp4_h2_bounds(e4m3_to_float_finite(scale_code));
    const uint32_t out[2] = {fp4_word_from_bf16(w, bounds), fp4_word_from_bf16(w + 4, bounds)};
    store_bytes<8>(t.data + 8 * lane, out);
    t.scale[lane] = static_cast<uint8_t>(scale_code);
  } else {
    LaneVals v;
    detail::halves_to_float<false>(w, 8, v.main);
    v.tail[0] = v.tail[1] = 0.0f;
    encode_lane<Codec::kFP4, 512>(t, lane, v, lane_amax<Codec::kFP4>(v, lane));
  }
}

// bf16 (d_qk 512) -> fp4 for a token that kLanes lanes share (32: a warp, 16: a half-warp, ...):
// lane `lane` (< kLanes) encodes the fp4 groups lane + k * kLanes, k < 32 / kLanes (group g: bf16
// dims 16g..16g+15 at src_data + 32g, fp4 bytes 8g.., scale byte g), its loads all issued before
// the first encode. For any kLanes a load instruction reads 32 B per lane at a 32 B stride, as
// with a warp per token.
template <int kLanes>
OPENMLA_HD void transcode_lane_fp4_from_bf16(const uint8_t* src_data, const TokenPtr& dst,
                                             int lane) {
  static_assert(kLanes >= 1 && kLanes <= 32 && 32 % kLanes == 0, "lanes per token");
  constexpr int kGroups = 32 / kLanes;
  uint32_t w[kGroups][8];
  OPENMLA_UNROLL
  for (int k = 0; k < kGroups; ++k) load_bytes<32>(src_data + 32 * (lane + k * kLanes), w[k]);
  OPENMLA_UNROLL
  for (int k = 0; k < kGroups; ++k) encode_lane_fp4_from_bf16(dst, lane + k * kLanes, w[k]);
}

}  // namespace openmla::cuda::kvcodec
