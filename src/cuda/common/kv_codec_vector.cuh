// The KV-cache codec's fp4 pair conversion, group scales and vector loads and stores of any
// alignment (kv_codec.cuh; the element conversions: kv_codec_scalar.cuh).
#pragma once

#include "cuda/common/kv_codec_scalar.cuh"

namespace openmla::cuda::kvcodec {

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

}  // namespace openmla::cuda::kvcodec
