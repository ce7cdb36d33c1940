// The producer of the SM90 dense MHA prefill forward (kernel.cuh): a CTA's work (its sequence,
// rows and key blocks) and the one thread that issues every TMA load.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>
#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/sm90/mha_prefill/params.h"

namespace openmla::cuda::sm90 {
namespace mha_fwd_detail {

// Keys query row t of a sequence sees: all s_kv, or with causal masking the first
// t + s_kv - s_q + 1 (bottom-right aligned), clamped to [0, s_kv] (cpu/mha_prefill.h).
__device__ __forceinline__ int visible_keys(int t, int s_q, int s_kv, bool causal) {
  if (!causal) return s_kv;
  const int n = t + s_kv - s_q + 1;
  return n < 0 ? 0 : (n > s_kv ? s_kv : n);
}

// One CTA's work: its sequence (first token and key, lengths), its first row in the sequence,
// and the key blocks it walks, [0, n_end).
struct Work {
  int q0, s_q, kv0, s_kv;
  int m0;
  int n_end;
};

template <class Traits>
__device__ __forceinline__ Work work_of(const MhaFwdParams& p, int m_block, int b) {
  Work w;
  w.q0 = p.cu_seqlens_q[b * p.cu_q_stride];
  w.kv0 = p.cu_seqlens_kv[b * p.cu_kv_stride];
  // A caller's offsets are not read on the host: a decreasing pair is an empty sequence here.
  w.s_q = max(p.cu_seqlens_q[(b + 1) * p.cu_q_stride] - w.q0, 0);
  w.s_kv = max(p.cu_seqlens_kv[(b + 1) * p.cu_kv_stride] - w.kv0, 0);
  w.m0 = m_block * Traits::kBlockM;
  w.n_end = 0;
  if (w.m0 < w.s_q) {
    const int last = min(w.m0 + Traits::kBlockM, w.s_q) - 1;
    w.n_end = (visible_keys(last, w.s_q, w.s_kv, p.causal != 0) + Traits::kBlockN - 1) /
              Traits::kBlockN;
  }
  return w;
}

// ---------------------------------------------------------------------------------------------
// Producer: one thread. Q of both warpgroups once (q_full), then each block's K and V into stage
// n % 2 as soon as both warpgroups have handed that stage's K (resp. V) back.
template <class Traits>
__device__ __forceinline__ void produce(const MhaFwdParams& p,
                                        typename Traits::SharedStorage& smem, const Work& w,
                                        int head, int kv_head) {
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  using cute::SM90_TMA_LOAD_3D;
  constexpr uint64_t kHintQ = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_FIRST);
  // K and V of a head are read by every m block of the sequence: keep them in L2.
  constexpr uint64_t kHintKV = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_LAST);
  constexpr int kPieceElemsQ = Traits::kWgRows * Traits::kPieceDims;
  constexpr int kPieceElemsKV = Traits::kBlockN * Traits::kPieceDims;
  if (w.n_end == 0) return;
  cute::prefetch_tma_descriptor(&p.tma_q);
  cute::prefetch_tma_descriptor(&p.tma_k);
  cute::prefetch_tma_descriptor(&p.tma_v);
  Barrier::arrive_and_expect_tx(&smem.q_full, Traits::kQBytes);
#pragma unroll
  for (int wg = 0; wg < 2; ++wg) {
#pragma unroll
    for (int c = 0; c < Traits::kQPieces; ++c) {
      SM90_TMA_LOAD_3D::copy(&p.tma_q, &smem.q_full, kHintQ, smem.q[wg] + c * kPieceElemsQ,
                             c * Traits::kPieceDims, head, w.q0 + w.m0 + wg * Traits::kWgRows);
    }
  }
#pragma unroll 1
  for (int n = 0; n < w.n_end; ++n) {
    const int s = n % Traits::kStages;
    const uint32_t phase = (n / Traits::kStages) & 1;
    const int key0 = w.kv0 + n * Traits::kBlockN;
    // A fresh barrier's "previous" phase counts as complete: the first pass waits for nothing.
    cutlass::arch::ClusterBarrier::wait(&smem.k_empty[s], phase ^ 1);
    Barrier::arrive_and_expect_tx(&smem.k_full[s], Traits::kKBytes);
#pragma unroll
    for (int c = 0; c < Traits::kQPieces; ++c) {
      SM90_TMA_LOAD_3D::copy(&p.tma_k, &smem.k_full[s], kHintKV, smem.k[s] + c * kPieceElemsKV,
                             c * Traits::kPieceDims, kv_head, key0);
    }
    cutlass::arch::ClusterBarrier::wait(&smem.v_empty[s], phase ^ 1);
    Barrier::arrive_and_expect_tx(&smem.v_full[s], Traits::kVBytes);
#pragma unroll
    for (int c = 0; c < Traits::kVPieces; ++c) {
      SM90_TMA_LOAD_3D::copy(&p.tma_v, &smem.v_full[s], kHintKV, smem.v[s] + c * kPieceElemsKV,
                             c * Traits::kPieceDims, kv_head, key0);
    }
  }
}

}  // namespace mha_fwd_detail
}  // namespace openmla::cuda::sm90
