// Device mirror of the host KV-cache codecs (src/core/codec.cc), the element conversions (kv_codec.cuh
// includes this, the vector helpers and the lane-level token codec): the same bytes for every input,
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

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#define OPENMLA_HD __host__ __device__ __forceinline__
#else
#define OPENMLA_HD inline
#endif
#if defined(__CUDA_ARCH__)
#define OPENMLA_UNROLL _Pragma("unroll")
#else
#define OPENMLA_UNROLL
#endif

namespace openmla::cuda::kvcodec {

// --- bits ----------------------------------------------------------------------------------
OPENMLA_HD uint32_t f2u(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
#endif
}
OPENMLA_HD float u2f(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
#endif
}
OPENMLA_HD bool is_nan(float x) { return x != x; }  // no fast-math anywhere in this build
OPENMLA_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
OPENMLA_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
OPENMLA_HD float abs_f(float x) { return u2f(f2u(x) & 0x7FFFFFFFu); }
OPENMLA_HD float max_f(float a, float b) { return a > b ? a : b; }  // never sees NaN here
// Round to nearest integer, ties to even, for 0 <= x < 2^22 (exact: adding 2^23 leaves no
// fraction bits, and the addition itself rounds to nearest even).
OPENMLA_HD uint32_t rint_small(float x) {
  const float big = 8388608.0f;  // 2^23
#if defined(__CUDA_ARCH__)
  return f2u(__fadd_rn(x, big)) - f2u(big);
#else
  volatile float sum = x + big;  // volatile: no reassociation by the host compiler
  return f2u(sum) - f2u(big);
#endif
}

constexpr uint32_t kCanonicalNaN = 0x7FFFFFFFu;   // what the host's e4m3/fp16 NaN decodes to
constexpr uint32_t kE8M0NaN = 0x7FC00000u;        // std::numeric_limits<float>::quiet_NaN()
constexpr uint32_t kX86Indefinite = 0xFFC00000u;  // SSE's result of inf × 0

// element × scale with the host's NaN results (x86 SSE: a NaN first operand wins, quietened;
// else a NaN second operand, quietened; a NaN from two numbers is the indefinite NaN).
OPENMLA_HD float host_mul(float element, float scale) {
  const float p = mul_rn(element, scale);
  if (!is_nan(p)) return p;
  if (is_nan(element)) return u2f(f2u(element) | 0x00400000u);
  if (is_nan(scale)) return u2f(f2u(scale) | 0x00400000u);
  return u2f(kX86Indefinite);
}

// --- bf16 ----------------------------------------------------------------------------------
OPENMLA_HD float bf16_to_float(uint32_t bits16) { return u2f(bits16 << 16); }
OPENMLA_HD uint32_t float_to_bf16(float x) {
  const uint32_t u = f2u(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return ((u >> 16) | 0x0040u) & 0xFFFFu;
  return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}

// --- fp16 ----------------------------------------------------------------------------------
OPENMLA_HD float fp16_to_float_sw(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu;
  if (exponent == 0x1F) return u2f(mantissa != 0 ? kCanonicalNaN : (sign | 0x7F800000u));
  if (exponent == 0) {
    // m * 2^-24, exact (m < 2^10).
    return u2f(f2u(mul_rn(static_cast<float>(mantissa), 5.9604644775390625e-08f)) | sign);
  }
  return u2f(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}
OPENMLA_HD uint32_t float_to_fp16_sw(float x) {
  const uint32_t u = f2u(x);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0x7FFFu;
  if (a >= 0x477FF000u) return sign | 0x7C00u;  // >= 65520 (the tie above 65504) -> inf
  if (a >= 0x38800000u) {                       // >= 2^-14: a normal fp16
    const uint32_t r = a + 0xFFFu + ((a >> 13) & 1u);
    return sign | ((r >> 13) - (112u << 10));
  }
  // Subnormal fp16 (quantum 2^-24); 1024 lands on the smallest normal's code.
  return sign | rint_small(mul_rn(u2f(a), 16777216.0f));
}
OPENMLA_HD float fp16_to_float(uint32_t h) {
#if defined(__CUDA_ARCH__)
  if ((h & 0x7FFFu) > 0x7C00u) return u2f(kCanonicalNaN);
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
#else
  return fp16_to_float_sw(h);
#endif
}
OPENMLA_HD uint32_t float_to_fp16(float x) {
#if defined(__CUDA_ARCH__)
  if (is_nan(x)) return 0x7FFFu;
  return __half_as_ushort(__float2half_rn(x));
#else
  return float_to_fp16_sw(x);
#endif
}

// --- e4m3 ("fn": max 448, NaN 0x7F/0xFF, no inf) ---------------------------------------------
OPENMLA_HD float e4m3_to_float_sw(uint32_t b) {
  const uint32_t sign = (b & 0x80u) << 24;
  const uint32_t exponent = (b >> 3) & 0xFu, mantissa = b & 7u;
  if ((b & 0x7Fu) == 0x7Fu) return u2f(kCanonicalNaN);
  if (exponent == 0) return u2f(f2u(mul_rn(static_cast<float>(mantissa), 0.001953125f)) | sign);
  return u2f(sign | ((exponent + 120u) << 23) | (mantissa << 20));
}
OPENMLA_HD uint32_t float_to_e4m3_sw(float x) {
  const uint32_t u = f2u(x);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0x7Fu;
  if (a >= 0x43E00000u) return sign | 0x7Eu;  // >= 448 (inf too): saturate
  if (a >= 0x3C800000u) {                     // >= 2^-6: a normal e4m3; < 448 never rounds past it
    const uint32_t r = a + 0x7FFFFu + ((a >> 20) & 1u);
    return sign | ((r >> 20) - (120u << 3));
  }
  // Subnormal e4m3 (quantum 2^-9); 8 lands on the smallest normal's code.
  return sign | rint_small(mul_rn(u2f(a), 512.0f));
}

// Four e4m3 codes (bytes of `w`, lowest first) to floats.
OPENMLA_HD void e4m3x4_to_float(uint32_t w, float* out) {
#if defined(__CUDA_ARCH__)
  // cvt.rn.f16x2.e4m3x2: exact for every finite code (fp16 holds all of e4m3); NaN is pinned by
  // the caller's NaN check (host_mul_e4m3).
  const __half2_raw lo =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xFFFFu), __NV_E4M3);
  const __half2_raw hi =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> 16), __NV_E4M3);
  out[0] = __half2float(__ushort_as_half(lo.x));
  out[1] = __half2float(__ushort_as_half(lo.y));
  out[2] = __half2float(__ushort_as_half(hi.x));
  out[3] = __half2float(__ushort_as_half(hi.y));
