// SM90 dense MLA decode: two TMA producer warps per stage + two wgmma warpgroups in a seesaw
// over pairs of tiles. Design, numbers and tuning history: NOTES.md. Compile-time choices:
// traits.h; producers and barriers: pipeline.cuh; per-tile register work: tile_ops.cuh.
//
// Grid (m_blocks, h_kv, num_sm_parts), 384 threads, one CTA per SM. CTA (m, g, w) serves query
// rows [64 m, 64 m + 64) of kv head g for every request piece of schedule worker w; a request
// piece is the key range [tok_begin, tok_end) walked in pairs of 64-key tiles: WG0 scores the
// even tiles (stage 0), WG1 the odd ones (stage 1), and both multiply every tile's P by their
// half of V (WG0 dims 0-255, WG1 256-511). Per pair k (tiles A = 2k, B = 2k + 1; S(A) and S(B)
// were computed at the end of pair k - 1), with m the running max (v17, NOTES.md):
//
//   WG0: m(A) = max(m(B-2), rowmax S(A)); P(A) = e^(S(A) - m(A)) -> smem (A's dead RoPE piece)
//        with m(A) for WG1; O_L *= e^(m(B-2) - m(A)); O_L += P(A) V(A)_L, waited: V(A)_L back;
//        [m(B), e^(m(A) - m(B)), P(B) from WG1] O_L *= e^(m(A) - m(B)); O_L += P(B) V(B)_L (SS);
//        S(A+2) = Q K(A+2)^T: its V-left part under that PV; then V(B)_L + P(B) back; the rest
//   WG1: [P(A), m(A)] O_R *= e^(m(B-2) - m(A)); O_R += P(A) V(A)_R (SS, issued); softmax of B
//        against m(A) under it -> P(B), m(B), the factor to WG0; that PV done: V(A)_R + P(A)
//        back; O_R *= e^(m(A) - m(B)); O_R += P(B) V(B)_R; V(B)_R back; S(B+2)
//
// so each tile's two PVs start as soon as its P exists (WG1 runs WG0's PV under its own softmax),
// stage 0 goes back early in the pair, and both QK^Ts of the next pair follow the pair's PVs. The
// other warpgroup's P is read by the wgmma straight from shared memory. Each part of a stage (V
// left, V right; the RoPE piece, which holds P, goes with the part its reader hands back) is
// handed back by its last reader and refilled at once by the stage's own producer warps, in the
// order parts come back. V is the first 512 dims of the same keys (read transposed, MN-major).
// A request with one split writes out/lse here; otherwise the split's fp32 partial goes to the
// workspace for combine.cu, which this grid lets launch early.
#pragma once

#include <cuda.h>

#include <cstdint>

#include <cute/tensor.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "cuda/sm90/dense_decode/launch.h"
#include "cuda/sm90/dense_decode/params.h"
#include "cuda/sm90/dense_decode/pipeline.cuh"
#include "cuda/sm90/dense_decode/tile_ops.cuh"
#include "cuda/sm90/dense_decode/traits.h"

