// The compute warpgroups' seesaw order (consume.cuh): each computes S for alternate tiles and
// both tiles' P V for its half of d_v; sparse prefill's staggered maxima (kStagger).
#pragma once

#include "cuda/sm90/sparse_decode/consume_parts.cuh"

namespace openmla::cuda::sm90 {
namespace sparse_decode_detail {

// The seesaw order (traits.h kSeesaw; bf16 tiles by cp.async, the sparse mode), both compute
// warpgroups: the loop over the split's tiles and the row sums into smem.row_sum.
template <class Traits, class A_mma_qk, class A_mma_pv, class A_tSrQ, class A_tSrK, class A_tSrS,
          class A_S, class A_cS_rc, class A_tOrP, class A_tOrV, class A_tOrO, class A_O>
__device__ __forceinline__ void consume_seesaw(const SparseDecodeParams& p,
                                               typename Traits::SharedStorage& smem, int wg, int t,
                                               int lane, int problem, int m_block, int n_tiles,
                                               A_mma_qk& mma_qk, A_mma_pv& mma_pv, A_tSrQ& tSrQ,
                                               A_tSrK& tSrK, A_tSrS& tSrS, A_S& S, A_cS_rc& cS_rc,
                                               A_tOrP& tOrP, A_tOrV& tOrV, A_tOrO& tOrO, A_O& O,
                                               const int (&mrow)[2], float sl2, float (&m_run)[2],
                                               float (&l_run)[2], float (&m_true)[2]) {
  using namespace cute;
  using Element = typename Traits::Element;
  // Seesaw order (bf16 tiles by cp.async, the sparse mode; launch.cu): WG w computes S for the
  // tiles of stage w (WG0 even, WG1 odd), the two share their row maxima, and each adds both
  // tiles' P V for its half of d_v, its own P from registers and the other's through shared
  // memory. The tensor pipe's work per tile is split evenly (a QK^T and half of two PVs each),
  // where the default order gives WG0 the QK^T and PV_L and WG1 only PV_R. A stage's halves
  // have barriers of their own (fill_rows.cuh produce_halves): L (dims 0-255) is read by the
  // owner's QK^T and WG0's PVs, R (the rest) by the owner's QK^T and WG1's PVs, so each half
  // goes back to the producer as soon as its readers are done.
  if (wg == 0) {
    bool fused_bad;
    const float fused_cs = fused_q_prefetch<Traits>(p, problem, t, fused_bad);
    load_q<Traits>(p, smem, problem, m_block, t);
    fused_q<Traits>(p, smem, t, fused_cs, fused_bad);
    fence_async_smem();
  }
  bar_sync(kBarQ, 256);
  float* xmax = reinterpret_cast<float*>(smem.rescale);  // [wg][64 rows]; WG1's sums at 128
  const float max_thr = 8.f / sl2;
  const int own = wg, other = wg ^ 1;               // this warpgroup's stage (its S), the other's
  const int first_half = wg, second_half = wg ^ 1;  // WG0 waits for L first, WG1 for R
  // The half of each stage this warpgroup's PVs read (L for WG0, R for WG1); the owner's QK^T
  // also reads the other half of its own stage.
  const int pv_half = wg;
  // S += Q K^T over half `kHalf` of this warpgroup's stage (the first half zeroes S).
  auto qk_half = [&](auto half, bool first) {
    constexpr int kHalf = decltype(half)::value;
    constexpr int k0 = kHalf == 0 ? 0 : 16, k1 = kHalf == 0 ? 16 : Traits::kHeadDimQK / 16;
    auto tSrK_s = at_offset(tSrK, own * Traits::kStageBytes);
#pragma unroll
    for (int k = k0; k < k1; ++k) {
      mma_qk.accumulate_ = first && k == k0 ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
      gemm(mma_qk, tSrQ(_, _, k), tSrK_s(_, _, k), tSrS);
    }
  };
  // WG0 reads its stage's L half first, WG1 its R half (the producer's order: L0 R1 R0 L1).
  auto qk_first = [&] {
    if (wg == 0) {
      qk_half(std::integral_constant<int, 0>{}, true);
    } else {
      qk_half(std::integral_constant<int, 1>{}, true);
    }
  };
  auto qk_second = [&] {
    if (wg == 0) {
      qk_half(std::integral_constant<int, 1>{}, false);
    } else {
      qk_half(std::integral_constant<int, 0>{}, false);
    }
  };
  // S = Q K^T of this warpgroup's tile (stage `own`), the keys the mask drops set to -inf, and
  // its row maxima. The owner's QK^T is then done with the half its PVs do not read. Each wait
  // sits on the one path through, so ptxas sees no wgmma in flight past it (C7515).
  auto own_qk = [&](int phase, float(&mx)[2]) {
    wait_full(&smem.full[2 * own + first_half], phase, false);
    warpgroup_fence_operand(tSrS);
    warpgroup_arrive();
    qk_first();
    warpgroup_commit_batch();
    wait_full(&smem.full[2 * own + second_half], phase, false);
    warpgroup_arrive();
    qk_second();
    warpgroup_commit_batch();
    warpgroup_wait<0>();
    warpgroup_fence_operand(tSrS);
    const uint64_t valid = stage_valid(smem.valid[own]);  // written with the R half (last part)
    release_stage(&smem.empty[2 * own + (pv_half ^ 1)], lane, false);
    if (valid != ~0ull) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int c = 0; c < size<1>(S); ++c) {
          if (!((valid >> get<1>(cS_rc(r, c))) & 1ull)) S(r, c) = -INFINITY;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) mx[r] = quad_max(row_reduce<true>(S, r));
  };
  const int n_iter = (n_tiles + 1) / 2;
  if constexpr (Traits::kStagger) {
    // Staggered maxima: WG0 sets the round's max from its own tile alone and issues its P V at
    // once; WG1 takes that max, folds in its tile's and publishes the round's final max, so
    // WG1's softmax runs under WG0's P V instead of beside it. WG0 brings O_L and its row sums
    // to the final max after its P V; WG1 scales WG0's P as it loads it. With the lazy max the
    // final max is nearly always WG0's, and both corrections are skipped.
    // One loop for both warpgroups, so own_qk is inlined at one call site (two left its wgmmas
    // in a function of their own, serialised).
    // An odd count's last round has a stage-1 tile too, every key masked (the producer fills
    // it with zeros): no path in the round depends on a tile count (with such branches WG1
    // spilled).
    for (int it = 0; it < n_iter; ++it) {
      float mx[2];
      own_qk(it & 1, mx);
      float base[2], factor[2], sum[2] = {0.f, 0.f};
      if (wg == 0) {
        float m_first[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          m_true[r] = fmaxf(m_true[r], mx[r]);
          m_first[r] = lazy_max(m_run[r], mx[r], max_thr);
          base[r] = max_base(m_first[r], sl2);
          factor[r] = exp2_approx(m_run[r] * sl2 - base[r]);
        }
        if (lane % 4 == 0) {
#pragma unroll
          for (int r = 0; r < 2; ++r) xmax[mrow[r]] = m_first[r];
        }
        bar_arrive(kBarMax, 256);
        softmax_to_p<Element>(S, tSrS, base, sl2, sum, tOrP);
        store_p(seesaw_p_buffer<Traits>(smem, 0), tOrP, t);
        bar_arrive(kBarP0, 256);
#pragma unroll
        for (int r = 0; r < 2; ++r) l_run[r] = l_run[r] * factor[r] + sum[r];
        rescale_rows(O, factor);
        gemm_pv(mma_pv, tOrP, tOrV, tOrO);
        wait_pv(tOrO, tOrP);
        release_stage(&smem.empty[0], lane, false);  // L0
        bar_sync(kBarMaxFinal, 256);                 // WG1's final max of the round
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          m_run[r] = xmax[64 + mrow[r]];
          // 1 exactly when the max stayed (x - x); 0 when no key was seen yet (O_L is 0)
          factor[r] = exp2_approx(m_first[r] * sl2 - max_base(m_run[r], sl2));
          l_run[r] *= factor[r];
        }
        rescale_rows_if(O, factor);
        bar_sync(kBarP1, 256);
        load_p(seesaw_p_buffer<Traits>(smem, 1), tOrP, t);
        gemm_pv(mma_pv, tOrP, at_offset(tOrV, Traits::kStageBytes), tOrO);
        wait_pv(tOrO, tOrP);
        release_stage(&smem.empty[2], lane, false);  // L1
      } else {
        bar_sync(kBarMax, 256);  // WG0's max of the round
        float pscale[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float m_first = xmax[mrow[r]];
          m_true[r] = fmaxf(m_true[r], mx[r]);
          const float m_final = lazy_max(m_first, mx[r], max_thr);
          base[r] = max_base(m_final, sl2);
          factor[r] = exp2_approx(m_run[r] * sl2 - base[r]);
          pscale[r] = exp2_approx(m_first * sl2 - base[r]);  // WG0's P to the final max
          m_run[r] = m_final;
        }
        if (lane % 4 == 0) {
#pragma unroll
          for (int r = 0; r < 2; ++r) xmax[64 + mrow[r]] = m_run[r];
        }
        bar_arrive(kBarMaxFinal, 256);
        softmax_to_p<Element>(S, tSrS, base, sl2, sum, tOrP);
        store_p(seesaw_p_buffer<Traits>(smem, 1), tOrP, t);
        bar_arrive(kBarP1, 256);
#pragma unroll
        for (int r = 0; r < 2; ++r) l_run[r] = l_run[r] * factor[r] + sum[r];
        rescale_rows(O, factor);
        gemm_pv(mma_pv, tOrP, at_offset(tOrV, Traits::kStageBytes), tOrO);
        wait_pv(tOrO, tOrP);
        release_stage(&smem.empty[3], lane, false);  // R1
        bar_sync(kBarP0, 256);
        load_p(seesaw_p_buffer<Traits>(smem, 0), tOrP, t);
        if (__any_sync(0xffffffffu, pscale[0] != 1.f || pscale[1] != 1.f)) {
          // Through S's registers (free here): the fragment's word k holds S's flat 2k, 2k+1.
          Tensor P32 = recast<uint32_t>(tOrP);
#pragma unroll
          for (int k = 0; k < size(P32); ++k) {
            tSrS(2 * k) = __uint_as_float(P32(k) << 16);
            tSrS(2 * k + 1) = __uint_as_float(P32(k) & 0xFFFF0000u);
          }
          rescale_rows(S, pscale);
#pragma unroll
          for (int k = 0; k < size(P32); ++k) {
            P32(k) = pack2<Element>(tSrS(2 * k), tSrS(2 * k + 1));
          }
        }
        gemm_pv(mma_pv, tOrP, tOrV, tOrO);
        wait_pv(tOrO, tOrP);
        release_stage(&smem.empty[1], lane, false);  // R0
      }
    }
  } else {
    for (int it = 0; it < n_iter; ++it) {
      // With an odd tile count WG1 has no tile in the last round.
      const bool mine = 2 * it + wg < n_tiles, theirs = 2 * it + other < n_tiles;
      float mx[2] = {-INFINITY, -INFINITY};
      if (mine) own_qk(it & 1, mx);
      // Both warpgroups derive the same running max from both tiles' row maxima.
      if (lane % 4 == 0) {
#pragma unroll
        for (int r = 0; r < 2; ++r) xmax[wg * 64 + mrow[r]] = mx[r];
      }
      bar_sync(kBarMax, 256);
      float factor[2], base[2], sum[2] = {0.f, 0.f};
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float o = xmax[other * 64 + mrow[r]];
        const float both = wg == 0 ? fmaxf(mx[r], o) : fmaxf(o, mx[r]);  // the same in both
        m_true[r] = fmaxf(m_true[r], both);
        const float m_new = lazy_max(m_run[r], both, max_thr);
        base[r] = max_base(m_new, sl2);
        factor[r] = exp2_approx(m_run[r] * sl2 - base[r]);
        m_run[r] = m_new;
      }
      if (mine) {
        softmax_to_p<Element>(S, tSrS, base, sl2, sum, tOrP);
        store_p(seesaw_p_buffer<Traits>(smem, own), tOrP, t);
        bar_arrive(wg == 0 ? kBarP0 : kBarP1, 256);
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) l_run[r] = l_run[r] * factor[r] + sum[r];
      rescale_rows(O, factor);
      if (mine) {
        gemm_pv(mma_pv, tOrP, at_offset(tOrV, own * Traits::kStageBytes), tOrO);
        wait_pv(tOrO, tOrP);
        release_stage(&smem.empty[2 * own + pv_half], lane, false);
      }
      if (theirs) {
        bar_sync(wg == 0 ? kBarP1 : kBarP0, 256);
        load_p(seesaw_p_buffer<Traits>(smem, other), tOrP, t);
        gemm_pv(mma_pv, tOrP, at_offset(tOrV, other * Traits::kStageBytes), tOrO);
        wait_pv(tOrO, tOrP);
        release_stage(&smem.empty[2 * other + pv_half], lane, false);
      }
    }
  }
  // The row sums: each warpgroup's over its own tiles, in the same running max's units.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] = quad_sum(l_run[r]);
    if (wg == 1 && lane % 4 == 0) {
      xmax[128 + mrow[r]] = l_run[r];
      // The stagger's maxima are each warpgroup's own tiles' (WG0's slot is read by now).
      if constexpr (Traits::kStagger) xmax[mrow[r]] = m_true[r];
    }
  }
  bar_sync(kBarMax, 256);
  if (wg == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if constexpr (Traits::kStagger) m_true[r] = fmaxf(m_true[r], xmax[mrow[r]]);
      if (lane % 4 == 0) smem.row_sum[mrow[r]] = l_run[r] + xmax[128 + mrow[r]];
    }
  }
}

}  // namespace sparse_decode_detail
}  // namespace openmla::cuda::sm90
