// The standard order of the two compute warpgroups (kernel.cuh; NOTES.md), per tile k in stage
// k % 2:
//   WG0: S = Q K^T (the P V of tile k - 1 completes under it, and its stage goes back to the
//        producer), keys the mask drops -> -inf, the running max, P = exp(S - m) in registers
//        then, by stmatrix, in shared memory with O's row factors; O_L *= factor; O_L += P V_L
//        (P from shared memory; issued, completed under the next QK^T)
//   WG1: O_R *= factor; O_R += P V_R (P from shared memory), then its stage goes back.
// Both P Vs read P from shared memory, so no P register is held across the next QK^T.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

#include "cuda/sm90/attention/mma.cuh"
#include "cuda/sm90/attention/primitives.cuh"
#include "cuda/sm90/attention/softmax.cuh"
#include "cuda/sm90/sparse_attention/consumer_common.cuh"
#include "cuda/sm90/sparse_attention/epilogue.cuh"

namespace openmla::cuda::sm90 {
namespace sparse {

template <class Traits>
__device__ __forceinline__ void consume_standard(const SparseAttentionParams& p,
                                                 typename Traits::SharedStorage& smem, int wg,
                                                 int m_block, int split, int problem) {
  using namespace cute;
  using namespace attention;
  using Element = typename Traits::Element;
  constexpr bool kDense = Traits::kDense;
  constexpr int kCluster = Traits::kCluster;
  constexpr int kPieceElems = Traits::kPieceBytes / 2;
  // P of stage s at p_addr0 + s * kPStageBytes: the stage's RoPE piece (d 576) or p[s].
  constexpr int kPStageBytes = Traits::kPInKTile ? Traits::kStageBytes : Traits::kPieceBytes;
  Element* const p0 = Traits::kPInKTile ? smem.k[0] + 8 * kPieceElems : smem.p[0];
  const int t = threadIdx.x - wg * 128;
  const int lane = t % 32;
  const Problem keys = problem_of<kDense>(p, problem);
  const int2 range = split_tiles<kDense>(p, keys, split);
  const int n_tiles = range.y - range.x;

  typename Traits::TiledMmaQK mma_qk;
  typename Traits::TiledMmaPV mma_pv;     // (P's register fragment: the softmax's output)
  typename Traits::TiledMmaPVss mma_pvs;  // P V, P from shared memory
  auto thr_qk = mma_qk.get_thread_slice(t);
  auto thr_pv = mma_pv.get_thread_slice(t);
  auto thr_pvs = mma_pvs.get_thread_slice(t);

  Tensor sQ = make_tensor(make_smem_ptr(smem.q), typename Traits::SmemLayoutQ{});
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);  // (MMA,1,D/16)
  Tensor tSrK = thr_qk.partition_fragment_B(
      make_tensor(make_smem_ptr(smem.k[0]), typename Traits::SmemLayoutK{}));  // (MMA,1,D/16)
  Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<64>, Int<64>>{});
  Tensor S = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));  // (2,16)
  Tensor tScS = thr_qk.partition_C(make_identity_tensor(Shape<Int<64>, Int<64>>{}));
  Tensor cS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));  // (2,16) -> (row,key)

  Tensor sP = make_tensor(make_smem_ptr(p0), typename Traits::SmemLayoutP{});
  Tensor tOrP = thr_pv.partition_fragment_A(sP);  // (MMA,1,4) registers
  Tensor tOsP = thr_pvs.partition_fragment_A(sP);  // (MMA,1,4) descriptors
  Tensor tOsV = thr_pvs.partition_fragment_B(make_tensor(
      make_smem_ptr(smem.k[0] + wg * 4 * kPieceElems), typename Traits::SmemLayoutV{}));
  Tensor tOrO = partition_fragment_C(mma_pv, Shape<Int<64>, Int<Traits::kVHalfDims>>{});
  Tensor O = make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));  // (2,128)
  Tensor tOcO = thr_pv.partition_C(make_identity_tensor(Shape<Int<64>, Int<Traits::kVHalfDims>>{}));
  Tensor cO_rc = make_tensor(tOcO.data(), acc_rowcol(tOcO.layout()));

  int mrow[2];  // the thread's two rows of the m-block
