// A key's quantised codes to the bf16 values the MMAs read (the producer's arithmetic,
// fill_quantized.cuh): 16 e4m3 codes times a scale, 16 e2m1 codes times an e4m3 scale. The same
// bf16 as the host codec for every code a quantiser writes (docs/formats.md); no kernel state.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/common/kv_codec.cuh"

namespace openmla::cuda::sm90 {
namespace sparse {

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t selector) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(selector));
  return d;
}
__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ uint32_t bf16x2_of(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t bf16x2_splat(float m) {
  const __nv_bfloat162 mm = __float2bfloat162_rn(m);
  return *reinterpret_cast<const uint32_t*>(&mm);
}

// 16 e4m3 codes times one scale, as 8 bf16 pairs. A code's sign, exponent and mantissa moved
// into bf16 position by integer ops is the code's value times 2^-120 (the two exponent biases
// differ by 120; e4m3 subnormals land on bf16 subnormals), so one bf16x2 multiply by
// scale · 2^120 gives the product, exactly for the power-of-two scales every writer of these
// formats stores (e8m0, and fp8_v32's rounded-up float scales). NaN codes (0x7F, 0xFF, which no
// quantiser writes for finite data) come out finite here. Scales of 2^7 or more, NaN scales and
// non-finite products take the codec's float path instead.
__device__ __forceinline__ void e4m3x16_to_bf16(const uint32_t (&w)[4], float scale,
                                                uint32_t (&out)[8]) {
  const float m = scale * 0x1p120f;
  if (m < 0x1p127f) {
    const uint32_t mul = bf16x2_splat(m);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      // bytes 0, 1 (then 2, 3) at bits 8-15 and 24-31: sign in place, the rest 4 bits too high
      const uint32_t x0 = prmt(w[k], 0u, 0x1404u), x1 = prmt(w[k], 0u, 0x3424u);
      const uint32_t b0 = (x0 & 0x80008000u) | ((x0 >> 4) & 0x07F007F0u);
      const uint32_t b1 = (x1 & 0x80008000u) | ((x1 >> 4) & 0x07F007F0u);
      out[2 * k] = mul_bf16x2(b0, mul);
      out[2 * k + 1] = mul_bf16x2(b1, mul);
    }
    return;
  }
  float f[16];
  kvcodec::detail::decode_e4m3x16(w, scale, f);
#pragma unroll
  for (int k = 0; k < 8; ++k) out[k] = bf16x2_of(f[2 * k], f[2 * k + 1]);
}

// 16 e2m1 codes (two words, element 2i in the low nibble of byte i) times an e4m3 scale, as 8
// bf16 pairs: each code's bf16 bytes from two 8-entry byte tables (prmt, the magnitude bits as
// selectors), its sign moved in, then one bf16x2 multiply (e2m1 x e4m3 has at most 5 significant
// bits: exact in bf16, as the codec's product is). A NaN scale takes the codec's float path.
__device__ __forceinline__ void e2m1x16_to_bf16(uint32_t w0, uint32_t w1, float scale,
                                                uint32_t (&out)[8]) {
  const uint32_t w[2] = {w0, w1};
  if (!(scale == scale)) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint32_t bits = w[k / 4] >> (8 * (k % 4));
      out[k] = bf16x2_of(kvcodec::host_mul(kvcodec::e2m1_to_float(bits & 0xFu), scale),
                         kvcodec::host_mul(kvcodec::e2m1_to_float((bits >> 4) & 0xFu), scale));
    }
    return;
  }
  const uint32_t mul = bf16x2_splat(scale);
  // bf16 of 0, 0.5, 1, 1.5, 2, 3, 4, 6: high bytes 00 3F 3F 3F 40 40 40 40, low 00 00 80 C0 00 40
  // 80 C0. (Formed here through an empty asm: hoisted out of the producer's loops, the four
  // tables held registers across every format's code and spilled it.)
  uint32_t kHi0 = 0x3F3F3F00u, kHi1 = 0x40404040u, kLo0 = 0xC0800000u, kLo1 = 0xC0804000u;
  asm volatile("" : "+r"(kHi0), "+r"(kHi1), "+r"(kLo0), "+r"(kLo1));
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const uint32_t mags = w[k] & 0x77777777u;
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // nibbles 4h .. 4h + 3
      const uint32_t sel = mags >> (16 * h);
      const uint32_t hi = prmt(kHi0, kHi1, sel), lo = prmt(kLo0, kLo1, sel);
      const uint32_t sw = w[k] >> (16 * h);  // this half's signs at bits 3, 7, 11, 15
      const uint32_t s01 = ((sw << 12) & 0x00008000u) | ((sw << 24) & 0x80000000u);
      const uint32_t s23 = ((sw << 4) & 0x00008000u) | ((sw << 16) & 0x80000000u);
      out[4 * k + 2 * h] = mul_bf16x2(prmt(lo, hi, 0x5140u) | s01, mul);
      out[4 * k + 2 * h + 1] = mul_bf16x2(prmt(lo, hi, 0x7362u) | s23, mul);
    }
  }
}

}  // namespace sparse
}  // namespace openmla::cuda::sm90
