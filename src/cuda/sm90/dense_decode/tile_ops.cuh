// SM90 dense MLA decode: the compute warpgroups' operations on one tile in registers and
// shared memory (masks, row reductions, online softmax, P for the other warpgroup, Q and V rows).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include <cute/tensor.hpp>

#include "cuda/sm90/dense_decode/params.h"

namespace openmla::cuda::sm90::dense_decode_detail {

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

template <typename Element>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (cute::is_same_v<Element, cute::bfloat16_t>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// Byte offset of (row, 16-byte chunk) inside an 8 KB piece of 64 rows x 128 B, 128 B swizzle
// (the TMA/GMMA pattern: chunk index XOR row mod 8; pieces start on 1024 B boundaries).
__device__ __forceinline__ uint32_t swizzled_offset(int row, int chunk) {
  return static_cast<uint32_t>(row * 128 + ((chunk ^ (row & 7)) << 4));
}

// The wgmma accumulator ((2,2,N/8),M,N) seen as (rows, cols): ((2,M),(2,N/8,N)).
template <class Layout>
__device__ __forceinline__ auto acc_rowcol(Layout const& l) {
  using namespace cute;
  return make_layout(make_layout(get<0, 1>(l), get<1>(l)),
                     make_layout(get<0, 0>(l), get<0, 2>(l), get<2>(l)));
}

// A descriptor fragment moved by `bytes` (another stage). The sum goes through an empty asm so
// the compiler cannot hoist the 36 per-k-step descriptors of the loop into live registers
// (it did: 72+ registers, spills); each step's descriptor is then one add at its use.
template <class Frag>
__device__ __forceinline__ auto at_offset(Frag const& frag, uint32_t bytes) {
  cute::GmmaDescriptor desc = frag.data().desc_;
  uint32_t lo = desc.reg32_[0] + (bytes >> 4);
  asm volatile("" : "+r"(lo));
  desc.reg32_[0] = lo;
  return cute::make_tensor(cute::GMMA::DescriptorIterator{desc}, frag.layout());
}

// Keys outside [lower, limit[i]) of row i (absolute key indices) get -inf.
template <class TS, class TC>
__device__ __forceinline__ void mask_tile(TS& S, TC const& cS, int t0, int lower,
                                          const int (&limit)[2]) {
  using namespace cute;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int j = 0; j < size<1>(S); ++j) {
      const int key = t0 + get<1>(cS(i, j));
      if (key >= limit[i] || key < lower) S(i, j) = -INFINITY;
    }
  }
}

// Zero V rows [valid, 64) of the 8 V pieces of a tile, so keys past the piece's end (unused
// cache slots may hold anything, NaN too, or were never loaded) add 0 * 0 to P V. A row is
// 128 contiguous bytes of its piece whatever the swizzle.
template <class Traits>
__device__ __forceinline__ void zero_v_rows(typename Traits::Element* tile, int valid,
                                            int thread) {
  char* base = reinterpret_cast<char*>(tile);
  const int chunks = (Traits::kBlockN - valid) * Traits::kNumVPieces * 8;  // 16 B chunks
  for (int idx = thread; idx < chunks; idx += 128) {
    const int row = valid + idx / (Traits::kNumVPieces * 8);
    const int k = idx % (Traits::kNumVPieces * 8);
    *reinterpret_cast<uint4*>(base + (k / 8) * Traits::kPieceBytes + row * 128 + (k % 8) * 16) =
        make_uint4(0u, 0u, 0u, 0u);
  }
}

// One level of a reduction tree: v[j] op= v[j + W] for j < W, then the next level.
template <bool kMax, int W>
__device__ __forceinline__ void reduce_levels(float* v) {
#pragma unroll
  for (int j = 0; j < W; ++j) v[j] = kMax ? fmaxf(v[j], v[j + W]) : v[j] + v[j + W];
  if constexpr (W > 1) reduce_levels<kMax, W / 2>(v);
}

// Max (or sum) of row i of this thread's accumulator values, as a tree (a dependent chain put
// 16 operations on the path the other warpgroup waits on). The levels are template recursion:
// `for (w = n / 2; w > 0; w /= 2)` was left rolled at n = 16, with v[] in local memory.
template <bool kMax, class TS>
__device__ __forceinline__ float row_reduce(TS const& S, int i) {
  constexpr int n = cute::size<1>(TS{}.layout());
  float v[n];
#pragma unroll
  for (int j = 0; j < n; ++j) v[j] = S(i, j);
  reduce_levels<kMax, n / 2>(v);
  return v[0];
}

template <class TO>
__device__ __forceinline__ void rescale_rows(TO& O, const float (&scale)[2]) {
  using namespace cute;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int j = 0; j < size<1>(O); ++j) O(i, j) *= scale[i];
  }
}

// The running max m as an exp2 exponent offset: rows that have seen no key yet (m = -inf) use 0
// so exp2(-inf - 0) = 0 instead of NaN.
__device__ __forceinline__ float max_base(float m, float scale_log2) {
  return m == -INFINITY ? 0.f : m * scale_log2;
}