#else
  for (int i = 0; i < 4; ++i) out[i] = e4m3_to_float_sw((w >> (8 * i)) & 0xFFu);
#endif
}
OPENMLA_HD float e4m3_to_float(uint32_t b) {
#if defined(__CUDA_ARCH__)
  if ((b & 0x7Fu) == 0x7Fu) return u2f(kCanonicalNaN);
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), __NV_E4M3);
  return __half2float(__ushort_as_half(h.x));
#else
  return e4m3_to_float_sw(b);
#endif
}
// Two floats to two e4m3 codes (x in the low byte).
OPENMLA_HD uint32_t float2_to_e4m3x2(float x, float y) {
#if defined(__CUDA_ARCH__)
  // cvt.rn.satfinite.e4m3x2.f32: RNE, ±inf and |v| > 448 -> ±448, NaN -> 0x7F.
  return static_cast<uint32_t>(
      __nv_cvt_float2_to_fp8x2(make_float2(x, y), __NV_SATFINITE, __NV_E4M3));
#else
  return float_to_e4m3_sw(x) | (float_to_e4m3_sw(y) << 8);
#endif
}
OPENMLA_HD uint32_t float_to_e4m3(float x) { return float2_to_e4m3x2(x, 0.0f) & 0xFFu; }

// e4m3 element decoded with the hardware (NaN not yet pinned) times its scale, NaNs as the host.
OPENMLA_HD float host_mul_e4m3(uint32_t code, float element, float scale) {
  const float p = mul_rn(element, scale);
  if (!is_nan(p)) return p;
  return host_mul((code & 0x7Fu) == 0x7Fu ? u2f(kCanonicalNaN) : element, scale);
}

