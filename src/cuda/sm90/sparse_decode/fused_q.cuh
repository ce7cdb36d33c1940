// The fused V4 attention's Q steps (params.h SparseFusedParams; docs/semantics.md): the RMS norm
// of each (token, head) row and the RoPE of its last 64 dims, applied to Q in shared memory once
// load_q has put it there, before the first QK^T. The rows are rounded to bf16 once more: the
// RoPE dims after the rotation (as the definition does), then every dim after the norm factor
// (the definition keeps q * r in fp32; the bf16 rounding is the kernel's only departure, within
// the bf16 rounding P already takes).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/sm90/attention/primitives.cuh"
#include "cuda/sm90/sparse_decode/params.h"

namespace openmla::cuda::sm90 {
namespace sparse_decode_detail {

// The bf16 pair of a 32-bit word as floats (low half first).
__device__ __forceinline__ float2 bf16x2_floats(uint32_t w) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xFFFF0000u));
}

__device__ __forceinline__ uint32_t bf16x2_bits(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Token `token`'s cos/sin value t (t < 64: cos in [0, 32), sin after), loaded by WG0's threads
// t < 64 before Q's loads so both are in flight together; NaN (and `bad`) for a position
// outside the cache, which is then never read.
__device__ __forceinline__ float fused_cos_sin_value(const SparseFusedParams& f, int token, int t,
                                                     bool& bad) {
  const int pos = __ldg(f.positions + static_cast<int64_t>(token) * f.positions_stride);
  bad = pos < 0 || pos >= f.num_positions;
  if (bad) return __int_as_float(0x7fffffff);
  return __ldg(f.cos_sin + static_cast<int64_t>(pos) * f.cos_sin_stride0 + t * f.cos_sin_stride1);
}

// WG0's 128 threads, two a row (row t / 2; half t % 2 holds pieces 4 half .. 4 half + 3, so half
// 1 holds the RoPE piece 7), after every thread's load_q stores and smem.fused_cs are visible to
// all of WG0. The rows are the heads of one query token (sparse mode: one token a problem).
template <class Traits>
__device__ __forceinline__ void fused_q_rows(const SparseDecodeParams& p,
                                             typename Traits::SharedStorage& smem, int t) {
  static_assert(Traits::kHeadDimQK == 512 && Traits::kNumPieces == 8,
                "the fused op's kernel is built for d_qk 512 (8 pieces of 64 dims)");
  using attention::swizzled_offset;
  const SparseFusedParams& f = p.fused;
  const int row = t >> 1, half = t & 1;
  char* base = reinterpret_cast<char*>(smem.q) + 4 * half * Traits::kPieceBytes;
  float r = 1.f;
  if (f.q_norm) {
    float ss = 0.f;
#pragma unroll
    for (int pc = 0; pc < 4; ++pc) {
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const uint4 v = *reinterpret_cast<const uint4*>(base + pc * Traits::kPieceBytes +
                                                        swizzled_offset(row, c));
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 x = bf16x2_floats(w[e]);
          ss = fmaf(x.x, x.x, fmaf(x.y, x.y, ss));
        }
      }
    }
    ss += __shfl_xor_sync(0xffffffffu, ss, 1);
    r = 1.f / sqrtf(ss / static_cast<float>(Traits::kHeadDimQK) + f.eps);
  }
  // The RoPE piece (half 1's last): pair i of the 64 dims turns by cos_sin[pos][i], [32 + i].
  const float* cs = smem.fused_cs;
  if (!f.q_norm && half == 0) return;  // nothing to change in pieces 0 - 3
#pragma unroll
  for (int pc = 0; pc < 4; ++pc) {
    const bool rope = half == 1 && pc == 3;
    if (!f.q_norm && !rope) continue;
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      uint4* at = reinterpret_cast<uint4*>(base + pc * Traits::kPieceBytes +
                                           swizzled_offset(row, c));
      uint4 v = *at;
      uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float2 x = bf16x2_floats(w[e]);
        if (rope) {
          const int i = 4 * c + e;  // the pair of dims 8 c + 2 e, 8 c + 2 e + 1 of the piece
          const float co = cs[i], si = cs[32 + i];
          const float x0 = fmaf(x.x, co, -(x.y * si)), x1 = fmaf(x.x, si, x.y * co);
          x = bf16x2_floats(bf16x2_bits(x0, x1));  // the rotated dims rounded to bf16
        }
        w[e] = bf16x2_bits(x.x * r, x.y * r);
      }
      *at = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}

}  // namespace sparse_decode_detail
}  // namespace openmla::cuda::sm90
