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

// --- fp4 from bf16, two elements per instruction ---------------------------------------------
// For a bf16 source the bound count runs on f16x2 (HFMA2.SAT/HADD2: two elements per FMA-pipe
// instruction) straight on the source's bits, exactly:
//  - For a bf16 |x|, [|x| > G] = [|x| > RD_bf16(G)] (no bf16 lies in between), and RD_bf16(G) is
//    G's upper 16 bits (G > 0 normal). Every bound's P = t * s is a bf16 (<= 7 significant bits),
//    so the bounds are h = bits16(P) for the "q > t" midpoints and bits16(P) - 1 for the
//    "q >= t" ones (the largest bf16 below P, as pred(P) truncated).
//  - Nonnegative bf16 and f16 both order as their bit patterns, so [|x| > G] = [F(a) > F(h)] for
//    a = bits16(|x|) < 0x7C00, where F reads 16 bits as an f16 (finite below 0x7C00). Lanes
//    holding |x| >= 2^121 (bits >= 0x7C00: inf, NaN and absurdly large values) take the float
//    path instead.
//  - 2^-11 <= G <= 5 * 448 puts h in [0x3A00, 0x450C], F(h) in [0.75, 5.05]. With K = 2^11,
//    sat(fma(F(a), K, -F(h) * K)) is exactly [F(a) > F(h)]: F(h) * K is an exact f16 (<= 10342),
//    fma rounds K (F(a) - F(h)) once, which is >= K * 2^-11 = 1 when F(a) > F(h) (the f16 gap
//    at or above 0.5 is >= 2^-11), 0 when equal, negative below; an overflow is +inf -> 1.
//  - The multiplier is kz = ±2^11 with x's sign (one LOP3 on the raw pair), so x' * kz =
//    |x'| * K, and kz * -2^-9 = 8 * sign - 4 adds the nibble's sign bit (±0 included).
//  - The code is found by a 3-step binary search, as e2m1_of_quotient does: c3 = [|x| > G3],
//    c1 = [|x| > (c3 ? G5 : G1)], c0 = [|x| > one of G0, G2, G4, G6 by (c3, c1)], code =
//    4 c3 + 2 c1 + c0. Each step's bound is picked with fmas on the 0/1 results before it
//    (fma(c, B - A, A), nested for the last step), exact because every partial result is a bound
//    or a difference of two bounds (all -F(h) K lie within two f16 binades of each other, so each
//    difference is an integer multiple of the smaller one's ulp below 2^11 of them: an f16).
// Per half the code bits, the sign term and the bias sum to small integers (exact); two
// registers holding elements (i, i+2) and (i+1, i+3) combine as 1024 + n_i + 16 n_{i+1}, an f16
// whose low byte is the packed byte. Held to the float path for all 2^16 bf16 values × all 126
// scale codes by tests/cpu (KVDeviceCodec.Fp4FromBf16MatchesDivision; its f16 emulation also
// asserts that no operation above rounds).

// Bytes `selector` (4 nibbles, lowest first) of {hi:lo} (__byte_perm without the sign modes).
OPENMLA_HD uint32_t byte_perm(uint32_t lo, uint32_t hi, uint32_t selector) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(lo, hi, selector);
#else
  const uint64_t v = (uint64_t{hi} << 32) | lo;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i)
    r |= static_cast<uint32_t>((v >> (8 * ((selector >> (4 * i)) & 7u))) & 0xFFu) << (8 * i);
  return r;
#endif
}

