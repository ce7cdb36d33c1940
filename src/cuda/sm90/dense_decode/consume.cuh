// SM90 dense MLA decode: the compute warpgroups' loop (consume), in the order kernel.cuh's
// header describes.
#pragma once

#include <cuda.h>

#include <cstdint>

#include <cute/tensor.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "core/schedule.h"
#include "cuda/common/smem_opt_in.h"
#include "cuda/sm90/attention/fragments.cuh"
#include "cuda/sm90/attention/mask.cuh"
#include "cuda/sm90/attention/mma.cuh"
#include "cuda/sm90/attention/primitives.cuh"
#include "cuda/sm90/attention/softmax.cuh"
#include "cuda/sm90/dense_decode/epilogue.cuh"
#include "cuda/sm90/dense_decode/launch.h"
#include "cuda/sm90/dense_decode/params.h"
#include "cuda/sm90/dense_decode/producer.cuh"
#include "cuda/sm90/dense_decode/trace.cuh"
#include "cuda/sm90/dense_decode/traits.h"

namespace openmla::cuda::sm90 {
namespace dense_decode_detail {
using namespace attention;  // the shared device pieces (src/cuda/sm90/attention/)

// ---------------------------------------------------------------------------------------------
// Compute warpgroups.

// Returns the pairs it consumed (for the trace's CTA spans).
template <class Traits>
__device__ __forceinline__ int consume(const DenseDecodeParams& p,
                                        typename Traits::SharedStorage& smem, int wg, int thread,
                                        int m_block, int kv_head) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kBlockN = Traits::kBlockN;
  const int t = thread - wg * 128;  // thread in its warpgroup
  const int lane = t % 32;

  typename Traits::TiledMmaQK mma_qk;
  typename Traits::TiledMmaPV mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(t);
  auto thr_pv = mma_pv.get_thread_slice(t);

  Tensor sQ = make_tensor(make_smem_ptr(smem.q), typename Traits::SmemLayoutQ{});  // (64,D)
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);                                  // (MMA,1,D/16)
  // Descriptors of stage 0; stage 1 by byte offset (at_offset).
  Tensor tSrK = thr_qk.partition_fragment_B(
      make_tensor(make_smem_ptr(smem.k[0]), typename Traits::SmemLayoutK{}));  // (MMA,1,D/16)
  Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<64>, Int<kBlockN>>{});  // (MMA,1,1) fp32
  Tensor S = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));             // (2,16)
  Tensor cS = make_identity_tensor(Shape<Int<64>, Int<kBlockN>>{});
  Tensor tScS = thr_qk.partition_C(cS);
  Tensor cS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));  // (2,16) -> (row,key)

  // P as the A operand of P V, in registers: this warpgroup's own tile, and the other's (read
  // from shared memory).
  Tensor sP_shape = make_tensor(make_smem_ptr(smem.q), typename Traits::SmemLayoutP{});
  Tensor tOrP_own = thr_pv.partition_fragment_A(sP_shape);    // (MMA,1,4) Element
  Tensor tOrP_other = thr_pv.partition_fragment_A(sP_shape);  // (MMA,1,4) Element
  static_assert(size(decltype(tOrP_own){}) == size(decltype(tSrS){}));
  // The P exchange buffer of a stage: its RoPE piece at d 576, a buffer of its own at d 512.
  auto p_buffer = [&](int stage) -> void* {
    return Traits::kPInKTile ? static_cast<void*>(smem.k[stage] + 8 * Traits::kPieceElems)
                             : static_cast<void*>(smem.p[Traits::kPInKTile ? 0 : stage]);
  };
  // This warpgroup's V dims [256 wg, 256 wg + 256) = pieces [4 wg, 4 wg + 4) of a tile.
  Tensor tOrV = thr_pv.partition_fragment_B(
      make_tensor(make_smem_ptr(smem.k[0] + wg * (Traits::kNumVPieces / 2) * Traits::kPieceElems),
                  typename Traits::SmemLayoutV{}));  // (MMA,1,4)
  constexpr uint32_t kStageBytes = Traits::kTileElems * 2;
  Tensor tOrO = partition_fragment_C(mma_pv, Shape<Int<64>, Int<Traits::kVHalfDims>>{});  // fp32
  Tensor O = make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));                       // (2,128)
  Tensor cO = make_identity_tensor(Shape<Int<64>, Int<Traits::kVHalfDims>>{});
  Tensor tOcO = thr_pv.partition_C(cO);
  Tensor cO_rc = make_tensor(tOcO.data(), acc_rowcol(tOcO.layout()));  // (2,128) -> (row,dim)

  int row_of[2];  // rows (in the 64-row block) this thread holds