#pragma unroll
  for (int r = 0; r < 2; ++r) mrow[r] = get<0>(cS_rc(r, 0));
  const float sl2 = p.scale_log2;
  clear(tOrO);
  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.f, 0.f};
  float m_true[2] = {-INFINITY, -INFINITY};  // the exact row max (m_run is lazy), for max_logits

  // O += P V over this warpgroup's half of V of `stage`, P from shared memory (issued and
  // committed; each k-block's descriptors formed at its use: held across the loop they spill).
  auto pv_from_smem = [&](int stage) {
    warpgroup_fence_operand(tOrO);
    warpgroup_arrive();
    mma_pvs.accumulate_ = GMMA::ScaleOut::One;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      gemm(mma_pvs, at_offset(tOsP, stage * kPStageBytes)(_, _, k),
           at_offset(tOsV, stage * Traits::kStageBytes)(_, _, k), tOrO);
    }
    warpgroup_commit_batch();
  };

  if (wg == 0) {
    load_q<Traits>(p, smem, problem, m_block, t);
    if constexpr (kDense) {  // the rows' query tokens, heads and limits, divided out once
      if (t < 64) {
        const Row r = row_of<kDense>(p, problem, m_block * 64 + t);
        smem.row_limit[t] = row_limit<kDense>(p, keys, r);
        smem.row_code[t] = r.ok ? static_cast<uint32_t>(r.j) << 16 | r.h : ~0u;
      }
    }
    fence_async_smem();
    bar_sync(kBarQ, 128);
    // Causal dense decode: the keys the m-block's first row may see (rows of later query tokens
    // see more: each row's limit waits in shared memory for the tiles that cut one).
    const int first_limit = row_limit<kDense>(p, keys, row_of<kDense>(p, problem, m_block * 64));
    const float max_thr = 8.f / sl2;
    const uint32_t p_addr0 = smem_u32(p0);
    for (int kk = 0; kk < n_tiles; ++kk) {
      const int stage = kk & 1;
      wait_full<kCluster>(&smem.full[stage], (kk >> 1) & 1);
      warpgroup_fence_operand(tSrS);
      warpgroup_arrive();
      // (Q's descriptors formed afresh each tile: hoisted out of the loop they hold 72 registers)
      auto tSrQ_t = at_offset(tSrQ, 0);
      auto tSrK_s = at_offset(tSrK, stage * Traits::kStageBytes);
#pragma unroll
      for (int k = 0; k < Traits::kHeadDimQK / 16; ++k) {
        mma_qk.accumulate_ = k == 0 ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
        gemm(mma_qk, tSrQ_t(_, _, k), tSrK_s(_, _, k), tSrS);
      }
      warpgroup_commit_batch();
      if (kk > 0) {  // the previous tile's P V is done: its stage goes back
        warpgroup_wait<1>();
        release_stage<kCluster>(&smem.empty[stage ^ 1], lane);
      }
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);
      warpgroup_fence_operand(tOrO);
      // Keys the producer found invalid never count, nor keys past a row's causal limit.
      const int pos0 = 64 * (range.x + kk);
      const bool cut_rows = kDense && first_limit - pos0 < 64;
      mask_scores(S, cS_rc, stage_valid(smem.valid[stage]), cut_rows,
                  [&](int r) { return smem.row_limit[mrow[r]] - pos0; });
      float factor[2], base[2], sum[2];
      running_max_step(S, max_thr, sl2, m_true, m_run, base, factor);
      softmax_to_p<Element>(S, tSrS, base, sl2, sum, tOrP);
#pragma unroll
      for (int r = 0; r < 2; ++r) l_run[r] = l_run[r] * factor[r] + sum[r];
      store_p_swizzled(p_addr0 + stage * kPStageBytes, tOrP, t / 32, lane);
      smem.rescale[stage][t] = make_float2(factor[0], factor[1]);
      fence_async_smem();  // P before the wgmmas (both warpgroups') read it
      bar_arrive(stage == 0 ? kBarP0 : kBarP1, 256);
      rescale_rows_if(O, factor);
      bar_sync(kBarWg0, 128);  // every WG0 warp's part of P is in shared memory
      pv_from_smem(stage);
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(tOrO);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l_run[r] = quad_sum(l_run[r]);
      if (lane % 4 == 0) smem.row_sum[mrow[r]] = l_run[r];
    }
  } else {
    for (int kk = 0; kk < n_tiles; ++kk) {
      const int stage = kk & 1;
      bar_sync(stage == 0 ? kBarP0 : kBarP1, 256);
      wait_full<kCluster>(&smem.full[stage], (kk >> 1) & 1);
      const float2 f = smem.rescale[stage][t];
      const float factor[2] = {f.x, f.y};
      rescale_rows_if(O, factor);
      pv_from_smem(stage);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      release_stage<kCluster>(&smem.empty[stage], lane);
    }
  }
  bar_sync(kBarEpi, 256);
  write_out<Traits>(p, smem, wg, t, m_block, split, problem, O, cO_rc, mrow, m_run, m_true);
}

}  // namespace sparse
}  // namespace openmla::cuda::sm90