#if !defined(__CUDA_ARCH__)
namespace detail {
// The host emulation of the f16x2 arithmetic below: a * b + c in double, rounded once to f16.
// It is exact where the double sum is (true for every operand the fp4 encoder uses: the products
// have <= 22 significant bits and the sums span < 53); it counts the cases where it is not, so
// that a test can assert none happened.
inline unsigned long long h2_inexact_emulations = 0;
// One f16 lane of fma.rn{.sat}.f16 on the host (f16 NaN operands are not emulated).
inline uint32_t h1_fma(uint32_t a, uint32_t b, uint32_t c, bool sat) {
  const double p = static_cast<double>(fp16_to_float_sw(a)) * fp16_to_float_sw(b);  // exact
  const double z = fp16_to_float_sw(c);
  const double s = p + z;
  const double bb = s - p;  // TwoSum: the addition's error
  if ((p - (s - bb)) + (z - bb) != 0.0) ++h2_inexact_emulations;
  // Round s to the f16 grid (ulp 2^(e - 11), at least 2^-24), ties to even, then encode (exact).
  int e = 0;
  std::frexp(s, &e);
  const double ulp = std::ldexp(1.0, e - 11 > -24 ? e - 11 : -24);
  const double r = std::nearbyint(s / ulp) * ulp;
  uint32_t h = std::fabs(r) > 65504.0 ? (r < 0 ? 0xFC00u : 0x7C00u)
                                      : float_to_fp16_sw(static_cast<float>(r));
  if (r == 0.0 && std::signbit(s)) h = 0x8000u;
  if (!sat) return h;
  const float v = fp16_to_float_sw(h);
  return v <= 0.0f ? 0u : (v >= 1.0f ? 0x3C00u : h);
}
inline uint32_t h2_fma_host(uint32_t a, uint32_t b, uint32_t c, bool sat) {
  return h1_fma(a & 0xFFFFu, b & 0xFFFFu, c & 0xFFFFu, sat) |
         (h1_fma(a >> 16, b >> 16, c >> 16, sat) << 16);
}
}  // namespace detail
#endif

// f16x2 a * b + c (rounded once), saturated to [0, 1] (NaN -> +0).
OPENMLA_HD uint32_t h2_fma_sat(uint32_t a, uint32_t b, uint32_t c) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("fma.rn.sat.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
#else
  return detail::h2_fma_host(a, b, c, true);
#endif
}
OPENMLA_HD uint32_t h2_fma(uint32_t a, uint32_t b, uint32_t c) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
#else
  return detail::h2_fma_host(a, b, c, false);
#endif
}
OPENMLA_HD uint32_t h2_add(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("add.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
#else
  return detail::h2_fma_host(a, 0x3C003C00u, b, false);  // a * 1 + b
#endif
}

// Per-half (16-bit lanes of a word) maxima: unsigned of three, signed of three, signed of two
// and 0 (VIMNMX3 / VIMNMX on the GPU).
#if !defined(__CUDA_ARCH__)
namespace detail {
template <typename F>
uint32_t per_half(uint32_t a, uint32_t b, F f) {
  return f(a & 0xFFFFu, b & 0xFFFFu) | (f(a >> 16, b >> 16) << 16);
}
inline uint32_t max_u16(uint32_t a, uint32_t b) { return a > b ? a : b; }
inline uint32_t max_s16(uint32_t a, uint32_t b) {
  return static_cast<int16_t>(a) > static_cast<int16_t>(b) ? a : b;
}
}  // namespace detail
#endif
OPENMLA_HD uint32_t max3_u16x2(uint32_t a, uint32_t b, uint32_t c) {
#if defined(__CUDA_ARCH__)
  return __vimax3_u16x2(a, b, c);
#else
  return detail::per_half(detail::per_half(a, b, detail::max_u16), c, detail::max_u16);
#endif
}
OPENMLA_HD uint32_t max3_s16x2(uint32_t a, uint32_t b, uint32_t c) {
#if defined(__CUDA_ARCH__)
  return __vimax3_s16x2(a, b, c);
#else
  return detail::per_half(detail::per_half(a, b, detail::max_s16), c, detail::max_s16);
#endif
}
OPENMLA_HD uint32_t max_s16x2_relu(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __vimax_s16x2_relu(a, b);
#else
  return detail::per_half(max3_s16x2(a, b, 0), 0, detail::max_u16);
#endif
}
// Largest |x| of 16 bf16 (8 words), as a float. Per half, the unsigned max is the largest
// negative's bits (sign set) where a negative is there, else the largest positive's; the signed
// max with 0 is the largest positive's (or 0); the larger of the two, sign cleared, is the largest
// |x|'s bits (|x| bits order as the floats do below the NaNs). The larger half ends up in both.
OPENMLA_HD float max_abs_bf16x16(const uint32_t (&w)[8]) {
  const uint32_t u = max3_u16x2(max3_u16x2(w[3], w[4], w[5]),
                                max3_u16x2(w[6], w[7], max3_u16x2(w[0], w[1], w[2])), 0);
  const uint32_t s = max_s16x2_relu(max3_s16x2(w[3], w[4], w[5]),
                                    max3_s16x2(w[6], w[7], max3_s16x2(w[0], w[1], w[2])));
  const uint32_t m = max3_u16x2(u & 0x7FFF7FFFu, s, 0);
  return u2f(max3_u16x2(m, byte_perm(m, 0, 0x1032), 0) << 16);
}
// |x| bits from here up take the float path (F(bits) would be inf or NaN).
constexpr uint32_t kFp4H2MaxBits = 0x7C00u;

OPENMLA_HD uint32_t h2_sub(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
#else
  return h2_add(a, b ^ 0x80008000u);  // a + (-b)
#endif
}

// The upper 16 bits of x in both halves: free on the GPU, where ptxas reads it as the consuming
// HFMA2/HADD2 operand's .H1_H1 selector.
OPENMLA_HD uint32_t upper_half_x2(uint32_t x) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("{.reg .b16 lo, hi; mov.b32 {lo, hi}, %1; mov.b32 %0, {hi, hi};}" : "=r"(d) : "r"(x));
  return d;
#else
  return (x >> 16) * 0x10001u;
#endif
}