// --- e8m0 and e2m1 -------------------------------------------------------------------------
OPENMLA_HD float e8m0_to_float(uint32_t b) {
  if (b == 0xFFu) return u2f(kE8M0NaN);
  return u2f(b == 0 ? 0x00400000u : (b << 23));  // 2^(b - 127); 2^-127 is subnormal
}
OPENMLA_HD float e2m1_to_float(uint32_t nibble) {
  // Magnitudes ×2 = {0, 1, 2, 3, 4, 6, 8, 12}, one per nibble of 0xC8643210.
  const float magnitude = static_cast<float>((0xC8643210u >> (4 * (nibble & 7u))) & 0xFu) * 0.5f;
  return u2f(f2u(magnitude) | ((nibble & 8u) << 28));
}
// RNE onto ±{0, .5, 1, 1.5, 2, 3, 4, 6}, saturating; ties go to the even code (0.25 -> 0,
// 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4). NaN -> +0.
OPENMLA_HD uint32_t float_to_e2m1(float x) {
  if (is_nan(x)) return 0;
  const float a = abs_f(x);
  const uint32_t code = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) +
                        (a >= 3.5f) + (a > 5.0f);
  return code | ((f2u(x) >> 28) & 8u);
}

// fp4 elements without a division: float_to_e2m1(x / scale) for a stored e4m3 scale, exactly.
// e2m1's code steps up where the float quotient q = RN(|x| / s) passes a midpoint t: q > t for
// the midpoints whose tie rounds down (0.25, 1.25, 2.5, 5), q >= t where it rounds up (0.75,
// 1.75, 3.5). Because t has <= 3 significant bits and s <= 4, P = t * s is an exact float, and
//   RN(|x| / s) > t   <=>  |x| / s > t + ulp(t)/2  <=>  |x| > P + ulp(t)/2 * s  <=>  |x| > P,
// since 0 < ulp(t)/2 * s < ulp(P) leaves no float in between; likewise q >= t <=> |x| >= P
// (P is never a power of two for those t, so the gap below it is ulp(P) as well). So the code
// is the number of bounds below |x|, found by a 3-step binary search over
//   G = {P(0.25), pred(P(0.75)), P(1.25), pred(P(1.75)), P(2.5), pred(P(3.5)), P(5)}  (|x| > G_i).
// NaN fails every comparison (code 0, and no sign: codec.h's +0); inf passes all (6).
// Checked against the division on sampled floats for every scale code in tests/cpu and on all
// 2^32 floats for every scale code by the GPU self-check.
struct Fp4Bounds {
  float g[7];
};
OPENMLA_HD float float_pred(float positive_normal) { return u2f(f2u(positive_normal) - 1u); }
OPENMLA_HD Fp4Bounds fp4_bounds(float scale) {
  Fp4Bounds b;
  b.g[0] = mul_rn(0.25f, scale);
  b.g[1] = float_pred(mul_rn(0.75f, scale));
  b.g[2] = mul_rn(1.25f, scale);
  b.g[3] = float_pred(mul_rn(1.75f, scale));
  b.g[4] = mul_rn(2.5f, scale);
  b.g[5] = float_pred(mul_rn(3.5f, scale));
  b.g[6] = mul_rn(5.0f, scale);
  return b;
}
OPENMLA_HD uint32_t e2m1_of_quotient(float x, const Fp4Bounds& b) {
  const uint32_t u = f2u(x);
  const float a = u2f(u & 0x7FFFFFFFu);
  const bool high = a > b.g[3];
  const bool mid = a > (high ? b.g[5] : b.g[1]);
  const bool low = a > (high ? (mid ? b.g[6] : b.g[4]) : (mid ? b.g[2] : b.g[0]));
  const uint32_t sign = is_nan(x) ? 0u : (u >> 28) & 8u;
  return (high ? 4u : 0u) | (mid ? 2u : 0u) | (low ? 1u : 0u) | sign;
}