namespace openmla::cuda::sm90 {
namespace dense_decode_detail {

// One part of S = Q K^T of stage kStage's tile (the kIndex-th in the stage's part order), its
// wgmmas issued and not waited for. kStream: each piece's wgmmas as soon as it lands; ptxas then
// closes a wgmma group at each piece (a barrier's wait loop lies between them), so a later
// wgmma wait counts pieces. Otherwise every piece is waited for first and the part is one group,
// which a wait for an earlier group (the PV before it) can leave pending.
template <class Traits, int kStage, int kIndex, bool kStream, class Mma, class TQ, class TK,
          class TS>
__device__ __forceinline__ void qk_part(Mma& mma, TQ const& tSrQ, TK const& tSrK, TS& tSrS,
                                        uint64_t* full, uint32_t phase) {
  using namespace cute;
  constexpr int kSteps = Traits::kPieceDims / 16;
  constexpr int kPart = Traits::part_order(kStage, kIndex);
  if constexpr (!kStream) wait_part<Traits>(full, kStage, kPart, phase);
  warpgroup_arrive();
#pragma unroll
  for (int i = 0; i < Traits::part_num_pieces(kStage, kPart); ++i) {
    const int c = Traits::part_piece(kStage, kPart, i);
    if constexpr (kStream) cutlass::arch::ClusterBarrier::wait(&full[c], phase);
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
      const bool first = kIndex == 0 && i == 0 && kk == 0;
      mma.accumulate_ = first ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
      gemm(mma, tSrQ(_, _, c * kSteps + kk), tSrK(_, _, c * kSteps + kk), tSrS);
    }
  }
  warpgroup_commit_batch();
}

// O += P V with P from registers (issued and committed, not waited for).
template <class Mma, class TP, class TV, class TO>
__device__ __forceinline__ void gemm_pv(Mma& mma, TP& tOrP, TV const& tOrV, TO& tOrO) {
  using namespace cute;
  warpgroup_fence_operand(tOrP);
  warpgroup_fence_operand(tOrO);
  warpgroup_arrive();
  mma.accumulate_ = GMMA::ScaleOut::One;
  gemm(mma, tOrP, tOrV, tOrO);
  warpgroup_commit_batch();
}
// O += P V with P from shared memory (issued and committed, not waited for).
template <class Mma, class TP, class TV, class TO>
__device__ __forceinline__ void gemm_pv_shared(Mma& mma, TP const& tOsP, TV const& tOsV,
                                               TO& tOrO) {
  using namespace cute;
  warpgroup_fence_operand(tOrO);
  warpgroup_arrive();
  mma.accumulate_ = GMMA::ScaleOut::One;
  gemm(mma, tOsP, tOsV, tOrO);
  warpgroup_commit_batch();
}

template <class TO, class TP>
__device__ __forceinline__ void wait_pv(TO& tOrO, TP& tOrP) {
  cute::warpgroup_wait<0>();
  cute::warpgroup_fence_operand(tOrO);
  cute::warpgroup_fence_operand(tOrP);
}

// Returns the pairs it consumed (for the trace's CTA spans).
template <class Traits>
__device__ __forceinline__ int consume(const DenseDecodeParams& p,
                                        typename Traits::SharedStorage& smem, int wg, int thread,
                                        int m_block, int kv_head) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kPartL = Traits::kPartL, kPartR = Traits::kPartR;
  const int t = thread - wg * 128;  // thread in its warpgroup
  const int lane = t % 32;

  typename Traits::TiledMmaQK mma_qk;
  typename Traits::TiledMmaPV mma_pv;
  typename Traits::TiledMmaPVShared mma_pv_s;
  auto thr_qk = mma_qk.get_thread_slice(t);
  auto thr_pv = mma_pv.get_thread_slice(t);
  auto thr_pv_s = mma_pv_s.get_thread_slice(t);