// The binary search's f16x2 constants (each the same in both halves), from n_i = -F(h_i) * 2^11
// for the seven bounds (h as in the comment above): step 1 compares with n3, step 2 with
// n1 + c3 (n5 - n1), step 3 with base + c1 * step, base = n0 + c3 (n4 - n0) and step =
// (n2 - n0) + c3 ((n6 - n4) - (n2 - n0)).
struct Fp4H2Bounds {
  uint32_t n3, n1, n51, n0, n40, n20, n6420;
};
OPENMLA_HD Fp4H2Bounds fp4_h2_bounds(float scale) {
  constexpr float kT[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  uint32_t n[7];
  OPENMLA_UNROLL
  for (int i = 0; i < 7; ++i) {
    // -P 2^88 = -t s 2^88 is exact, and its upper 16 bits are -F(h) 2^11's f16 bits: 2^88 adds
    // 88 << 7 to the bf16 bits, which is 11 << 10 to the f16 exponent (F(h) is a normal f16 and
    // stays below 2^15). Minus 1 for the q >= t midpoints.
    const uint32_t pred = i & 1;
    n[i] = upper_half_x2(f2u(mul_rn(kT[i] * -0x1p88f, scale)) - (pred << 16));
  }
  Fp4H2Bounds b;
  b.n3 = n[3], b.n1 = n[1], b.n51 = h2_sub(n[5], n[1]);
  b.n0 = n[0], b.n40 = h2_sub(n[4], n[0]), b.n20 = h2_sub(n[2], n[0]);
  b.n6420 = h2_sub(h2_sub(n[6], n[4]), b.n20);
  return b;
}
// e2m1 codes (0..7, no sign) of the two elements in x as f16x2, kz = ±2^11 with x's signs.
OPENMLA_HD uint32_t e2m1_codes_h2(uint32_t x, uint32_t kz, const Fp4H2Bounds& b) {
  const uint32_t c3 = h2_fma_sat(x, kz, b.n3);
  const uint32_t c1 = h2_fma_sat(x, kz, h2_fma(c3, b.n51, b.n1));
  const uint32_t base = h2_fma(c3, b.n40, b.n0), step = h2_fma(c3, b.n6420, b.n20);
  const uint32_t c0 = h2_fma_sat(x, kz, h2_fma(c1, step, base));
  return h2_fma(c3, 0x44004400u, h2_fma(c1, 0x40004000u, c0));  // f16 4, 2
}
// (x & 0x80008000) | 0x68006800: ±2^11 with x's signs. One LOP3 with the constant in a register
// (nvcc otherwise emits two, one per immediate).
OPENMLA_HD uint32_t kz_of(uint32_t x) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("lop3.b32 %0, %1, 0x80008000, %2, 0xEA;" : "=r"(d) : "r"(x), "r"(0x68006800u));
  return d;
#else
  return (x & 0x80008000u) | 0x68006800u;
#endif
}
// 1024 + n_lo + 16 n_hi per half, n = e2m1 code | sign << 3 of the elements in x (low halves)
// and y (high nibbles); all bits < 0x7C00.
OPENMLA_HD uint32_t fp4_byte_pairs_h2(uint32_t x, uint32_t y, const Fp4H2Bounds& b) {
  const uint32_t kz_x = kz_of(x), kz_y = kz_of(y);  // ±2^11
  // kz * -2^-9 = 8 * sign - 4 (and 16 times that for y): 1092 + (-4) + 16 * (-4) = 1024.
  const uint32_t signs =  // f16 -2^-5, -2^-9, 1092
      h2_fma(kz_y, 0xA800A800u, h2_fma(kz_x, 0x98009800u, 0x64446444u));
  const uint32_t nx = h2_add(e2m1_codes_h2(x, kz_x, b), signs);
  return h2_fma(e2m1_codes_h2(y, kz_y, b), 0x4C004C00u, nx);  // f16 16
}
// Eight fp4 elements (one data word) from four bf16x2 words, all |x| bits < kFp4H2MaxBits.
OPENMLA_HD uint32_t fp4_word_from_bf16(const uint32_t* w, const Fp4H2Bounds& b) {
  // Elements (4p, 4p + 2) and (4p + 1, 4p + 3): each result's halves are output bytes 2p, 2p + 1.
  const uint32_t r0 =
      fp4_byte_pairs_h2(byte_perm(w[0], w[1], 0x5410), byte_perm(w[0], w[1], 0x7632), b);
  const uint32_t r1 =
      fp4_byte_pairs_h2(byte_perm(w[2], w[3], 0x5410), byte_perm(w[2], w[3], 0x7632), b);
  return byte_perm(r0, r1, 0x6420);
}

