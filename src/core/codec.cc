// Host codecs of the KV-cache formats (docs/formats.md). The toolkit's host conversions do the
// rounding (they are exact RNE, computed through double); NaN results are pinned to codec.h's
// documented codes where the toolkit differs.
#include "core/codec.h"

#include <cuda_fp16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

namespace openmla::codec {

namespace {

// The smallest pre-rounding scale of every quantised format (docs/formats.md).
constexpr float kMinScale = 1e-4f;
constexpr float kE4M3Max = 448.0f;
constexpr float kE2M1Max = 6.0f;

// Decoding is on the CPU backend's hot path: tables built once from the scalar definitions.
const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int bits = 0; bits < 256; ++bits) {
      const __half_raw h =
          __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(bits), __NV_E4M3);
      t[bits] = fp16_to_float(h.x);
    }
    return t;
  }();
  return table;
}

const std::array<float, 16>& e2m1_table() {
  static const std::array<float, 16> table = [] {
    std::array<float, 16> t{};
    for (int bits = 0; bits < 16; ++bits) {
      const __half_raw h =
          __nv_cvt_fp4_to_halfraw(static_cast<__nv_fp4_storage_t>(bits), __NV_E2M1);
      t[bits] = fp16_to_float(h.x);
    }
    return t;
  }();
  return table;
}

void store_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, sizeof(v)); }
uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
void store_f32(uint8_t* p, float v) { std::memcpy(p, &v, sizeof(v)); }
float load_f32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// A token's three parts inside its block (Byte is uint8_t or const uint8_t).
template <typename Byte>
struct TokenParts {
  Byte* data;
  Byte* scale;
  Byte* rope;
};

template <typename Byte>
TokenParts<Byte> token_parts(const KVLayout& layout, Byte* block, int token) {
  return {block + layout.data_offset + token * layout.data_stride,
          block + layout.scale_offset + token * layout.scale_stride,
          block + layout.rope_offset + token * layout.rope_stride};
}

// The e4m3-element formats with power-of-two scales: fp8_v32 stores them as float32,
// fp8_model1 and fp8_mx as e8m0.
void encode_pow2_e4m3(const KVFormatInfo& info, bool f32_scales, const float* x,
                      const TokenParts<uint8_t>& p) {
  for (int g = 0; g < info.num_scales; ++g) {
    const float* xg = x + g * info.group_size;
    const int e = pow2_scale_exponent(finite_amax(xg, info.group_size));
    const float scale = std::ldexp(1.0f, e);
    for (int i = 0; i < info.group_size; ++i) {
      p.data[g * info.group_size + i] = float_to_e4m3(xg[i] / scale);
    }
    if (f32_scales) {
      store_f32(p.scale + 4 * g, scale);
    } else {
      p.scale[g] = e8m0_from_exponent(e);
    }
  }
  const int scale_width = f32_scales ? 4 : 1;
  std::fill(p.scale + info.num_scales * scale_width, p.scale + info.scale_bytes, uint8_t{0});
}

void decode_pow2_e4m3(const KVFormatInfo& info, bool f32_scales, const TokenParts<const uint8_t>& p,
                      float* out) {
  const std::array<float, 256>& e4m3 = e4m3_table();
  for (int g = 0; g < info.num_scales; ++g) {
    const float scale = f32_scales ? load_f32(p.scale + 4 * g) : e8m0_to_float(p.scale[g]);
    for (int i = 0; i < info.group_size; ++i) {
      const int d = g * info.group_size + i;
      out[d] = e4m3[p.data[d]] * scale;
    }
  }
}

void encode_fp4(const KVFormatInfo& info, const float* x, const TokenParts<uint8_t>& p) {
  for (int g = 0; g < info.num_scales; ++g) {
    const float* xg = x + g * info.group_size;
    const uint8_t scale_bits = fp4_scale_e4m3(finite_amax(xg, info.group_size));
    const float scale = e4m3_to_float(scale_bits);
    p.scale[g] = scale_bits;
    for (int i = 0; i < info.group_size; i += 2) {
      p.data[(g * info.group_size + i) / 2] =
          fp4_pack(float_to_e2m1(xg[i] / scale), float_to_e2m1(xg[i + 1] / scale));
    }
  }
}

void decode_fp4(const KVFormatInfo& info, const TokenParts<const uint8_t>& p, float* out) {
  const std::array<float, 16>& e2m1 = e2m1_table();
  for (int g = 0; g < info.num_scales; ++g) {
    const float scale = e4m3_to_float(p.scale[g]);
    for (int i = 0; i < info.group_size; ++i) {
      const int d = g * info.group_size + i;
      out[d] = e2m1[fp4_unpack(p.data[d / 2], d)] * scale;
    }
  }
}

}  // namespace

// --- scalar conversions ---------------------------------------------------------------------

float bf16_to_float(uint16_t bits) { return std::bit_cast<float>(uint32_t{bits} << 16); }

