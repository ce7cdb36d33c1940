// What both compute orders share (order_standard.cuh, order_seesaw.cuh): Q's rows into shared
// memory, a stage's key mask, the scores the mask drops, one step of the online softmax's row
// maxima, and the release of a stage to the producer(s).
#pragma once

#include <climits>
#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/sm90/attention/primitives.cuh"
#include "cuda/sm90/attention/softmax.cuh"
#include "cuda/sm90/sparse_attention/cluster.cuh"
#include "cuda/sm90/sparse_attention/problem.cuh"

namespace openmla::cuda::sm90 {
namespace sparse {

// The problem's Q rows [64 m, 64 m + 64) into shared memory (padding rows are zeros), by one
// warpgroup (t = 0 .. 127).
template <class Traits>
__device__ __forceinline__ void load_q(const SparseAttentionParams& p,
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
        const int64_t off = r.i * p.q_stride_b + r.j * p.q_stride_s + r.h * p.q_stride_h + ch * 8;
        v[e] = __ldg(reinterpret_cast<const uint4*>(q + off * 2));
      }
    }
#pragma unroll
    for (int e = 0; e < kBatch; ++e) {
      const int idx = (b + e) * 128 + t;
      const int row = idx / kChunksPerRow, ch = idx % kChunksPerRow;
      *reinterpret_cast<uint4*>(base + (ch / 8) * Traits::kPieceBytes +
                                attention::swizzled_offset(row, ch % 8)) = v[e];
    }
  }
}

// A stage's full barrier; with a cluster the peer's st.async rows (generic proxy) are ordered
// before this thread's wgmma reads.
template <int kCluster>
__device__ __forceinline__ void wait_full(uint64_t* full, int phase) {
  cutlass::arch::ClusterBarrier::wait(full, phase);
  if constexpr (kCluster == 2) attention::fence_async_smem();
}
// A compute warp is done with a stage: lane 0 arrives on its empty barrier (and, in a cluster,
// on the peer's: the peer's producer writes into this CTA's stage too).
template <int kCluster>
__device__ __forceinline__ void release_stage(uint64_t* empty, int lane) {
  if (lane == 0) {
    cutlass::arch::ClusterBarrier::arrive(empty);
    if constexpr (kCluster == 2) {
      arrive_peer(peer_addr(attention::smem_u32(empty), cluster_rank() ^ 1u));
    }
  }
}

// A stage's key mask: bit j = key j is valid (word b holds keys 8 b .. 8 b + 7 in its low byte).
__device__ __forceinline__ uint64_t stage_valid(const uint32_t (&words)[8]) {
  const uint4 v0 = reinterpret_cast<const uint4*>(words)[0];
  const uint4 v1 = reinterpret_cast<const uint4*>(words)[1];
  return (v0.x | v0.y << 8 | v0.z << 16 | v0.w << 24) |
         static_cast<uint64_t>(v1.x | v1.y << 8 | v1.z << 16 | v1.w << 24) << 32;
}

// Scores of keys the producer found invalid (a clear bit of `valid`: bit j is key j of the tile)
// or at or past a row's causal limit (the dense mode's cut rows: `limit_of(r)`, the
// tile-relative limit of the thread's row r) set to -inf. (A form that shifts the mask by the
// lane's key base once makes ptxas serialise the wgmma pipeline, C7515: this one does not.)
template <class TS, class TC, class LimitOf>
__device__ __forceinline__ void mask_scores(TS& S, TC const& cS_rc, uint64_t valid, bool cut_rows,
                                            LimitOf&& limit_of) {
  using namespace cute;
  if (valid != ~0ull || cut_rows) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int cut = cut_rows ? limit_of(r) : INT_MAX;
#pragma unroll
      for (int c = 0; c < size<1>(S); ++c) {
        const int key = get<1>(cS_rc(r, c));
        if (!((valid >> key) & 1ull) || key >= cut) S(r, c) = -INFINITY;
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
  using namespace attention;
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

// P (64 x 64 bf16, the A fragment of P V: word 4 k + i of the fragment is rows +8 (i & 1) of
// n-block 2 k + (i >> 1)) into a K-major 128 B-swizzled piece at `sp` by stmatrix x4, the layout
// an SS wgmma reads A from. Lanes 8 j .. 8 j + 7 address matrix j's rows.
template <class TP>
__device__ __forceinline__ void store_p_swizzled(uint32_t sp, TP& tOrP, int warp_in_wg, int lane) {
  using namespace cute;
  Tensor P32 = recast<uint32_t>(tOrP);
  static_assert(decltype(size(P32))::value == 16);
  const int row = 16 * warp_in_wg + ((lane >> 3) & 1) * 8 + (lane & 7);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int nb = 2 * k + (lane >> 4);
    const uint32_t addr = sp + row * 128 + ((nb ^ (row & 7)) << 4);
    asm volatile("stmatrix.sync.aligned.x4.m8n8.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr),
                 "r"(P32(4 * k)), "r"(P32(4 * k + 1)), "r"(P32(4 * k + 2)), "r"(P32(4 * k + 3))
                 : "memory");
  }
}

}  // namespace sparse
}  // namespace openmla::cuda::sm90