// --- group scales ----------------------------------------------------------------------------
constexpr float kMinScale = 1e-4f;

// Exponent e of the power-of-two scale 2^e for e4m3 elements (codec::pow2_scale_exponent).
OPENMLA_HD int pow2_scale_exponent(float amax) {
  float scale = div_rn(amax, 448.0f);
  if (!(scale >= kMinScale)) scale = kMinScale;
  const uint32_t u = f2u(scale);
  if (u >= 0x7F800000u) return 127;
  // scale is normal (>= 1e-4): ceil(log2) is the unbiased exponent, +1 unless a power of two.
  const int biased = static_cast<int>(u >> 23);
  return (u & 0x7FFFFFu) == 0 ? biased - 127 : biased - 126;
}
// 2^e as a float, e in [-127, 127].
OPENMLA_HD float exp2_int(int e) {
  return u2f(e >= -126 ? static_cast<uint32_t>(e + 127) << 23 : 0x00400000u);
}
OPENMLA_HD uint32_t e8m0_from_exponent(int e) {
  return static_cast<uint32_t>((e < -127 ? -127 : (e > 127 ? 127 : e)) + 127);
}
// fp4's scale code (codec::fp4_scale_e4m3).
OPENMLA_HD uint32_t fp4_scale_code(float amax) {
  float scale = div_rn(amax, 6.0f);
  if (!(scale >= kMinScale)) scale = kMinScale;
  const uint32_t code = float_to_e4m3(scale);
  return code < 1u ? 1u : code;
}
// fp4_scale_code for a bf16 amax below 2^121 (the bf16 path's) in three instructions: e4m3(q)
// with q = RN(amax * y), y = RN(1/6) = (1 + 2^-25) / 6, instead of the division and its floor.
// q has amax / 6's code: amax = M 2^k with M < 2^8, so amax / 6 = (M / 3) 2^(k-1) is either a
// dyadic of <= 7 significant bits (3 divides M), which q rounds back to exactly (the excess,
// amax / 6 * 2^-25, is below half its ulp), or at least 2^(k-1) / 3 away from every e4m3
// rounding midpoint near it (those are multiples of 2^(k-1)), far more than q's error; the amax
// small enough for that to fail (bf16 subnormals) get code 1 either way. e4m3 is monotonic, so
// the floor and max(code, 1) are e4m3(max(q, 2^-9)): code 1 is 2^-9, and every quotient below
// 1e-4 gets code 0. Checked against fp4_scale_code for every amax it takes by tests/cpu
// (Fp4ScaleCodeOfBf16Amax).
OPENMLA_HD uint32_t fp4_scale_code_bf16(float amax) {
  constexpr float kSixth = 0.16666667163372039795f;  // RN(1/6)
  // The pair's high byte is e4m3(0) = 0; the code is < 0x7F (satfinite).
  return float2_to_e4m3x2(max_f(mul_rn(amax, kSixth), 0x1p-9f), 0.0f);
}
// An e4m3 code that is not NaN (< 0x7F or 0x80..0xFE) to float, without the NaN pin.
OPENMLA_HD float e4m3_to_float_finite(uint32_t b) {
#if defined(__CUDA_ARCH__)
  const __half2_raw h =  // the pair form takes b as it is (the high byte is ignored)
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(b), __NV_E4M3);
  return __half2float(__ushort_as_half(h.x));
#else
  return e4m3_to_float_sw(b);
#endif
}