uint16_t float_to_bf16(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  if (std::isnan(x)) return static_cast<uint16_t>((bits >> 16) | 0x0040);  // quiet, sign kept
  // Round to nearest even: add half an ulp, plus one when the kept lsb is odd.
  const uint32_t rounding = 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float fp16_to_float(uint16_t bits) {
  __half_raw raw;
  raw.x = bits;
  return __half2float(__half(raw));
}

uint16_t float_to_fp16(float x) { return static_cast<__half_raw>(__float2half_rn(x)).x; }

float e4m3_to_float(uint8_t bits) { return e4m3_table()[bits]; }

uint8_t float_to_e4m3(float x) {
  // codec.h promises 0x7F for every NaN; the toolkit's float path agrees, its double path
  // keeps the sign (0xFF), so the contract is pinned here rather than left to it.
  if (std::isnan(x)) return 0x7F;
  return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}

float e8m0_to_float(uint8_t bits) {
  if (bits == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, int{bits} - 127);
}

uint8_t e8m0_from_exponent(int exponent) {
  return static_cast<uint8_t>(std::clamp(exponent, -127, 127) + 127);
}

float e2m1_to_float(uint8_t nibble) { return e2m1_table()[nibble & 0xF]; }

uint8_t float_to_e2m1(float x) {
  // The toolkit (like cvt.rn.satfinite) maps NaN to +6; codec.h promises +0.
  if (std::isnan(x)) return 0x0;
  return __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest);
}

// --- group scales ---------------------------------------------------------------------------

float finite_amax(const float* x, int n) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) {
    if (std::isfinite(x[i])) amax = std::max(amax, std::fabs(x[i]));
  }
  return amax;
}

int pow2_scale_exponent(float amax) {
  float scale = amax / kE4M3Max;
  if (!(scale >= kMinScale)) scale = kMinScale;  // also catches NaN
  if (std::isinf(scale)) return 127;
  // scale = m * 2^e with m in [0.5, 1): ceil(log2(scale)) is e, or e - 1 when m is exactly 0.5.
  int e = 0;
  const float m = std::frexp(scale, &e);
  return m == 0.5f ? e - 1 : e;
}

uint8_t fp4_scale_e4m3(float amax) {
  float scale = amax / kE2M1Max;
  if (!(scale >= kMinScale)) scale = kMinScale;
  // Tiny scales round to e4m3 zero; the smallest positive e4m3 (2^-9) keeps the division finite.
  return std::max<uint8_t>(float_to_e4m3(scale), 0x01);
}

// --- tokens ---------------------------------------------------------------------------------

void encode_token(const KVLayout& layout, const float* x, uint8_t* block, int token) {
  const KVFormatInfo info = kv_format_info(layout.format, layout.d_qk);
  const TokenParts<uint8_t> p = token_parts(layout, block, token);
  switch (layout.format) {
    case KVFormat::kBF16:
      for (int d = 0; d < info.d_qk; ++d) store_u16(p.data + 2 * d, float_to_bf16(x[d]));
      return;
    case KVFormat::kFP16:
      for (int d = 0; d < info.d_qk; ++d) store_u16(p.data + 2 * d, float_to_fp16(x[d]));
      return;
    case KVFormat::kFP8_V32:
    case KVFormat::kFP8_Model1:
    case KVFormat::kFP8_MX:
      encode_pow2_e4m3(info, layout.format == KVFormat::kFP8_V32, x, p);
      for (int i = 0; i < info.rope_dims; ++i) {
        store_u16(p.rope + 2 * i, float_to_bf16(x[info.quantized_dims + i]));
      }
      return;
    case KVFormat::kFP4: encode_fp4(info, x, p); return;
  }
}

void decode_token(const KVLayout& layout, const uint8_t* block, int token, float* out) {
  const KVFormatInfo info = kv_format_info(layout.format, layout.d_qk);
  const TokenParts<const uint8_t> p = token_parts(layout, block, token);
  switch (layout.format) {
    case KVFormat::kBF16:
      for (int d = 0; d < info.d_qk; ++d) out[d] = bf16_to_float(load_u16(p.data + 2 * d));
      return;
    case KVFormat::kFP16:
      for (int d = 0; d < info.d_qk; ++d) out[d] = fp16_to_float(load_u16(p.data + 2 * d));
      return;
    case KVFormat::kFP8_V32:
    case KVFormat::kFP8_Model1:
    case KVFormat::kFP8_MX:
      decode_pow2_e4m3(info, layout.format == KVFormat::kFP8_V32, p, out);
      for (int i = 0; i < info.rope_dims; ++i) {
        out[info.quantized_dims + i] = bf16_to_float(load_u16(p.rope + 2 * i));
      }
      return;
    case KVFormat::kFP4: decode_fp4(info, p, out); return;
  }
}

void encode_slot(const KVCache& cache, int64_t slot, const float* x) {
  const int64_t page_size = cache.layout.page_size;
  encode_token(cache.layout, x, block_ptr(cache.data, cache.layout, slot / page_size),
               static_cast<int>(slot % page_size));
}

void decode_slot(const KVCache& cache, int64_t slot, float* out) {
  const int64_t page_size = cache.layout.page_size;
  decode_token(cache.layout,
               block_ptr(static_cast<const void*>(cache.data), cache.layout, slot / page_size),
               static_cast<int>(slot % page_size), out);
}

}  // namespace openmla::codec