  Tensor sQ = make_tensor(make_smem_ptr(smem.q), typename Traits::SmemLayoutQ{});  // (64,D)
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);                                  // (MMA,1,D/16)
  // Descriptors of stage 0; stage 1 by byte offset (at_offset).
  constexpr uint32_t kStageBytes = Traits::kTileElems * 2;
  Tensor tSrK = thr_qk.partition_fragment_B(
      make_tensor(make_smem_ptr(smem.k[0]), typename Traits::SmemLayoutK{}));  // (MMA,1,D/16)
  Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<64>, Int<kBlockN>>{});  // (MMA,1,1) fp32
  Tensor S = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));             // (2,16)
  Tensor cS = make_identity_tensor(Shape<Int<64>, Int<kBlockN>>{});
  Tensor tScS = thr_qk.partition_C(cS);
  Tensor cS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));  // (2,16) -> (row,key)

  // This warpgroup's own P in registers: the A operand of its register-sourced PV.
  Tensor tOrP = thr_pv.partition_fragment_A(
      make_tensor(make_smem_ptr(smem.q), typename Traits::SmemLayoutP{}));  // (MMA,1,4) Element
  static_assert(size(decltype(tOrP){}) == size(decltype(tSrS){}));
  // The P a stage's tile hands to the other warpgroup: in the tile's RoPE piece at d 576, in a
  // buffer of its own at d 512; stage 1's at kPStageBytes past stage 0's.
  Element* const p_stage0 =
      Traits::kPInKTile ? smem.k[0] + 8 * Traits::kPieceElems : smem.p[0];
  constexpr uint32_t kPStageBytes = Traits::kPInKTile ? kStageBytes : Traits::kPBytes;
  auto p_buffer = [&](int stage) {
    return static_cast<void*>(reinterpret_cast<char*>(p_stage0) + stage * kPStageBytes);
  };
  Tensor tOsP = thr_pv_s.partition_fragment_A(
      make_tensor(make_smem_ptr(p_stage0), typename Traits::SmemLayoutP{}));  // (MMA,1,4)
  // This warpgroup's V dims [256 wg, 256 wg + 256) = pieces [4 wg, 4 wg + 4) of a tile.
  Tensor sV = make_tensor(make_smem_ptr(smem.k[0] + wg * (Traits::kNumVPieces / 2) * Traits::kPieceElems),
                          typename Traits::SmemLayoutV{});
  Tensor tOrV = thr_pv.partition_fragment_B(sV);    // (MMA,1,4)
  Tensor tOsV = thr_pv_s.partition_fragment_B(sV);  // (MMA,1,4)
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
  auto field = [&](int f) { return smem.range[f]; };  // the worker's range (traits.h)
  const Tracer trace(p, wg, t == 0);
  int pair = 0;  // pairs consumed so far by this CTA: the phase of both stages' barriers
  for (int r = field(0); r <= field(2); ++r) {
    const RequestPiece piece = request_piece(p, r, field(0), field(1), field(2), field(3));
    const int n_tiles = piece.num_tiles();
    const int first_split = p.num_splits[r * p.num_splits_stride];
    const int n_splits = p.num_splits[(r + 1) * p.num_splits_stride] - first_split;

    // Every QK^T of the previous request is done (its epilogue passed kBarEpilogue).
    if (n_tiles > 0) load_q<Traits>(p, smem.q, r, kv_head, m_block, thread);
    fence_async_smem();
    bar_sync(kBarRequest, 256);

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
    const bool has_last_b = n_tiles % 2 == 0;  // the last pair has both tiles
    // Pair k's tile in stage `stage`: its first key, and how many of its keys are before the end.
    auto tile_key = [&](int k, int stage) { return piece.tile_begin + (2 * k + stage) * kBlockN; };
    auto tile_valid = [&](int k, int stage) {
      return max(0, min(kBlockN, piece.tok_end - tile_key(k, stage)));
    };
    // The landed S of pair k's tile in `stage`: masked, and its row maxima.
    auto finish_score = [&](int stage, int k, float(&mx)[2]) {
      warpgroup_fence_operand(tOrO);
      const int k0 = tile_key(k, stage);
      if (k0 + kBlockN > min_limit || k0 < piece.tok_begin) {
        mask_tile(S, cS_rc, k0, piece.tok_begin, limit);
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) mx[i] = quad_max(row_reduce<true>(S, i));
    };
    // S = Q K^T of pair k's tile in stage kStage, both parts, waited.
    auto score = [&](auto stage_c, int k, uint32_t phase, float(&mx)[2]) {
      constexpr int kStage = decltype(stage_c)::value;
      warpgroup_fence_operand(tSrS);
      qk_part<Traits, kStage, 0, true>(mma_qk, at_offset(tSrQ, 0), at_offset(tSrK, kStage * kStageBytes),
                                 tSrS, smem.full[kStage], phase);
      qk_part<Traits, kStage, 1, true>(mma_qk, at_offset(tSrQ, 0), at_offset(tSrK, kStage * kStageBytes),
                                 tSrS, smem.full[kStage], phase);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);
      finish_score(kStage, k, mx);
    };
    float mx[2] = {-INFINITY, -INFINITY};  // row maxima of the warpgroup's next S

    if (wg == 0) {
      // Pair k. kHasB: tile 2k + 1 exists; kHasNext: pair k + 1 exists (its S(2k+2) is computed
      // here). Each variant is a body of its own: a branch around a wgmma's issue and another
      // around its wait made ptxas serialize every wgmma (NOTES.md v12).
      auto body = [&](auto has_b_c, auto has_next_c, int k) __attribute__((always_inline)) {
        constexpr bool kHasB = decltype(has_b_c)::value, kHasNext = decltype(has_next_c)::value;
        static_assert(kHasB || !kHasNext);
        const uint32_t phase = pair & 1;
        trace.mark(pair, 0);
        // ---- softmax of tile 2k against the running max; P and the new max to WG1 ----
        float scale0[2], base0[2], sum0[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const float m0 = fmaxf(m_run[i], mx[i]);
          base0[i] = max_base(m0, sl2);
          scale0[i] = exp2_approx(m_run[i] * sl2 - base0[i]);
          m_run[i] = m0;
        }
        softmax_to_p<Element>(S, tSrS, base0, sl2, sum0, tOrP);
        smem.max0[t] = make_float2(m_run[0], m_run[1]);
        const int valid = tile_valid(k, 0);
        const bool zero = valid < kBlockN;
        if (zero) zero_v_rows<Traits>(smem.k[0], valid, t);
        store_p<Element, false>(p_buffer(0), S, t, scale0);
        fence_async_smem();  // P and the zeroed rows before the wgmmas that read them
        bar_arrive(kBarP0Ready, 256);
        if (zero) bar_sync(kBarWg0, 128);
#pragma unroll
        for (int i = 0; i < 2; ++i) l_run[i] = l_run[i] * scale0[i] + sum0[i];
        // ---- O_L += P V_L on tile 2k, then stage 0's V left goes back ----
        rescale_rows(O, scale0);
        gemm_pv(mma_pv, tOrP, at_offset(tOrV, 0), tOrO);
        wait_pv(tOrO, tOrP);
        release_part(&smem.empty[0][kPartL], lane);
        trace.mark(pair, 1);
        // ---- WG1's max after tile 2k + 1 and its P: O_L *= e^(m(2k) - m(2k+1)), then
        // O_L += P(2k+1) V(2k+1)_L from smem ----
        bar_sync(kBarP1Ready, 256);
        const float4 st = smem.stats1[t];
        const float scale1[2] = {st.z, st.w};
        m_run[0] = st.x;
        m_run[1] = st.y;
#pragma unroll
        for (int i = 0; i < 2; ++i) l_run[i] *= scale1[i];
        rescale_rows(O, scale1);
        trace.mark(pair, 2);
        if constexpr (kHasB) {
          gemm_pv_shared(mma_pv_s, at_offset(tOsP, kPStageBytes), at_offset(tOsV, kStageBytes),
                         tOrO);
        }
        if constexpr (kHasNext) {
          // S(2k + 2): its V-left part (refilled since the PV on tile 2k) behind that PV, then
          // stage 1's V left + P go back, then the rest.
          warpgroup_fence_operand(tSrS);
          qk_part<Traits, 0, 0, false>(mma_qk, at_offset(tSrQ, 0), at_offset(tSrK, 0), tSrS,
                                       smem.full[0], phase ^ 1);
          warpgroup_wait<1>();
          release_part(&smem.empty[1][kPartL], lane);
          qk_part<Traits, 0, 1, true>(mma_qk, at_offset(tSrQ, 0), at_offset(tSrK, 0), tSrS,
                                      smem.full[0], phase ^ 1);
          warpgroup_wait<0>();
          warpgroup_fence_operand(tSrS);
          warpgroup_fence_operand(tOrO);
          trace.mark(pair, 3);
          finish_score(0, k + 1, mx);
        } else {
          if constexpr (kHasB) {
            warpgroup_wait<0>();
            warpgroup_fence_operand(tOrO);
          } else {
            wait_part<Traits>(smem.full[1], 1, kPartL, phase);  // the empty tile "landed"
          }
          release_part(&smem.empty[1][kPartL], lane);
        }
      };
      if (n_pairs > 0) {
        score(cute::Int<0>{}, 0, pair & 1, mx);
        for (int k = 0; k + 1 < n_pairs; ++k, ++pair) body(cute::true_type{}, cute::true_type{}, k);
        if (has_last_b) {
          body(cute::true_type{}, cute::false_type{}, n_pairs - 1);
        } else {
          body(cute::false_type{}, cute::false_type{}, n_pairs - 1);
        }
        ++pair;
      }
    } else {
      // Pair k; kHasB: tile 2k + 1 exists; next_b: tile 2k + 3 exists (its S is computed here).
      auto body = [&](auto has_b_c, int k, bool next_b) __attribute__((always_inline)) {
        constexpr bool kHasB = decltype(has_b_c)::value;
        const uint32_t phase = pair & 1;
        trace.mark(pair, 0);
        // ---- P(2k) from WG0: O_R *= e^(m(2k-1) - m(2k)), O_R += P(2k) V(2k)_R from smem ----
        bar_sync(kBarP0Ready, 256);
        const float2 m0v = smem.max0[t];
        const float m0[2] = {m0v.x, m0v.y};
        float scale_a[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          scale_a[i] = exp2_approx(m_run[i] * sl2 - max_base(m0[i], sl2));
          l_run[i] *= scale_a[i];
        }
        rescale_rows(O, scale_a);
        gemm_pv_shared(mma_pv_s, at_offset(tOsP, 0), at_offset(tOsV, 0), tOrO);
        trace.mark(pair, 1);
        // ---- softmax of tile 2k + 1 against m(2k), under that PV: P, the max and WG0's factor
        float base1[2], scale1[2], sum1[2] = {0.f, 0.f};
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const float m1 = kHasB ? fmaxf(m0[i], mx[i]) : m0[i];  // (mx is stale without a tile)
          base1[i] = max_base(m1, sl2);
          scale1[i] = exp2_approx(m0[i] * sl2 - base1[i]);
          m_run[i] = m1;
        }
        if constexpr (kHasB) softmax_to_p<Element>(S, tSrS, base1, sl2, sum1, tOrP);
        smem.stats1[t] = make_float4(m_run[0], m_run[1], scale1[0], scale1[1]);
        bool zero = false;
        if constexpr (kHasB) {
          const int valid = tile_valid(k, 1);
          zero = valid < kBlockN;
          if (zero) zero_v_rows<Traits>(smem.k[1], valid, t);
          store_p<Element, false>(p_buffer(1), S, t, scale1);
          fence_async_smem();  // P and the zeroed rows before the wgmmas that read them
        }
        bar_arrive(kBarP1Ready, 256);
        trace.mark(pair, 2);
        // ---- the PV on P(2k) done: stage 0's V right + P go back; O_R *= e^(m(2k) -
        // m(2k+1)); O_R += P(2k+1) V(2k+1)_R, then stage 1's V right goes back ----
        warpgroup_wait<0>();
        warpgroup_fence_operand(tOrO);
        release_part(&smem.empty[0][kPartR], lane);
#pragma unroll
        for (int i = 0; i < 2; ++i) l_run[i] = l_run[i] * scale1[i] + sum1[i];
        rescale_rows(O, scale1);
        if constexpr (kHasB) {
          if (zero) bar_sync(kBarWg1, 128);
          gemm_pv(mma_pv, tOrP, at_offset(tOrV, kStageBytes), tOrO);
          wait_pv(tOrO, tOrP);
        } else {
          wait_part<Traits>(smem.full[1], 1, kPartR, phase);  // the empty tile "landed"
        }
        release_part(&smem.empty[1][kPartR], lane);
        trace.mark(pair, 3);
        // ---- S(2k + 3) ----
        if (next_b) score(cute::Int<1>{}, k + 1, phase ^ 1, mx);
      };
      if (n_tiles > 1) score(cute::Int<1>{}, 0, pair & 1, mx);
      for (int k = 0; k + 1 < n_pairs; ++k, ++pair) body(cute::true_type{}, k, 2 * k + 3 < n_tiles);
      if (n_pairs > 0) {
        if (has_last_b) {
          body(cute::true_type{}, n_pairs - 1, false);
        } else {
          body(cute::false_type{}, n_pairs - 1, false);
        }
        ++pair;
      }
    }

    // ---- epilogue: row sums of both warpgroups, normalise, write ----
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      l_run[i] = quad_sum(l_run[i]);
      if (row_leader) smem.row_sum[wg][row_of[i]] = l_run[i];
    }
    bar_sync(kBarEpilogue, 256);
    const bool single = n_splits == 1;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int grow = m_block * 64 + row_of[i];
      const float l = smem.row_sum[0][row_of[i]] + smem.row_sum[1][row_of[i]];
      const float inv = l > 0.f ? 1.f / l : 0.f;
      if (grow >= p.rows) continue;
      const int s = grow / p.group, h = kv_head * p.group + grow % p.group;
      const float lse = l > 0.f ? m_run[i] * p.scale + logf(l) : (single ? INFINITY : -INFINITY);
      if (single) {
        char* out = static_cast<char*>(p.out) +
                    (r * p.out_stride_b + s * p.out_stride_s + h * p.out_stride_h +
                     wg * Traits::kVHalfDims) * 2;
#pragma unroll
        for (int j = 0; j < size<1>(O); j += 2) {
          const int col = get<1>(cO_rc(i, j));
          *reinterpret_cast<uint32_t*>(out + col * 2) =
              pack2<Element>(O(i, j) * inv, O(i, j + 1) * inv);
        }
        if (wg == 0 && row_leader) {
          p.lse[r * p.lse_stride_b + h * p.lse_stride_h + s * p.lse_stride_s] = lse;
        }
      } else {
        const int split = field(4) + (r - field(0));
        const int64_t prow = (static_cast<int64_t>(split) * p.s_q + s) * p.h_q + h;
        float* out = p.o_accum + prow * Traits::kHeadDimV + wg * Traits::kVHalfDims;
#pragma unroll
        for (int j = 0; j < size<1>(O); j += 2) {
          const int col = get<1>(cO_rc(i, j));
          *reinterpret_cast<float2*>(out + col) = make_float2(O(i, j) * inv, O(i, j + 1) * inv);
        }
        if (wg == 0 && row_leader) p.lse_accum[prow] = lse;
      }
    }
  }
  return pair;
}

}  // namespace dense_decode_detail

