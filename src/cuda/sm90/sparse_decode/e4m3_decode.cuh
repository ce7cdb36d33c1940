// The fp8 fill's fast e4m3 -> bf16 decode (fill_common.cuh), in a header of its own so that
// bench/bench_decode_rate.cu times the very code the kernels run. No CUTLASS, no kernel state.
#pragma once

#include <cstdint>

namespace openmla::cuda::sm90 {
namespace sparse_decode_detail {

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

// 16 e4m3 codes times one scale, as 8 bf16 pairs. Fast path: a code's sign, exponent and
// mantissa moved into bf16 position by integer ops is the code's value times 2^-120 (the two
// exponent biases differ by 120; e4m3 subnormals land on bf16 subnormals), so one bf16x2
// multiply by scale · 2^120 gives the product, exactly for the power-of-two scales every writer
// of these formats stores (e8m0, and fp8_v32's rounded-up float scales). NaN codes (0x7F, 0xFF,
// which no quantiser writes for finite data) come out finite here. Scales of 2^7 or more, NaN
// scales and non-finite products take the codec's float path instead (fill_common.cuh
// e4m3x16_to_bf16). The fast path alone: `mul` is bf16x2 of scale · 2^120 (< 2^127).
__device__ __forceinline__ void e4m3x16_to_bf16_fast(const uint32_t (&w)[4], uint32_t mul,
                                                     uint32_t (&out)[8]) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    // bytes 0, 1 (then 2, 3) at bits 8-15 and 24-31: sign in place, the rest 4 bits too high
    const uint32_t x0 = prmt(w[k], 0u, 0x1404u), x1 = prmt(w[k], 0u, 0x3424u);
    const uint32_t b0 = (x0 & 0x80008000u) | ((x0 >> 4) & 0x07F007F0u);
    const uint32_t b1 = (x1 & 0x80008000u) | ((x1 >> 4) & 0x07F007F0u);
    out[2 * k] = mul_bf16x2(b0, mul);
    out[2 * k + 1] = mul_bf16x2(b1, mul);
  }
}

}  // namespace sparse_decode_detail
}  // namespace openmla::cuda::sm90
