// The compute warpgroups' standard order (consume.cuh): WG0 computes S, the softmax and P V_L,
// WG1 takes P through shared memory and computes P V_R.
#pragma once

#include "cuda/sm90/sparse_decode/consume_parts.cuh"

namespace openmla::cuda::sm90 {
namespace sparse_decode_detail {

// The standard order's WG0 (consume.cuh): Q, then per tile S = Q K^T (by round with the ring
// fill), the mask, the online softmax, P and O's row factors to WG1, O_L += P V_L; the row sums
// into smem.row_sum.
template <class Traits, class A_mma_qkr, class A_tSrQr, class A_tSrKr, class A_tSrSr, class A_tOrVs,
          class A_mma_qk, class A_mma_pv, class A_tSrQ, class A_tSrK, class A_tSrS, class A_S,
          class A_cS_rc, class A_tOrP, class A_tOrV, class A_tOrO, class A_O>
__device__ __forceinline__ void consume_wg0(
    const SparseDecodeParams& p, typename Traits::SharedStorage& smem, int t, int lane, int problem,
    int m_block, const Problem& keys, int2 range, int n_tiles, int first_limit, A_mma_qkr& mma_qkr,
    A_tSrQr& tSrQr, A_tSrKr& tSrKr, A_tSrSr& tSrSr, A_tOrVs& tOrVs, A_mma_qk& mma_qk,
    A_mma_pv& mma_pv, A_tSrQ& tSrQ, A_tSrK& tSrK, A_tSrS& tSrS, A_S& S, A_cS_rc& cS_rc,
    A_tOrP& tOrP, A_tOrV& tOrV, A_tOrO& tOrO, A_O& O, const int (&mrow)[2], float sl2,
    float (&m_run)[2], float (&l_run)[2], float (&m_true)[2]) {
  using namespace cute;
  using Element = typename Traits::Element;
  using KElement = typename Traits::KElement;  // Q, K and P in the MMAs (fp16 with kFp16)
  constexpr bool kDense = Traits::kDense;
  constexpr bool kSlots = Traits::kSlots;
  bool fused_bad;
  const float fused_cs = fused_q_prefetch<Traits>(p, problem, t, fused_bad);
  load_q<Traits>(p, smem, problem, m_block, t);
  fused_q<Traits>(p, smem, t, fused_cs, fused_bad);
  if constexpr (kDense) {  // the rows' query tokens, heads and limits, divided out once
    if (t < 64) {
      const Row r = row_of<kDense>(p, problem, m_block * 64 + t);
      smem.row_limit[t] = row_limit<kDense>(p, keys, r);
      smem.row_code[t] = r.ok ? static_cast<uint32_t>(r.j) << 16 | r.h : ~0u;
    }
  }
  if constexpr (Traits::kFp16) {
    bar_sync(kBarQ, 128);  // every thread's Q stores before the rows are read
    q_rows_to_fp16<Traits>(smem, t);
    if (t < 4) smem.o_exp[t] = -60;
  }
  fence_async_smem();
  bar_sync(kBarQ, 128);
  const float max_thr = 8.f / sl2;
  {
    for (int kk = 0; kk < n_tiles; ++kk) {
      const int stage = Traits::kRing ? 0 : kk & 1;
      if constexpr (Traits::kRing) {
        // S = Q K^T round by round, each as soon as its keys are decoded; the previous tile's
        // P V over round 1 (issued before) completes under round 0's and hands round 1 back.
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          Tensor S_r = make_tensor(tSrS.data() + r * size(tSrSr), tSrSr.layout());
          const int n = 2 * kk + r;  // (the round slots: round n is in slot n % 3)
          wait_full(&smem.full[kSlots ? n % 3 : r], kSlots ? (n / 3) & 1 : kk & 1, false);
          warpgroup_fence_operand(S_r);
          warpgroup_arrive();
          // (Q's descriptors formed afresh each round: held across both, they spill WG0)
          auto tSrQ_r = at_offset(tSrQr, 0);
          auto tSrK_r = at_offset(tSrKr, kSlots ? (n % 3) * Traits::kSlotBytes : r * 32 * 128);
#pragma unroll
          for (int k = 0; k < Traits::kHeadDimQK / 16; ++k) {
            if constexpr (Traits::kRopeBf16) {
              if (k >= 32) {  // d 576's RoPE piece: bf16 (traits.h kFp16)
                typename Traits::TiledMmaQKRoundBf16 mma_rope;
                auto thr_rope = mma_rope.get_thread_slice(t);
                auto tSrQb = thr_rope.partition_fragment_A(
                    make_tensor(make_smem_ptr(smem.q), typename Traits::SmemLayoutQ{}));
                auto tSrKb =
                    at_offset(thr_rope.partition_fragment_B(make_tensor(
                                  make_smem_ptr(smem.k[0]), typename Traits::SmemLayoutKRound{})),
                              (n % 3) * Traits::kSlotBytes);
                mma_rope.accumulate_ = GMMA::ScaleOut::One;
                gemm(mma_rope, tSrQb(_, _, k), tSrKb(_, _, k), S_r);
                continue;
              }
            }
            mma_qkr.accumulate_ = k == 0 ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
            gemm(mma_qkr, tSrQ_r(_, _, k), tSrK_r(_, _, k), S_r);
          }
          warpgroup_commit_batch();
          if (r == 0 && kk > 0) {
            warpgroup_wait<1>();
            release_stage(&smem.empty[kSlots ? (n + 2) % 3 : 1], lane, false);  // round n - 1
          }
        }
      } else {
        wait_full(&smem.full[stage], (kk >> 1) & 1, p.pair);
        // S = Q K^T. The previous tile's PV (issued before it) completes first: its stage goes
        // back to the producer while this QK^T still runs, so the next fill starts a QK^T
        // earlier.
        warpgroup_fence_operand(tSrS);
        warpgroup_arrive();
        auto tSrK_s = at_offset(tSrK, stage * Traits::kStageBytes);
#pragma unroll
        for (int k = 0; k < Traits::kHeadDimQK / 16; ++k) {
          mma_qk.accumulate_ = k == 0 ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
          gemm(mma_qk, tSrQ(_, _, k), tSrK_s(_, _, k), tSrS);
        }
        warpgroup_commit_batch();
        if (kk > 0) {
          warpgroup_wait<1>();
          release_stage(&smem.empty[stage ^ 1], lane, p.pair);
        }
      }
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);
      warpgroup_fence_operand(tOrO);
      // kFp16: key j of the tile (round slot s0 or s1) and its exponent.
      [[maybe_unused]] auto key_exp = [&](int c) {
        const int key = get<1>(cS_rc(0, c));
        return static_cast<int>(
            smem.key_exp[32 * (key < 32 ? (2 * kk) % 3 : (2 * kk + 1) % 3) + (key & 31)]);
      };
      [[maybe_unused]] int e_tile = -60;
      if constexpr (Traits::kFp16) {  // S back to the true scores; the tile's largest exponent
        int q_exp[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) q_exp[r] = __float_as_int(smem.row_sum[mrow[r]]);
#pragma unroll
        for (int c = 0; c < size<1>(S); ++c) {
          const int e = key_exp(c);
          e_tile = max(e_tile, e);
#pragma unroll
          for (int r = 0; r < 2; ++r) S(r, c) *= exp2_int(q_exp[r] + e);
        }
        e_tile = max(e_tile, __shfl_xor_sync(0xffffffffu, e_tile, 1));
        e_tile = max(e_tile, __shfl_xor_sync(0xffffffffu, e_tile, 2));
      }
      // Keys the producer found invalid (or past the list's count) never count, nor keys past
      // a row's causal limit (dense mode, s_q > 1).
      uint64_t valid;
      if constexpr (kSlots) {
        valid = slots_valid(smem.valid[0], (2 * kk) % 3, (2 * kk + 1) % 3);
      } else {
        valid = stage_valid(smem.valid[stage]);
      }
      const int pos0 = 64 * (range.x + kk);
      const bool cut_rows = kDense && first_limit - pos0 < 64;
      mask_scores(S, cS_rc, valid, cut_rows, [&](int r) { return smem.row_limit[mrow[r]] - pos0; });
      float factor[2], base[2], sum[2];
      running_max_step(S, max_thr, sl2, m_true, m_run, base, factor);
      if constexpr (Traits::kFp16) {
        // O's units move to the largest exponent so far (its rows times 2^(e_ref - e_next),
        // beside the softmax factor; the row sums only by that), then P's column j times
        // 2^(e_j - e_ref) <= 1.
        int* const e_ref = smem.o_exp + t / 32;
        const int e_prev = *e_ref, e_next = max(e_prev, e_tile);
        const float ratio = exp2_int(e_prev - e_next);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          l_run[r] *= factor[r];
          factor[r] *= ratio;
        }
        *e_ref = e_next;
        // (read back each time, volatile: a register held through the softmax spills WG0)
        softmax_to_p_cols<KElement>(S, tSrS, base, sl2, sum, tOrP, [&](int c) {
          return exp2_int(key_exp(c) - *static_cast<volatile int*>(e_ref));
        });
#pragma unroll
        for (int r = 0; r < 2; ++r) l_run[r] += sum[r];
      } else {
        softmax_to_p<Element>(S, tSrS, base, sl2, sum, tOrP);
#pragma unroll
        for (int r = 0; r < 2; ++r) l_run[r] = l_run[r] * factor[r] + sum[r];
      }
      if constexpr (kSlots && Traits::kPInKTile) {
        store_p_halves(slot_rope<Traits>(smem, (2 * kk) % 3),
                       slot_rope<Traits>(smem, (2 * kk + 1) % 3), tOrP, t);
      } else {
        store_p(p_buffer<Traits>(smem, stage), tOrP, t);
      }
      smem.rescale[stage][t] = make_float2(factor[0], factor[1]);
      bar_arrive(stage == 0 ? kBarP0 : kBarP1, 256);
      rescale_rows_if(O, factor);
      if constexpr (kSlots) {
        const int s0 = (2 * kk) % 3;
        gemm_pv_by_slots(mma_pv, tOrP, at_offset(tOrVs, s0 * Traits::kSlotBytes),
                         at_offset(tOrVs, (2 * kk + 1) % 3 * Traits::kSlotBytes), tOrO);
        warpgroup_wait<1>();
        // round 0's keys (round 1's: above)
        release_stage(&smem.empty[s0], lane, false);
      } else if constexpr (Traits::kRing) {
        gemm_pv_by_round(mma_pv, tOrP, tOrV, tOrO);
        warpgroup_wait<1>();
        release_stage(&smem.empty[0], lane, false);  // round 0's keys (round 1's: above)
      } else {
        gemm_pv(mma_pv, tOrP, at_offset(tOrV, stage * Traits::kStageBytes), tOrO);
      }
    }
  }
  wait_pv(tOrO, tOrP);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] = quad_sum(l_run[r]);
    if (lane % 4 == 0) smem.row_sum[mrow[r]] = l_run[r];
  }
}