template <class Traits>
__global__ void __launch_bounds__(Traits::kNumThreads, 1)
    dense_decode_kernel(const __grid_constant__ DenseDecodeParams params) {
  using namespace dense_decode_detail;
  using Storage = typename Traits::SharedStorage;
  // Aligned to 1024 B by pointer arithmetic on the shared array itself: a round trip through an
  // integer loses the address space, and every smem access became a generic LD/ST (run 3 SASS).
  extern __shared__ __align__(1024) char smem_raw[];
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  Storage& smem =
      *reinterpret_cast<Storage*>(smem_raw + (((smem_base + 1023u) & ~1023u) - smem_base));

  const int thread = threadIdx.x;
  const int wg = __shfl_sync(0xffffffffu, thread / 128, 0);
#if defined(OPENMLA_DENSE_DECODE_TRACE)
  long long trace_start = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(trace_start));
  const long long trace_clock = clock64();
#endif
  if (thread == 0) {
#pragma unroll
    for (int s = 0; s < Traits::kStages; ++s) {
#pragma unroll
      for (int c = 0; c < Traits::kNumPieces; ++c) cutlass::arch::ClusterBarrier::init(&smem.full[s][c], 1);
#pragma unroll
      for (int part = 0; part < Traits::kNumParts; ++part) {
        cutlass::arch::ClusterBarrier::init(&smem.empty[s][part], 4);  // lane 0 of 4 warps
      }
    }
    cutlass::arch::fence_barrier_init();
    const int32_t* meta = params.metadata + blockIdx.z * params.metadata_stride_part;
#pragma unroll
    for (int f = 0; f < 5; ++f) smem.range[f] = meta[f * params.metadata_stride_field];
  }
  __syncthreads();
  // The combine grid may launch now; it waits for this grid to finish before reading partials.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");

  if (wg == 2) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    const int producer = thread / 32 - 8;  // warps 8, 9: stage 0; warps 10, 11: stage 1
    if (thread % 32 == 0) {
      cute::prefetch_tma_descriptor(&params.tma_k);
      // Two walks, so each holds only its own page arithmetic in the producers' 40 registers.
      if (params.page_size >= Traits::kBlockN) {
        produce<Traits, false>(params, smem, blockIdx.y, producer / kIssuersPerStage,
                               producer % kIssuersPerStage);
      } else {
        produce<Traits, true>(params, smem, blockIdx.y, producer / kIssuersPerStage,
                              producer % kIssuersPerStage);
      }
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kMmaRegisters>();
    const int pairs = consume<Traits>(params, smem, wg, thread, blockIdx.x, blockIdx.y);
#if defined(OPENMLA_DENSE_DECODE_TRACE)
    const int cta = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    if (params.trace != nullptr && thread == 0 && cta < kTraceMaxCtas) {
      long long end = 0;
      unsigned sm = 0;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(end));
      asm("mov.u32 %0, %%smid;" : "=r"(sm));
      long long* span = params.trace + (3ll * params.trace_pairs * kTraceEvents) + 6ll * cta;
      span[0] = trace_start;
      span[1] = end;
      span[2] = trace_clock;
      span[3] = clock64();
      span[4] = sm;
      span[5] = pairs;
    }
#else
    (void)pairs;
#endif
  }
}

}  // namespace openmla::cuda::sm90

// ---------------------------------------------------------------------------------------------
// The launch of one instantiation (instantiations/*.cu instantiate it for one Element x d_qk).
namespace openmla::cuda::sm90 {

template <typename Element, int kHeadDimQK>
cudaError_t launch_dense_decode_kernel(const DenseDecodeParams& params, int num_m_blocks,
                                       int h_kv, int num_sm_parts, cudaStream_t stream) {
  using Traits = DenseDecodeTraits<Element, kHeadDimQK>;
  auto kernel = dense_decode_kernel<Traits>;
  static const cudaError_t attr_error = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes);
  if (attr_error != cudaSuccess) return attr_error;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(num_m_blocks, h_kv, num_sm_parts);
  config.blockDim = dim3(Traits::kNumThreads);
  config.dynamicSmemBytes = Traits::kSmemBytes;
  config.stream = stream;
  return cudaLaunchKernelEx(&config, kernel, params);
}

}  // namespace openmla::cuda::sm90
