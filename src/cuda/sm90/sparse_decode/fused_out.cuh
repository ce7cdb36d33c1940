// The fused V4 attention's output steps (params.h SparseFusedParams; docs/semantics.md): the
// inverse RoPE of the last 64 of the 512 output dims, then the cast to e4m3 with one UE8M0
// power-of-two scale per 32 dims, in permute_wv_proj's layout: head h = g * group_size + hg of
// output group g puts its dims 32 c .. 32 c + 31 at chunk c * group_size + hg of the group's row,
// whose scale is byte (chunk % 4) of out_sf[s, g, chunk / 4]. Used by the kernel's epilogue
// (fused_store_rows: a thread holds 8 of a chunk's 32 values, its quad the rest) and by the
// split-KV combine (cuda/common/combine.cu: the same 8 values a lane, a quad a chunk).
#pragma once

#include <cuda_fp8.h>

#include <cstdint>
#include <cute/tensor.hpp>

#include "cuda/sm90/sparse_decode/params.h"

namespace openmla::cuda::sm90 {
namespace sparse_decode_detail {

constexpr int kFusedRopeDim0 = 512 - 64;  // the first rotated output dim

// The exponent e of a chunk's scale 2^e: ceil(log2(max(amax, 1e-4) / 448)), from the quotient's
// bits (exact: the CPU backend's scale_exponent).
__device__ __forceinline__ int fused_scale_exponent(float amax) {
  const float sf = fmaxf(amax, 1e-4f) / 448.f;
  return static_cast<int>((__float_as_uint(sf) - 1u) >> 23) + 1 - 127;
}

// Two values as e4m3 (x in the low byte), after the scale 2^-e; + 0 makes a -0 a +0.
__device__ __forceinline__ uint16_t fused_e4m3x2(float x, float y, float inv) {
  const float2 v = make_float2(__fadd_rn(x * inv, 0.f), __fadd_rn(y * inv, 0.f));
  return static_cast<uint16_t>(__nv_cvt_float2_to_fp8x2(v, __NV_SATFINITE, __NV_E4M3));
}

// Output dims (d, d + 1), d even and >= kFusedRopeDim0, turned back by their pair's cos c and
// sin s (the inverse rotation: -s).
__device__ __forceinline__ void fused_unrotate(float c, float s, float& x0, float& x1) {
  const float a = x0, b = x1, si = -s;
  x0 = fmaf(a, c, -(b * si));
  x1 = fmaf(a, si, b * c);
}

// Where head h's 32-dim chunk c of token `token` goes: its bytes and its scale byte.
struct FusedChunk {
  uint8_t* bytes;
  uint8_t* scale;
};
__device__ __forceinline__ FusedChunk fused_chunk(const SparseFusedParams& f, int token, int h,
                                                  int c) {
  const int g = h / f.group_size, hg = h - g * f.group_size;
  const int chunk = c * f.group_size + hg;
  FusedChunk out;
  out.bytes = f.out_fp8 + token * f.out_stride_s + g * f.out_stride_g + chunk * 32;
  out.scale = reinterpret_cast<uint8_t*>(f.out_sf + token * f.sf_stride_s + g * f.sf_stride_g +
                                         (chunk >> 2) * f.sf_stride_k) +
              (chunk & 3);
  return out;
}

// The kernel's epilogue: warpgroup wg's half of d_v (dims 256 wg ..) of its two rows, O already
// normalised (and the sink applied). O(r, c) is column cO_rc(r, c): wgmma's accumulator keeps
// columns 8 j + 2 (lane % 4) + {0, 1} at c = 2 j + {0, 1}, so c / 8 is the 32-dim chunk and a
// chunk's 32 values sit in the 4 lanes of a quad. Every lane of the warp calls this.
// cs: the token's cos/sin row in shared memory (fused_q.cuh; WG0 wrote it before the loop);
// bad: its position is outside the cache (0x7F bytes, 0xFF scales).
template <class A_O, class A_cO_rc, class A_Row>
__device__ __forceinline__ void fused_store_rows(const SparseDecodeParams& p, int wg, int lane,
                                                 A_O& O, A_cO_rc& cO_rc, const A_Row (&rows)[2],
                                                 const float* cs, bool bad) {
  using namespace cute;
  const SparseFusedParams& f = p.fused;
  constexpr int kCols = decltype(size<1>(O))::value;  // 64: 8 chunks of 8
  static_assert(kCols == 64, "a warpgroup's 256 dims a row over a quad");
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const auto& w = rows[r];
    if (wg == 1) {  // the RoPE dims 448 - 511 are WG1's chunks 6 and 7
#pragma unroll
      for (int c = 48; c < 64; c += 2) {
        const int i = (256 + get<1>(cO_rc(r, c)) - kFusedRopeDim0) >> 1;
        fused_unrotate(cs[i], cs[32 + i], O(r, c), O(r, c + 1));
      }
    }
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      float amax = 0.f;
#pragma unroll
      for (int c = 8 * q; c < 8 * q + 8; ++c) amax = fmaxf(amax, fabsf(O(r, c)));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
      if (!w.ok) continue;
      const int e = fused_scale_exponent(amax);
      const float inv = ldexpf(1.f, -e);
      const FusedChunk dst = fused_chunk(f, w.i, w.h, 8 * wg + get<1>(cO_rc(r, 8 * q)) / 32);
#pragma unroll
      for (int c = 8 * q; c < 8 * q + 8; c += 2) {
        const int col = get<1>(cO_rc(r, c)) % 32;
        *reinterpret_cast<uint16_t*>(dst.bytes + col) =
            bad ? uint16_t{0x7F7F} : fused_e4m3x2(O(r, c), O(r, c + 1), inv);
      }
      if (lane % 4 == 0) *dst.scale = bad ? uint8_t{0xFF} : static_cast<uint8_t>(e + 127);
    }
  }
}

}  // namespace sparse_decode_detail
}  // namespace openmla::cuda::sm90