// The standard order's WG1 (consume.cuh): per tile P and the factors from WG0, O_R *= factor,
// O_R += P V_R, the tile's keys handed back.
template <class Traits, class A_mma_pv, class A_tOrP, class A_tOrV, class A_tOrVs, class A_tOrO,
          class A_O>
__device__ __forceinline__ void consume_wg1(const SparseDecodeParams& p,
                                            typename Traits::SharedStorage& smem, int t, int lane,
                                            int n_tiles, A_mma_pv& mma_pv, A_tOrP& tOrP,
                                            A_tOrV& tOrV, A_tOrVs& tOrVs, A_tOrO& tOrO, A_O& O) {
  using namespace cute;
  constexpr bool kSlots = Traits::kSlots;
  {
    for (int kk = 0; kk < n_tiles; ++kk) {
      const int stage = Traits::kRing ? 0 : kk & 1;
      bar_sync(stage == 0 ? kBarP0 : kBarP1, 256);
      if constexpr (kSlots) {
        wait_full(&smem.full[(2 * kk) % 3], (2 * kk / 3) & 1, false);
        wait_full(&smem.full[(2 * kk + 1) % 3], ((2 * kk + 1) / 3) & 1, false);
      } else if constexpr (Traits::kRing) {
        wait_full(&smem.full[0], kk & 1, false);
        wait_full(&smem.full[1], kk & 1, false);
      } else {
        wait_full(&smem.full[stage], (kk >> 1) & 1, p.pair);
      }
      if constexpr (kSlots && Traits::kPInKTile) {
        load_p_halves(slot_rope<Traits>(smem, (2 * kk) % 3),
                      slot_rope<Traits>(smem, (2 * kk + 1) % 3), tOrP, t);
      } else {
        load_p(p_buffer<Traits>(smem, stage), tOrP, t);
      }
      const float2 f = smem.rescale[stage][t];
      const float factor[2] = {f.x, f.y};
      rescale_rows_if(O, factor);
      if constexpr (kSlots) {  // each round's keys handed back as its P V completes
        const int s0 = (2 * kk) % 3, s1 = (2 * kk + 1) % 3;
        gemm_pv_by_slots(mma_pv, tOrP, at_offset(tOrVs, s0 * Traits::kSlotBytes),
                         at_offset(tOrVs, s1 * Traits::kSlotBytes), tOrO);
        warpgroup_wait<1>();
        release_stage(&smem.empty[s0], lane, false);
        wait_pv(tOrO, tOrP);
        release_stage(&smem.empty[s1], lane, false);
      } else if constexpr (Traits::kRing) {  // each round's keys handed back as its P V completes
        gemm_pv_by_round(mma_pv, tOrP, tOrV, tOrO);
        warpgroup_wait<1>();
        release_stage(&smem.empty[0], lane, false);
        wait_pv(tOrO, tOrP);
        release_stage(&smem.empty[1], lane, false);
      } else {
        gemm_pv(mma_pv, tOrP, at_offset(tOrV, stage * Traits::kStageBytes), tOrO);
        wait_pv(tOrO, tOrP);
        release_stage(&smem.empty[stage], lane, p.pair);
      }
    }
  }
}

}  // namespace sparse_decode_detail
}  // namespace openmla::cuda::sm90