#pragma unroll
  for (int i = 0; i < 2; ++i) row_of[i] = get<0>(cS_rc(i, 0));
  const bool row_leader = (lane % 4) == 0;  // one of the 4 threads sharing a row writes stats
  const float sl2 = p.scale_log2;
  const float max_thr = 8.f / sl2;  // lazy_max's threshold: 2^8 in P
  auto field = [&](core::ScheduleField f) { return smem.range[f]; };  // the worker's row
  const Tracer trace(p, wg, t == 0);
  int pair = 0;  // pairs consumed so far by this CTA: the phase of both stages' barriers
  // Q by TMA (p.q_tma): lane 0 of the first p.q_issuers compute warps load request r's 64 rows
  // (rows past the request's are the map's zero fill): the first request's right away, each next
  // one's once both warpgroups are past their last QK^T (kBarEpilogue), so it lands under the
  // epilogue, or, where the output goes out through Q's buffer (p.out_tma), once its stores
  // have read it. (The compute threads' own loads cost ~6 µs at a CTA's start and more at each
  // request boundary; issued earlier, by the producer warps right after the last QK^T, or
  // prefetched into L2, it measured no better: NOTES.md, ideas 29 and 33.)
  const int warp = thread / 32;  // 0-7 over both warpgroups
  const bool q_issuer = p.q_tma && lane == 0 && warp < p.q_issuers;
  auto load_q_tma = [&](int r) {
    issue_q<Traits>(p, smem, r, kv_head, m_block, warp, p.q_issuers, warp == 0);
  };
  if (q_issuer && field(kBeginRequest) <= field(kEndRequest)) {
    load_q_tma(field(kBeginRequest));
  }
  uint32_t q_phase = 0;

  for (int r = field(kBeginRequest); r <= field(kEndRequest); ++r) {
    const RequestPiece piece = request_piece(p, r, field(kBeginRequest), field(kBeginToken),
                                             field(kEndRequest), field(kEndToken));
    const int n_tiles = piece.num_tiles();
    const int first_split = p.num_splits[r * p.num_splits_stride];
    const int n_splits = p.num_splits[(r + 1) * p.num_splits_stride] - first_split;

    // Every QK^T of the previous request is done (its epilogue passed kBarEpilogue).
    if (p.q_tma) {
      cutlass::arch::ClusterBarrier::wait(&smem.q_full, q_phase);
      q_phase ^= 1;
    } else {
      if (n_tiles > 0) load_q<Traits>(p, smem.q, r, kv_head, m_block, thread);
      fence_async_smem();
    }
    bar_sync(kBarRequest, 256);
    if (p.q_prefetch && q_issuer && r < field(kEndRequest)) {
      prefetch_q<Traits>(p, r + 1, kv_head, m_block, warp, p.q_issuers);
    }

    int limit[2];  // keys >= limit are masked (piece end, causal)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int grow = m_block * 64 + row_of[i];
      limit[i] = piece.tok_end;
      if (p.causal && grow < p.rows) {
        limit[i] = min(limit[i], piece.seqlen - p.s_q + grow / p.group + 1);
      }
    }
    const int min_limit = min(limit[0], limit[1]);
    float m_run[2] = {-INFINITY, -INFINITY};
    float l_run[2] = {0.f, 0.f};  // this thread's share of the row sums (quad-reduced at the end)
    clear(tOrO);

    const int n_pairs = (n_tiles + 1) / 2;
    // Pair k's tile in stage `stage`: its first key, and how many of its keys are before the end.
    auto tile_key = [&](int k, int stage) { return piece.tile_begin + (2 * k + stage) * kBlockN; };
    auto tile_valid = [&](int k, int stage) {
      return max(0, min(kBlockN, piece.tok_end - tile_key(k, stage)));
    };
    // S of stage `stage`'s tile of pair k masked, and its row maxima.
    auto score_tail = [&](int stage, int k, float(&mx)[2]) {
      const int k0 = tile_key(k, stage);
      if (k0 + kBlockN > min_limit || k0 < piece.tok_begin) {
        mask_tile(S, cS_rc, k0, piece.tok_begin, limit);
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) mx[i] = quad_max(row_reduce<true>(S, i));
    };
    // S = Q K^T of stage kStage's tile of pair k, masked, and its row maxima.
    auto score = [&](auto stage_c, int k, uint32_t phase, float(&mx)[2], auto&& after_first_part) {
      constexpr int kStage = decltype(stage_c)::value;
      gemm_qk<Traits, kStage>(mma_qk, at_offset(tSrQ, 0), at_offset(tSrK, kStage * kStageBytes),
                              tSrS, smem.full[kStage], phase, after_first_part);
      warpgroup_fence_operand(tOrO);
      score_tail(kStage, k, mx);
    };

    if (wg == 0) {
      // P of the odd tile of the previous pair (stage 1) from WG1, with WG1's running max and
      // the factor e^(m_even - m_odd): rescale, hand the stage's RoPE piece (P's buffer) back,
      // and when the tile exists issue O_L += P V_L on it (not waited for).
      auto take_odd = [&](bool has_tile) {
        bar_sync(kBarP1Ready, 256);
        const float4 st = smem.stats1[t];
        if (has_tile) load_p(p_buffer(1), tOrP_other, t);
        if constexpr (Traits::kPInKTile) {
          __syncwarp();
          release_part(&smem.empty[1][Traits::kPartRope], lane);
        }
        const float scale1[2] = {st.z, st.w};
        m_run[0] = st.x;
        m_run[1] = st.y;
#pragma unroll
        for (int i = 0; i < 2; ++i) l_run[i] *= scale1[i];
        rescale_rows_if(O, scale1);
        if (has_tile) gemm_pv(mma_pv, tOrP_other, at_offset(tOrV, kStageBytes), tOrO);
      };
      for (int k = 0; k < n_pairs; ++k, ++pair) {
        const uint32_t phase = pair & 1;
        trace.mark(pair, 0);
        if (k > 0) take_odd(true);  // tile 2k - 1 exists whenever pair k does
        trace.mark(pair, 1);
        // ---- S of tile 2k; the PV on tile 2k - 1 runs under it, then its V left goes back ----
        float mx[2];
        score(cute::Int<0>{}, k, phase, mx, [&] {
          warpgroup_fence_operand(tOrO);
          warpgroup_fence_operand(tOrP_other);
          if (k > 0) release_part(&smem.empty[1][Traits::kPartL], lane);
        });
        trace.mark(pair, 2);
        // ---- softmax of tile 2k against the running max: P for itself and for WG1 ----
        float scale0[2], base0[2], sum0[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const float m0 = lazy_max(m_run[i], mx[i], max_thr);
          base0[i] = max_base(m0, sl2);
          scale0[i] = exp2_approx(m_run[i] * sl2 - base0[i]);
          m_run[i] = m0;
        }
        softmax_to_p<Element>(S, tSrS, base0, sl2, sum0, tOrP_own);
#pragma unroll
        for (int i = 0; i < 2; ++i) l_run[i] = l_run[i] * scale0[i] + sum0[i];
        store_p(p_buffer(0), tOrP_own, t);
        smem.max0[t] = make_float2(m_run[0], m_run[1]);
        const int valid = tile_valid(k, 0);
        const bool zero = valid < kBlockN;
        if (zero) {
          zero_v_rows<Traits>(smem.k[0], valid, t);
          fence_async_smem();  // the zeroed rows before the wgmmas that read them
        }
        bar_arrive(kBarP0Ready, 256);
        trace.mark(pair, 3);
        if (zero) {
          bar_sync(kBarWg0, 128);
        } else if constexpr (Traits::kPInKTile) {
          // P before the next TMA into the RoPE piece. After the arrive: the fence (a MEMBAR)
          // stays off WG1's path; that TMA waits for WG1 to have read P anyway.
          fence_async_smem();
        }
        // ---- O_L += P V_L on tile 2k, then stage 0's V left goes back ----
        rescale_rows_if(O, scale0);
        gemm_pv(mma_pv, tOrP_own, at_offset(tOrV, 0), tOrO);
        wait_pv(tOrO, tOrP_own);
        trace.mark(pair, 4);
        release_part(&smem.empty[0][Traits::kPartL], lane);
      }
      if (n_pairs > 0) {
        // The request's last odd tile, if it has one (an even tile count): its PV, then stage
        // 1's V left goes back (it completes a phase per pair, loaded or not).
        const bool has_last = n_tiles % 2 == 0;
        take_odd(has_last);
        if (has_last) wait_pv(tOrO, tOrP_other);
        release_part(&smem.empty[1][Traits::kPartL], lane);
      }
    } else {
      // The pair body, straight-line for each case (a runtime `has1` around the issue-only
      // QK^T and its wait made ptxas inject a warpgroup.arrive before every wgmma, C7519).
      auto body = [&](auto has1_c, int k) __attribute__((always_inline)) {
        constexpr bool has1 = decltype(has1_c)::value;  // the pair's odd tile exists
        const uint32_t phase = pair & 1;
        trace.mark(pair, 0);
        // ---- S of tile 2k + 1 issued first: it needs nothing of WG0's, and its stage has
        // usually landed by now (v10 issued it behind the PV on P(2k), ~1k clocks later) ----
        if constexpr (has1) {
          gemm_qk<Traits, 1, true>(mma_qk, at_offset(tSrQ, 0), at_offset(tSrK, kStageBytes),
                                   tSrS, smem.full[1], phase, [] {});
        }
        // ---- P of tile 2k from WG0: O_R *= e^(m - m0), issue O_R += P V_R on it ----
        bar_sync(kBarP0Ready, 256);
        const float2 m0v = smem.max0[t];
        load_p(p_buffer(0), tOrP_other, t);
        if constexpr (Traits::kPInKTile) {
          __syncwarp();
          release_part(&smem.empty[0][Traits::kPartRope], lane);
        }
        const float m0[2] = {m0v.x, m0v.y};
        float scale0[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          scale0[i] = exp2_approx(m_run[i] * sl2 - max_base(m0[i], sl2));
          l_run[i] *= scale0[i];
        }
        rescale_rows_if(O, scale0);
        gemm_pv(mma_pv, tOrP_other, at_offset(tOrV, 0), tOrO);
        trace.mark(pair, 1);
        // ---- S of tile 2k + 1 done (the PV on tile 2k still runs: O is not touched until it
        // is waited for below) ----
        float mx[2] = {-INFINITY, -INFINITY};
        if constexpr (has1) {
          warpgroup_wait<1>();
          warpgroup_fence_operand(tSrS);
          score_tail(1, k, mx);
        } else {
          wait_pv(tOrO, tOrP_other);
          release_part(&smem.empty[0][Traits::kPartR], lane);
          // The tile past the end is a 0-byte phase of stage 1: no part of it may go back before
          // the producer's arrival, or a release could run a phase ahead of the producer's wait
          // (WG0 hands its parts back after kBarP1Ready, which follows this).
#pragma unroll
          for (int c = 0; c < Traits::kNumPieces; ++c) {
            cutlass::arch::ClusterBarrier::wait(&smem.full[1][c], phase);
          }
        }
        trace.mark(pair, 2);
        // ---- softmax of tile 2k + 1 against m0: P, m1 and e^(m0 - m1) for WG0 ----
        float base1[2], scale1[2], sum1[2] = {0.f, 0.f};
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const float m1 = lazy_max(m0[i], mx[i], max_thr);
          base1[i] = max_base(m1, sl2);
          scale1[i] = exp2_approx(m0[i] * sl2 - base1[i]);
          m_run[i] = m1;
        }
        if constexpr (has1) {
          softmax_to_p<Element>(S, tSrS, base1, sl2, sum1, tOrP_own);
          store_p(p_buffer(1), tOrP_own, t);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) l_run[i] = l_run[i] * scale1[i] + sum1[i];
        smem.stats1[t] = make_float4(m_run[0], m_run[1], scale1[0], scale1[1]);
        const int valid = tile_valid(k, 1);
        const bool zero = has1 && valid < kBlockN;
        if (zero) {
          zero_v_rows<Traits>(smem.k[1], valid, t);
          fence_async_smem();
        }
        bar_arrive(kBarP1Ready, 256);
        trace.mark(pair, 3);
        if constexpr (has1) {  // the PV on tile 2k, then stage 0's V right goes back
          wait_pv(tOrO, tOrP_other);
          release_part(&smem.empty[0][Traits::kPartR], lane);
        }
        if (zero) {
          bar_sync(kBarWg1, 128);
        } else if constexpr (Traits::kPInKTile) {
          fence_async_smem();  // P before the next TMA into the RoPE piece (as for WG0's P)
        }
        // ---- O_R += P V_R on tile 2k + 1, then stage 1's V right goes back ----
        rescale_rows_if(O, scale1);
        if constexpr (has1) {
          gemm_pv(mma_pv, tOrP_own, at_offset(tOrV, kStageBytes), tOrO);
          wait_pv(tOrO, tOrP_own);
        }
        trace.mark(pair, 4);
        release_part(&smem.empty[1][Traits::kPartR], lane);
      };
      for (int k = 0; k < n_pairs; ++k, ++pair) {
        if (2 * k + 1 < n_tiles) {
          body(cute::true_type{}, k);
        } else {
          body(cute::false_type{}, k);
        }
      }
    }

    // ---- epilogue: row sums of both warpgroups, normalise, write ----
    trace.mark_request(p, wg, r - field(kBeginRequest), 4);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      l_run[i] = quad_sum(l_run[i]);
      if (row_leader) smem.row_sum[wg][row_of[i]] = l_run[i];
    }
    bar_sync(kBarEpilogue, 256);
    trace.mark_request(p, wg, r - field(kBeginRequest), 5);
    const bool single = n_splits == 1;
    // The output staged through Q's buffer (out_tma) holds the next Q back until it is read out.
    const bool staged = p.out_tma && single;
    if (q_issuer && r < field(kEndRequest) && !staged) load_q_tma(r + 1);
    normalize_and_store_lse<Traits>(p, smem, O, row_of, m_run, wg, row_leader, m_block, kv_head, r,
                                    single);
    write_out<Traits>(p, smem, O, cO_rc, row_of, wg, t, lane, m_block, kv_head, r, single,
                      first_split);
    if (staged && r < field(kEndRequest)) {
      bar_sync(kBarEpilogue, 256);  // both halves' stores have read the buffer
      if (q_issuer) load_q_tma(r + 1);
    }
    trace.mark_request(p, wg, r - field(kBeginRequest), 6);
  }
  return pair;
}

}  // namespace dense_decode_detail

}  // namespace openmla::cuda::sm90
