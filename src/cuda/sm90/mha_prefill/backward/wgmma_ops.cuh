// The wgmma and load plumbing of the backward main kernel (NOTES.md): one product issued over
// all its k-blocks as one committed group, and the tile loads by cp.async with zero fill past
// the sequence.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

#include "cuda/sm90/attention/primitives.cuh"

namespace openmla::cuda::sm90::mha_bwd {

// k-block `kb` of a wgmma operand fragment ((MMA, M|N, K)). A shared-memory operand is one
// descriptor plus a constant per k-block; its base goes through an empty asm first, so the
// compiler cannot hoist every k-block's descriptor of the CTA's loop into live registers (it
// did: 255 registers and spills); each k-block's descriptor is then one add at its use.
template <class Frag>
__device__ __forceinline__ auto kblock(Frag& frag, int kb) {
  using namespace cute;
  if constexpr (is_same_v<remove_cvref_t<decltype(frag.data())>, GMMA::DescriptorIterator>) {
    GmmaDescriptor desc = frag.data().desc_;
    uint32_t lo = desc.reg32_[0];
    asm volatile("" : "+r"(lo));
    desc.reg32_[0] = lo + static_cast<uint32_t>(frag.layout()(0, 0, kb));
    return make_tensor(GMMA::DescriptorIterator{desc}, frag(_, _, kb).layout());
  } else {
    return frag(_, _, kb);
  }
}

// C (+)= A B over every k-block of A and B ((MMA, M|N, K) fragments), issued and committed as
// one wgmma group; not waited for. kZeroInit: C = A B (C's old values ignored).
template <bool kZeroInit, class Mma, class TA, class TB, class TC>
__device__ __forceinline__ void issue_gemm(Mma& mma, TA& a, TB& b, TC& c) {
  using namespace cute;
  // A from registers (RS) or from shared memory (a tensor of wgmma descriptors).
  constexpr bool kARegs =
      !is_same_v<remove_cvref_t<decltype(a.data())>, GMMA::DescriptorIterator>;
  if constexpr (kARegs) warpgroup_fence_operand(a);
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  mma.accumulate_ = kZeroInit ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int kb = 0; kb < size<2>(a); ++kb) {
    gemm(mma, kblock(a, kb), kblock(b, kb), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(c);
  if constexpr (kARegs) warpgroup_fence_operand(a);
}

// Address of element (row, col) of a shared-memory tile at `base` laid out by `Layout`. The
// swizzle of the GMMA layouts acts on the smem pointer, not on the layout's integer offsets:
// `Layout{}(row, col)` alone would be the unswizzled offset (tests/cuda_host checks both).
template <class Layout, class Element>
__host__ __device__ __forceinline__ Element* smem_at(Element* base, int row, int col) {
  using namespace cute;
  auto tile = make_tensor(make_smem_ptr(base), Layout{});
  return raw_pointer_cast(&tile(row, col));
}

// Rows [0, kRows) x cols [0, kCols) of a 16-bit [rows, kCols] tile at `src` (row stride in
// elements, 16 B aligned rows) into shared memory at `dst` laid out by `Layout`, 16 B a
// cp.async; rows >= `valid_rows` are zero-filled (nothing read: their source is row 0).
template <int kRows, int kCols, int kThreads, class Layout, class Element>
__device__ __forceinline__ void load_tile(Element* dst, const Element* src, int64_t row_stride,
                                          int valid_rows, int tid) {
  constexpr int kChunksPerRow = kCols / 8;
  constexpr int kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % kThreads == 0);
  CUTE_UNROLL
  for (int i = 0; i < kChunks / kThreads; ++i) {
    const int c = i * kThreads + tid;
    const int row = c / kChunksPerRow;
    const int col = (c % kChunksPerRow) * 8;
    const bool valid = row < valid_rows;
    const Element* from = src + (valid ? row * row_stride : 0) + col;
    // 8 consecutive elements from a multiple of 8 stay together under every swizzle.
    attention::cp_async16_u32(attention::smem_u32(smem_at<Layout>(dst, row, col)), from, valid);
  }
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

}  // namespace openmla::cuda::sm90::mha_bwd
