// The 4 x 4 transpose of 32-bit words inside a quad of lanes (lanes 4 i .. 4 i + 3), used where
// an accumulator row's columns sit 2 a lane and 16-byte stores want 8 contiguous bf16/fp16 of
// one lane: in the decode kernel's output (attention/fragments.cuh) and the combine
// (combine.cu).
#pragma once

#include <cstdint>

namespace openmla::cuda {

// a[k] is lane q's word of n-block k (q = lane % 4: its 2 columns 2 q, 2 q + 1 of the block's 8);
// returns the 4 words of n-block q, columns 0-7 in order. 4 shuffles; every lane of the warp
// must call it.
__device__ __forceinline__ uint4 quad_transpose(const uint32_t (&a)[4], int q) {
  const bool lo = q & 1, hi = q & 2;
  // M[lane][k] = lane's a[k]; lane q wants column q of M. Across lanes q ^ 2: keep the k with
  // bit 1 equal to q's, send the others.
  const uint32_t r0 = __shfl_xor_sync(0xffffffffu, hi ? a[0] : a[2], 2);
  const uint32_t r1 = __shfl_xor_sync(0xffffffffu, hi ? a[1] : a[3], 2);
  const uint32_t s0 = hi ? a[2] : a[0], s1 = hi ? a[3] : a[1];  // M[q][kb], M[q][kb + 1]
  // (r0, r1 = M[q ^ 2][kb], M[q ^ 2][kb + 1], kb = q & 2.) Across lanes q ^ 1: keep k = q.
  const uint32_t u0 = __shfl_xor_sync(0xffffffffu, lo ? s0 : s1, 1);  // M[q ^ 1][q]
  const uint32_t u1 = __shfl_xor_sync(0xffffffffu, lo ? r0 : r1, 1);  // M[q ^ 3][q]
  const uint32_t self = lo ? s1 : s0, other = lo ? r1 : r0;         // M[q][q], M[q ^ 2][q]
  // Word w of the 16 bytes is M[w][q] = V[q ^ w] with V = {self, u0, other, u1}.
  const uint32_t a0 = hi ? other : self, a1 = hi ? u1 : u0;  // V[hi * 2], V[hi * 2 + 1]
  const uint32_t b0 = hi ? self : other, b1 = hi ? u0 : u1;  // V[(1 - hi) * 2 + {0, 1}]
  return make_uint4(lo ? a1 : a0, lo ? a0 : a1, lo ? b1 : b0, lo ? b0 : b1);
}

}  // namespace openmla::cuda
