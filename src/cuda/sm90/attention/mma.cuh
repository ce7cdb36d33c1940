// The two products of the SM90 attention kernels (first user: dense_decode/kernel.cuh): S = Q K^T
// piece by piece as a stage's pieces land, O += P V with P from registers; and the accumulator
// and descriptor views they use. gemm_qk reads a family's traits: kNumParts, kPieceDims,
// part_order(stage, i), part_first_piece(part), part_pieces(part) (dense_decode/traits.h).
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>

namespace openmla::cuda::sm90 {
namespace attention {

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

// S = Q K^T of stage `kStage`'s tile, piece by piece as each lands, in the stage's part order,
// one wgmma group per part. After the first part's group (RoPE) `after_first_part` runs with at
// most that group pending: every wgmma issued before this QK^T (the other tile's PV) is done then.
// (After the first part, not the second: WG0's callback hands stage 1's V left back, and waiting
// for stage 0's V left to land first held WG1's next S and its hand-off: -3.0% at h_q 128 L 4096,
// session 12.)
// kIssueOnly: every part issued and committed, nothing waited for (the caller waits).
template <class Traits, int kStage, bool kIssueOnly = false, class Mma, class TQ, class TK,
          class TS, class F>
__device__ __forceinline__ void gemm_qk(Mma& mma, TQ const& tSrQ, TK const& tSrK, TS& tSrS,
                                        uint64_t* full, uint32_t phase, F&& after_first_part) {
  using namespace cute;
  constexpr int kSteps = Traits::kPieceDims / 16;
  warpgroup_fence_operand(tSrS);
#pragma unroll
  for (int i = 0; i < Traits::kNumParts; ++i) {
    const int part = Traits::part_order(kStage, i);
    // One fence a part: between a part's pieces only barrier waits come, no register writes.
    // (A fence a piece made ptxas close a wgmma group a piece, so the wait below for the other
    // tile's PV waited for this QK^T's earlier pieces too.)
    cutlass::arch::ClusterBarrier::wait(&full[Traits::part_first_piece(part)], phase);
    warpgroup_arrive();
#pragma unroll
    for (int c = Traits::part_first_piece(part);
         c < Traits::part_first_piece(part) + Traits::part_pieces(part); ++c) {
      if (c != Traits::part_first_piece(part)) cutlass::arch::ClusterBarrier::wait(&full[c], phase);
#pragma unroll
      for (int kk = 0; kk < kSteps; ++kk) {
        const bool first = i == 0 && c == Traits::part_first_piece(part) && kk == 0;
        mma.accumulate_ = first ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
        gemm(mma, tSrQ(_, _, c * kSteps + kk), tSrK(_, _, c * kSteps + kk), tSrS);
      }
    }
    warpgroup_commit_batch();
    if (!kIssueOnly && i == 0) {
      warpgroup_wait<1>();
      after_first_part();
    }
  }
  if constexpr (!kIssueOnly) {
    warpgroup_wait<0>();
    warpgroup_fence_operand(tSrS);
  }
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

// O += P V as two wgmma groups, over a 64-key tile's keys 0-31 (k-blocks 0, 1) and 32-63 (2, 3),
// so the first half's keys can be handed back while the second runs (sparse decode's ring fill:
// warpgroup_wait<1> then means the first half is done).
// The groups' frame: `issue_k(k)` issues k-block k's wgmma (its V from one stage or two slots).
template <class Mma, class TP, class TO, class IssueK>
__device__ __forceinline__ void pv_by_round_groups(Mma& mma, TP& tOrP, TO& tOrO, IssueK&& issue_k) {
  using namespace cute;
  static_assert(decltype(size<2>(tOrP))::value == 4, "a 64-key tile in four k16 blocks");
  warpgroup_fence_operand(tOrP);
  warpgroup_fence_operand(tOrO);
  warpgroup_arrive();
  mma.accumulate_ = GMMA::ScaleOut::One;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
#pragma unroll
    for (int k = 2 * half; k < 2 * half + 2; ++k) issue_k(k);
    warpgroup_commit_batch();
  }
}
template <class Mma, class TP, class TV, class TO>
__device__ __forceinline__ void gemm_pv_by_round(Mma& mma, TP& tOrP, TV const& tOrV, TO& tOrO) {
  using cute::_;
  pv_by_round_groups(mma, tOrP, tOrO,
                     [&](int k) { cute::gemm(mma, tOrP(_, _, k), tOrV(_, _, k), tOrO); });
}
// The same with the halves' V in two round slots (32 keys each: k-blocks 0, 1 of each).
template <class Mma, class TP, class TV, class TO>
__device__ __forceinline__ void gemm_pv_by_slots(Mma& mma, TP& tOrP, TV const& tOrV0,
                                                 TV const& tOrV1, TO& tOrO) {
  using cute::_;
  pv_by_round_groups(mma, tOrP, tOrO, [&](int k) {
    if (k < 2) {
      cute::gemm(mma, tOrP(_, _, k), tOrV0(_, _, k), tOrO);
    } else {
      cute::gemm(mma, tOrP(_, _, k), tOrV1(_, _, k - 2), tOrO);
    }
  });
}

template <class TO, class TP>
__device__ __forceinline__ void wait_pv(TO& tOrO, TP& tOrP) {
  cute::warpgroup_wait<0>();
  cute::warpgroup_fence_operand(tOrO);
  cute::warpgroup_fence_operand(tOrP);
}

}  // namespace attention
}  // namespace openmla::cuda::sm90