// --- vector loads and stores of any alignment ------------------------------------------------
// N bytes (a multiple of 4) at p, as N/4 little-endian words, with the widest accesses p's
// alignment allows (a warp's lanes share it, so the branch is uniform in practice).
template <int N>
OPENMLA_HD void load_bytes(const uint8_t* p, uint32_t (&w)[N / 4]) {
  static_assert(N % 4 == 0, "whole words");
#if defined(__CUDA_ARCH__)
  const uint32_t a = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(p));
  if constexpr (N % 16 == 0) {
    if ((a & 15u) == 0) {
      OPENMLA_UNROLL
      for (int k = 0; k < N / 16; ++k) {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(p) + k);
        w[4 * k] = v.x, w[4 * k + 1] = v.y, w[4 * k + 2] = v.z, w[4 * k + 3] = v.w;
      }
      return;
    }
  }
  if constexpr (N % 8 == 0) {
    if ((a & 7u) == 0) {
      OPENMLA_UNROLL
      for (int k = 0; k < N / 8; ++k) {
        const uint2 v = __ldg(reinterpret_cast<const uint2*>(p) + k);
        w[2 * k] = v.x, w[2 * k + 1] = v.y;
      }
      return;
    }
  }
  if ((a & 3u) == 0) {
    OPENMLA_UNROLL
    for (int k = 0; k < N / 4; ++k) w[k] = __ldg(reinterpret_cast<const unsigned int*>(p) + k);
  } else if ((a & 1u) == 0) {
    OPENMLA_UNROLL
    for (int k = 0; k < N / 4; ++k) {
      const unsigned short* q = reinterpret_cast<const unsigned short*>(p) + 2 * k;
      w[k] = static_cast<uint32_t>(__ldg(q)) | (static_cast<uint32_t>(__ldg(q + 1)) << 16);
    }
  } else {
    OPENMLA_UNROLL
    for (int k = 0; k < N / 4; ++k) {
      const unsigned char* q = p + 4 * k;
      w[k] = static_cast<uint32_t>(__ldg(q)) | (static_cast<uint32_t>(__ldg(q + 1)) << 8) |
             (static_cast<uint32_t>(__ldg(q + 2)) << 16) |
             (static_cast<uint32_t>(__ldg(q + 3)) << 24);
    }
  }
#else
  std::memcpy(w, p, N);
#endif
}

template <int N>
OPENMLA_HD void store_bytes(uint8_t* p, const uint32_t (&w)[N / 4]) {
  static_assert(N % 4 == 0, "whole words");
#if defined(__CUDA_ARCH__)
  const uint32_t a = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(p));
  if constexpr (N % 16 == 0) {
    if ((a & 15u) == 0) {
      OPENMLA_UNROLL
      for (int k = 0; k < N / 16; ++k) {
        reinterpret_cast<uint4*>(p)[k] =
            make_uint4(w[4 * k], w[4 * k + 1], w[4 * k + 2], w[4 * k + 3]);
      }
      return;
    }
  }
  if constexpr (N % 8 == 0) {
    if ((a & 7u) == 0) {
      OPENMLA_UNROLL
      for (int k = 0; k < N / 8; ++k)
        reinterpret_cast<uint2*>(p)[k] = make_uint2(w[2 * k], w[2 * k + 1]);
      return;
    }
  }
  if ((a & 3u) == 0) {
    OPENMLA_UNROLL
    for (int k = 0; k < N / 4; ++k) reinterpret_cast<uint32_t*>(p)[k] = w[k];
  } else if ((a & 1u) == 0) {
    OPENMLA_UNROLL
    for (int k = 0; k < N / 4; ++k) {
      reinterpret_cast<uint16_t*>(p)[2 * k] = static_cast<uint16_t>(w[k]);
      reinterpret_cast<uint16_t*>(p)[2 * k + 1] = static_cast<uint16_t>(w[k] >> 16);
    }
  } else {
    OPENMLA_UNROLL
    for (int k = 0; k < N; ++k) p[k] = static_cast<uint8_t>(w[k / 4] >> (8 * (k % 4)));
  }
#else
  std::memcpy(p, w, N);
#endif
}

OPENMLA_HD float load_f32(const uint8_t* p) {  // 4-byte aligned (check_kv_layout)
#if defined(__CUDA_ARCH__)
  return __ldg(reinterpret_cast<const float*>(p));
#else
  float x;
  std::memcpy(&x, p, sizeof(x));
  return x;
#endif
}
OPENMLA_HD uint32_t load_u8(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return __ldg(p);
#else
  return *p;
#endif
}

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
