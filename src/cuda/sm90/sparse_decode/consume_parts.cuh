// The compute warpgroups' shared pieces (consume.cuh): named barriers, Q's load, the stage and
// slot barriers' waits and releases, where P crosses between the warpgroups, the key masks and
// the online softmax's max step.
#pragma once

#include <cuda.h>
#include <cutlass/arch/barrier.h>

#include <cstdint>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include "cuda/sm90/attention/fragments.cuh"
#include "cuda/sm90/attention/mma.cuh"
#include "cuda/sm90/attention/primitives.cuh"
#include "cuda/sm90/attention/softmax.cuh"
#include "cuda/sm90/sparse_decode/fills.cuh"
#include "cuda/sm90/sparse_decode/fused_q.cuh"
#include "cuda/sm90/sparse_decode/params.h"
#include "cuda/sm90/sparse_decode/traits.h"

namespace openmla::cuda::sm90 {
namespace sparse_decode_detail {

using namespace attention;  // the shared softmax, MMA and barrier helpers

enum : uint32_t {
  kBarP0 = 1,        // WG0 -> WG1: P and the factors of a stage-0 tile (256)
  kBarP1 = 2,        // the same for stage 1 (256)
  kBarQ = 3,         // inside WG0: Q in shared memory (128)
  kBarEpi = 4,       // row sums published (256); 5: the producer's kBarFill (fills.cuh)
  kBarMax = 6,       // the seesaw order: both warpgroups' tile row maxima (and row sums) (256)
  kBarMaxFinal = 7,  // the stagger (kStagger): WG1 -> WG0, the round's final row max (256)
  kBarFusedQ = 8,    // inside WG0: Q loaded, before the fused op's norm and RoPE (128)
};

// The problem's Q rows [64 m, 64 m + 64) into shared memory (padding rows are zeros), by WG0.
template <class Traits>
__device__ __forceinline__ void load_q(const SparseDecodeParams& p,
                                       typename Traits::SharedStorage& smem, int problem,
                                       int m_block, int t) {
  constexpr int kChunksPerRow = Traits::kHeadDimQK / 8;
  constexpr int kChunks = Traits::kBlockM * kChunksPerRow;
  constexpr int kPerThread = kChunks / 128;
  constexpr int kBatch = kPerThread % 12 == 0 ? 12 : 8;
  static_assert(kChunks % 128 == 0 && kPerThread % kBatch == 0);
  const char* q = static_cast<const char*>(p.q);
  char* base = reinterpret_cast<char*>(smem.q);
#pragma unroll 1
  for (int b = 0; b < kPerThread; b += kBatch) {
    uint4 v[kBatch];
#pragma unroll
    for (int e = 0; e < kBatch; ++e) {
      const int idx = (b + e) * 128 + t;
      const int row = idx / kChunksPerRow, ch = idx % kChunksPerRow;
      const Row r = row_of<Traits::kDense>(p, problem, m_block * Traits::kBlockM + row);
      v[e] = make_uint4(0u, 0u, 0u, 0u);
      if (r.ok) {
        const int64_t off = r.i * p.q_stride_b + r.j * p.q_stride_s + r.h * p.q_stride_h +
                            (ch >> 1) * p.q_stride_c16 + (ch & 1) * 8;
        v[e] = __ldg(reinterpret_cast<const uint4*>(q + off * 2));
      }
    }
#pragma unroll
    for (int e = 0; e < kBatch; ++e) {
      const int idx = (b + e) * 128 + t;
      const int row = idx / kChunksPerRow, ch = idx % kChunksPerRow;
      *reinterpret_cast<uint4*>(base + (ch / 8) * Traits::kPieceBytes +
                                swizzled_offset(row, ch % 8)) = v[e];
    }
  }
}

// The fused op's cos/sin value of thread t < 64 of WG0 (fused_q.cuh), loaded before load_q so
// its latency hides under Q's; 0 without the fused op.
template <class Traits>
__device__ __forceinline__ float fused_q_prefetch(const SparseDecodeParams& p, int problem, int t,
                                                  bool& bad) {
  bad = false;
  if constexpr (Traits::kFused) {
    if (p.fused.on && t < 64) return fused_cos_sin_value(p.fused, problem, t, bad);
  }
  return 0.f;
}

// The fused op's norm and RoPE of Q (fused_q.cuh), by WG0 after load_q: the cos/sin row into
// shared memory (for the output's RoPE too), then Q's rows; nothing without it.
template <class Traits>
__device__ __forceinline__ void fused_q(const SparseDecodeParams& p,
                                        typename Traits::SharedStorage& smem, int t, float cs,
                                        bool bad) {
  if constexpr (Traits::kFused) {
    if (p.fused.on) {
      if (t < 64) smem.fused_cs[t] = cs;
      if (t == 0) smem.fused_bad = bad;
      bar_sync(kBarFusedQ, 128);  // every thread's Q stores and the cos/sin row before reads
      fused_q_rows<Traits>(p, smem, t);
    }
  }
}

// kFp16 (traits.h): Q's rows in place as fp16, row r times 2^-e_r (e_r from the row's largest
// bf16 exponent field: every |value| then below 2^15), d 576's RoPE piece kept bf16 (times 2^-e_r,
// exactly); e_r into smem.row_sum[r] (as int bits: free until the epilogue's row sums). By WG0,
// two threads a row, after load_q's stores are visible to all of WG0.
template <class Traits>
__device__ __forceinline__ void q_rows_to_fp16(typename Traits::SharedStorage& smem, int t) {
  constexpr int kPieces = Traits::kNumPieces, kHalf = (kPieces + 1) / 2;
  const int row = t >> 1, half = t & 1;
  char* base = reinterpret_cast<char*>(smem.q) + row * 128;
  uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const int pc = half * kHalf + i;
    if (pc >= kPieces) break;
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      const uint4 v = *reinterpret_cast<const uint4*>(base + pc * Traits::kPieceBytes + 16 * c);
      m = __vmaxu2(m, v.x & 0x7F807F80u);
      m = __vmaxu2(m, v.y & 0x7F807F80u);
      m = __vmaxu2(m, v.z & 0x7F807F80u);
      m = __vmaxu2(m, v.w & 0x7F807F80u);
    }
  }
  uint32_t f = max(m & 0xFFFFu, m >> 16) >> 7;
  f = max(f, __shfl_xor_sync(0xffffffffu, f, 1));
  const int e = min(max(static_cast<int>(f) - 126 - 15, -60), 60);
  const float down = exp2_int(-e);
  const uint32_t down_bf16 = static_cast<uint32_t>(127 - e) << 7 | static_cast<uint32_t>(127 - e)
                                                                       << 23;
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const int pc = half * kHalf + i;
    if (pc >= kPieces) break;
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      uint4* at = reinterpret_cast<uint4*>(base + pc * Traits::kPieceBytes + 16 * c);
      uint4 v = *at;
      if (Traits::kRopeBf16 && pc == kPieces - 1) {
        v.x = mul_bf16x2(v.x, down_bf16), v.y = mul_bf16x2(v.y, down_bf16);
        v.z = mul_bf16x2(v.z, down_bf16), v.w = mul_bf16x2(v.w, down_bf16);
      } else {
        auto f16 = [&](uint32_t w) {
          return f16x2_of(__uint_as_float(w << 16) * down, __uint_as_float(w & 0xFFFF0000u) * down);
        };
        v.x = f16(v.x), v.y = f16(v.y), v.z = f16(v.z), v.w = f16(v.w);
      }
      *at = v;
    }
  }
  if (half == 0) smem.row_sum[row] = __int_as_float(e);
}