// P = exp(S - m) in place (S's accumulator order) and its row sums; P packed into the A
// fragment of P V (the accumulator's register order is the A fragment's: 2 values a word).
template <class Element, class TS, class TAcc, class TP>
__device__ __forceinline__ void softmax_to_p(TS& S, TAcc const& tSrS, const float (&base)[2],
                                             float sl2, float (&row_sum)[2], TP& tOrP) {
  using namespace cute;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int j = 0; j < size<1>(S); ++j) S(i, j) = exp2_approx(S(i, j) * sl2 - base[i]);
    row_sum[i] = row_reduce<false>(S, i);
  }
  // The accumulator's flat order (tSrS, compact) is the fragment's; pack pairs of it.
  static_assert(decltype(size(tSrS))::value == 2 * decltype(size(recast<uint32_t>(tOrP)))::value);
  Tensor P32 = recast<uint32_t>(tOrP);
#pragma unroll
  for (int k = 0; k < size(P32); ++k) P32(k) = pack2<Element>(tSrS(2 * k), tSrS(2 * k + 1));
}

// P (or P times a per-row factor) for the other warpgroup's shared-memory PV: a 64 x 64 K-major
// tile with the 128 B swizzle (the TMA/GMMA pattern, swizzled_offset). Thread t of the
// warpgroup holds rows 16 (t / 32) + (t % 32) / 4 + 8 i and keys 8 g + 2 (t % 4) + {0, 1} of the
// m64n64 accumulator, S(i, 2 g + e) (acc_rowcol); it writes each pair of adjacent keys as a
// 4-byte word. A warp's 32 words of one (i, g) fall in 8 rows x 16 B, 8 distinct chunks after
// the swizzle: no bank conflicts. The thread index is opaque, else the 16 addresses are hoisted
// out of the request loop into registers the warpgroup does not have (a spill).
template <class Element, bool kScaled, class TS>
__device__ __forceinline__ void store_p(void* tile, TS const& S, int t, const float (&scale)[2]) {
  asm volatile("" : "+r"(t));
  const int lane = t % 32, row0 = 16 * (t / 32) + lane / 4, row_swizzle = lane / 4;
  char* base = static_cast<char*>(tile) + row0 * 128 + (lane % 4) * 4;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int g = 0; g < 8; ++g) {
      const float lo = kScaled ? S(i, 2 * g) * scale[i] : S(i, 2 * g);
      const float hi = kScaled ? S(i, 2 * g + 1) * scale[i] : S(i, 2 * g + 1);
      *reinterpret_cast<uint32_t*>(base + i * 8 * 128 + ((g ^ row_swizzle) << 4)) =
          pack2<Element>(lo, hi);
    }
  }
}

// Q rows of (request, kv head, m_block) into smem; rows past the request's rows are zero.
template <class Traits>
__device__ __forceinline__ void load_q(const DenseDecodeParams& p, typename Traits::Element* sQ,
                                       int r, int kv_head, int m_block, int thread) {
  constexpr int kChunksPerRow = Traits::kHeadDimQK / 8;  // 16 B chunks
  constexpr int kChunks = Traits::kBlockM * kChunksPerRow;
  static_assert(kChunks % Traits::kNumMmaThreads == 0);
  const char* q = static_cast<const char*>(p.q);
  char* base = reinterpret_cast<char*>(sQ);
  // Opaque to the compiler: else it hoists all 18 chunks' addresses out of the request loop
  // into registers the MMA warpgroups need.
  asm volatile("" : "+r"(thread));
  uint4 v[kChunks / Traits::kNumMmaThreads];
#pragma unroll
  for (int it = 0; it < kChunks / Traits::kNumMmaThreads; ++it) {
    const int idx = it * Traits::kNumMmaThreads + thread;
    const int row = idx / kChunksPerRow, ch = idx % kChunksPerRow;
    const int grow = m_block * Traits::kBlockM + row;
    v[it] = make_uint4(0u, 0u, 0u, 0u);
    if (grow < p.rows) {
      const int s = grow / p.group, h = kv_head * p.group + grow % p.group;
      const int64_t off = r * p.q_stride_b + s * p.q_stride_s + h * p.q_stride_h + ch * 8;
      v[it] = __ldg(reinterpret_cast<const uint4*>(q + off * 2));
    }
  }
#pragma unroll
  for (int it = 0; it < kChunks / Traits::kNumMmaThreads; ++it) {
    const int idx = it * Traits::kNumMmaThreads + thread;
    const int row = idx / kChunksPerRow, ch = idx % kChunksPerRow;
    *reinterpret_cast<uint4*>(base + (ch / 8) * (Traits::kQPieceElems * 2) +
                              swizzled_offset(row, ch % 8)) =
        v[it];
  }
}

}  // namespace openmla::cuda::sm90::dense_decode_detail
