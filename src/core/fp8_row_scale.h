// The power-of-two scale of a row quantised to e4m3 by sparse prefill's FP8 tensor-core path
// (docs/semantics.md): the smallest e with amax <= 448 * 2^e, clamped to [-64, 64] (0 for a zero
// row), so x / 2^e is exact and fits e4m3. One definition for the CPU backend and the kernels
// (host and device: plain bit arithmetic on the float's encoding).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define OPENMLA_FP8_HD __host__ __device__ __forceinline__
#else
#define OPENMLA_FP8_HD inline
#endif

namespace openmla::core {

constexpr int kFp8RowExponentMin = -64;
constexpr int kFp8RowExponentMax = 64;

// amax: a row's largest |value| (>= 0; NaN counts as 0, +inf as the largest float).
OPENMLA_FP8_HD int fp8_row_exponent(float amax) {
  uint32_t bits;
#if defined(__CUDA_ARCH__)
  bits = __float_as_uint(amax);
#else
  std::memcpy(&bits, &amax, sizeof bits);
#endif
  bits &= 0x7FFFFFFFu;
  if (bits == 0 || bits > 0x7F800000u) return 0;  // zero or NaN
  const int biased = static_cast<int>(bits >> 23);
  // Subnormals (biased 0) are below 2^-126: far under the clamp.
  if (biased == 0) return kFp8RowExponentMin;
  // amax = m 2^E, m in [1, 2); 448 = 1.75 2^8: amax <= 448 2^e  <=>  e >= E - 8 (m <= 1.75),
  // else e >= E - 7.
  int e = biased - 127 - 8 + ((bits & 0x7FFFFFu) > 0x600000u ? 1 : 0);
  if (e < kFp8RowExponentMin) e = kFp8RowExponentMin;
  if (e > kFp8RowExponentMax) e = kFp8RowExponentMax;
  return e;
}

// 2^e as a float, exactly, for e in [-126, 127].
OPENMLA_FP8_HD float fp8_pow2(int e) {
  const uint32_t bits = static_cast<uint32_t>(127 + e) << 23;
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

}  // namespace openmla::core