// A stage's full barrier; with a CTA pair the peer's producer arrives on it too (pair.cuh).
__device__ __forceinline__ void wait_full(uint64_t* full, int phase, bool pair) {
  cutlass::arch::ClusterBarrier::wait(full, phase);
  if (pair) fence_async_smem();  // the peer's st.async rows (generic proxy) before wgmma reads
}
// A compute warp is done with a stage: lane 0 arrives on its empty barrier (and the peer's: the
// peer's producer writes into this CTA's stage too).
__device__ __forceinline__ void release_stage(uint64_t* empty, int lane, bool pair) {
  if (lane == 0) {
    cutlass::arch::ClusterBarrier::arrive(empty);
    if (pair) arrive_peer(peer_addr(smem_u32(empty), cluster_rank() ^ 1u));
  }
}

template <class Traits>
__device__ __forceinline__ void* p_buffer(typename Traits::SharedStorage& smem, int stage) {
  if constexpr (Traits::kPInKTile) {
    return smem.k[stage] + 8 * Traits::kPieceElems;  // the tile's RoPE piece
  } else {
    return smem.p[stage];
  }
}

// A stage's key mask: bit j = key j is valid (word b holds keys 8 b .. 8 b + 7 in its low byte).
__device__ __forceinline__ uint64_t stage_valid(const uint32_t (&words)[8]) {
  const uint4 v0 = reinterpret_cast<const uint4*>(words)[0];
  const uint4 v1 = reinterpret_cast<const uint4*>(words)[1];
  return (v0.x | v0.y << 8 | v0.z << 16 | v0.w << 24) |
         static_cast<uint64_t>(v1.x | v1.y << 8 | v1.z << 16 | v1.w << 24) << 32;
}