// fp4 elements on the FMA pipe (the fast path; e2m1_of_quotient's compares and selects all run on
// the half-rate ALU pipe). With K = 2^40, c_i = sat(fma(|x|, K, -G_i * K)) is exactly [|x| > G_i]
// for the same bounds G_i: G_i * K is exact (G_i <= 5 * 448, a power-of-two factor), fma rounds
// the exact K (|x| - G_i) once, so its sign is the comparison's and it is +0 when equal; when
// |x| > G_i, |x| - G_i >= ulp(G_i) >= 2^-34 (every G_i >= 0.25 * 2^-9 = 2^-11 is normal), so the
// product is >= 64 and saturates to 1; inf gives +inf -> 1 and NaN gives 0 (sat's NaN rule).
// The sum of the seven, plus 2^23 (all exact small integers), has the code in its low 3 bits:
// e2m1_count_biased returns 0x4B000000 + code. The sign is the caller's (no NaN test here).
struct Fp4SatBounds {
  float neg_gk[7];
};
constexpr float kFp4SatK = 1099511627776.0f;  // 2^40
OPENMLA_HD Fp4SatBounds fp4_sat_bounds(const Fp4Bounds& b) {
  Fp4SatBounds s;
  for (int i = 0; i < 7; ++i) s.neg_gk[i] = -mul_rn(b.g[i], kFp4SatK);
  return s;
}
OPENMLA_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
OPENMLA_HD float fma_sat(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __saturatef(__fmaf_rn(a, b, c));  // FFMA.SAT: NaN -> +0
#else
  const float r = std::fma(a, b, c);
  return r > 0.0f ? (r < 1.0f ? r : 1.0f) : 0.0f;
#endif
}
OPENMLA_HD uint32_t e2m1_count_biased(float abs_x, const Fp4SatBounds& b) {
  const float c0 = fma_sat(abs_x, kFp4SatK, b.neg_gk[0]);
  const float c1 = fma_sat(abs_x, kFp4SatK, b.neg_gk[1]);
  const float c2 = fma_sat(abs_x, kFp4SatK, b.neg_gk[2]);
  const float c3 = fma_sat(abs_x, kFp4SatK, b.neg_gk[3]);
  const float c4 = fma_sat(abs_x, kFp4SatK, b.neg_gk[4]);
  const float c5 = fma_sat(abs_x, kFp4SatK, b.neg_gk[5]);
  const float c6 = fma_sat(abs_x, kFp4SatK, b.neg_gk[6]);
  return f2u(add_rn(add_rn(add_rn(c0, c1), add_rn(c2, c3)),
                    add_rn(add_rn(c4, c5), add_rn(c6, 8388608.0f))));
}
// Eight fp4 elements (one data word) for a lane holding no NaN: nibble i = code | sign << 3, built
// with additions (the nibbles never carry); the 0x4B000000 biases shifted by 4i sum to 0xFB000000
// mod 2^32, cancelled by the start value.
OPENMLA_HD uint32_t fp4_word_no_nan(const float* x, const Fp4SatBounds& b) {
  uint32_t w = 0u - 0xFB000000u;
  OPENMLA_UNROLL
  for (int i = 0; i < 8; ++i) {
    const uint32_t u = f2u(x[i]);
    w += e2m1_count_biased(u2f(u & 0x7FFFFFFFu), b) << (4 * i);
    w += (u >> 31) << (4 * i + 3);
  }
  return w;
}

}  // namespace openmla::cuda::kvcodec