// The round slots' key mask of a tile (traits.h kSlots): keys 0-31 from slot s0's 4 words, 32-63
// from slot s1's (word w of a slot holds keys 8 w .. 8 w + 7 of its round in its low byte, read
// out of the word by `byte`).
template <class Byte>
__device__ __forceinline__ uint64_t slots_mask(const uint32_t (&words)[12], int s0, int s1,
                                               Byte&& byte) {
  const uint4 a = reinterpret_cast<const uint4*>(words)[s0];
  const uint4 b = reinterpret_cast<const uint4*>(words)[s1];
  return (byte(a.x) | byte(a.y) << 8 | byte(a.z) << 16 | byte(a.w) << 24) |
         static_cast<uint64_t>(byte(b.x) | byte(b.y) << 8 | byte(b.z) << 16 | byte(b.w) << 24)
             << 32;
}
__device__ __forceinline__ uint64_t slots_valid(const uint32_t (&words)[12], int s0, int s1) {
  return slots_mask(words, s0, s1, [](uint32_t x) { return x; });
}
// A round slot's RoPE piece (d 576; dead once the slot's QK^T is done): half of P lives there,
// the keys of that round (attention/fragments.cuh store_p_halves).
template <class Traits>
__device__ __forceinline__ void* slot_rope(typename Traits::SharedStorage& smem, int slot) {
  return smem.k[0] + slot * Traits::kSlotElems + 8 * (Traits::kSlotPieceBytes / 2);
}

// The seesaw order's P of stage s: at d 576 stage 0's in its RoPE piece (in its R half, which
// WG1, the reader, frees) and stage 1's in a buffer of its own (its RoPE piece is in stage 1's R
// half, which WG1 frees before WG0 has read P); at d 512 a buffer each.
template <class Traits>
__device__ __forceinline__ void* seesaw_p_buffer(typename Traits::SharedStorage& smem, int s) {
  if constexpr (Traits::kPInKTile) {
    return s == 0 ? static_cast<void*>(smem.k[0] + 8 * Traits::kPieceElems)
                  : static_cast<void*>(smem.p[0]);
  } else {
    return smem.p[s];
  }
}

// Scores of keys the producer found invalid (a clear bit of `valid`: bit j is key j of the tile
// or round) or at or past a row's causal limit (the dense mode's cut rows: `limit_of(r)`, the
// tile-relative limit of the thread's row r) set to -inf.
template <class Mask, class TS, class TC, class LimitOf>
__device__ __forceinline__ void mask_scores(TS& S, TC const& cS_rc, Mask valid, bool cut_rows,
                                            LimitOf&& limit_of) {
  using namespace cute;
  if (valid != ~Mask(0) || cut_rows) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int cut = cut_rows ? limit_of(r) : INT_MAX;
#pragma unroll
      for (int c = 0; c < size<1>(S); ++c) {
        const int key = get<1>(cS_rc(r, c));
        if (!((valid >> key) & Mask(1)) || key >= cut) S(r, c) = -INFINITY;
      }
    }
  }
}
// One step of the online softmax's row maxima over S: the exact max (m_true), the lazy running
// max (m_run), P's exp2 base and O's rescale factor of each of the thread's two rows.
template <class TS>
__device__ __forceinline__ void running_max_step(TS const& S, float max_thr, float sl2,
                                                 float (&m_true)[2], float (&m_run)[2],
                                                 float (&base)[2], float (&factor)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float mx = quad_max(row_reduce<true>(S, r));
    m_true[r] = fmaxf(m_true[r], mx);
    const float m_new = lazy_max(m_run[r], mx, max_thr);
    base[r] = max_base(m_new, sl2);
    factor[r] = exp2_approx(m_run[r] * sl2 - base[r]);
    m_run[r] = m_new;
  }
}

}  // namespace sparse_decode_detail
}  // namespace openmla::cuda::sm90
