// Register fragments through memory, shared by the SM90 attention kernels (first user:
// dense_decode/kernel.cuh): P between the two compute warpgroups, and the normalised O to Q's
// shared memory for a TMA store (stmatrix) or to `out` as 16-byte stores.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

#include "cuda/common/quad_transpose.cuh"
#include "cuda/sm90/attention/primitives.cuh"

namespace openmla::cuda::sm90 {
namespace attention {

// P fragments cross between the warpgroups thread-major: word 4j..4j+3 of thread t is the 16 B
// at (j * 128 + t) * 16, so a warp's accesses are 512 contiguous bytes (no bank conflicts).
template <class TP>
__device__ __forceinline__ void store_p(void* buf, TP& tOrP, int t) {
  using namespace cute;
  Tensor P32 = recast<uint32_t>(tOrP);
  uint4* dst = static_cast<uint4*>(buf);
#pragma unroll
  for (int j = 0; j < size(P32) / 4; ++j) {
    dst[j * 128 + t] = make_uint4(P32(4 * j), P32(4 * j + 1), P32(4 * j + 2), P32(4 * j + 3));
  }
}
template <class TP>
__device__ __forceinline__ void load_p(const void* buf, TP& tOrP, int t) {
  using namespace cute;
  Tensor P32 = recast<uint32_t>(tOrP);
  const uint4* src = static_cast<const uint4*>(buf);
#pragma unroll
  for (int j = 0; j < size(P32) / 4; ++j) {
    const uint4 v = src[j * 128 + t];
    P32(4 * j) = v.x;
    P32(4 * j + 1) = v.y;
    P32(4 * j + 2) = v.z;
    P32(4 * j + 3) = v.w;
  }
}

// The same with the fragment's first half (P's k-blocks 0, 1: keys 0-31) at `lo` and its
// second at `hi`, 4 KB each (sparse decode's round slots keep each half beside its keys).
template <class TP>
__device__ __forceinline__ void store_p_halves(void* lo, void* hi, TP& tOrP, int t) {
  using namespace cute;
  Tensor P32 = recast<uint32_t>(tOrP);
  constexpr int kHalf = decltype(size(P32))::value / 8;
#pragma unroll
  for (int j = 0; j < 2 * kHalf; ++j) {
    uint4* dst = static_cast<uint4*>(j < kHalf ? lo : hi);
    dst[(j % kHalf) * 128 + t] =
        make_uint4(P32(4 * j), P32(4 * j + 1), P32(4 * j + 2), P32(4 * j + 3));
  }
}
template <class TP>
__device__ __forceinline__ void load_p_halves(const void* lo, const void* hi, TP& tOrP, int t) {
  using namespace cute;
  Tensor P32 = recast<uint32_t>(tOrP);
  constexpr int kHalf = decltype(size(P32))::value / 8;
#pragma unroll
  for (int j = 0; j < 2 * kHalf; ++j) {
    const uint4 v = static_cast<const uint4*>(j < kHalf ? lo : hi)[(j % kHalf) * 128 + t];
    P32(4 * j) = v.x;
    P32(4 * j + 1) = v.y;
    P32(4 * j + 2) = v.z;
    P32(4 * j + 3) = v.w;
  }
}

// One row of this thread's half of O (row i of the accumulator, already normalised) into `out`
// (the row's first column of this warpgroup's half) as 16-byte stores. The 4 lanes of a quad
// hold the row's n-blocks of 8 columns, 2 columns each (lane q: columns 8 nb + 2 q, + 1); a 4 x 4
// transpose inside the quad per 4 n-blocks (4 shuffles) gives lane q all 8 columns of n-block
// 4 g + q. Four times fewer store instructions than one 4-byte store a column pair, each a warp
// writing 8 rows x 64 contiguous bytes. Every lane shuffles; only `store` lanes write.
template <class Element, class TO>
__device__ __forceinline__ void store_row_16B(char* out, TO const& O, int i, int q, bool store) {
  using namespace cute;
  constexpr int kBlocks = size<1>(TO{}.layout()) / 2;  // n-blocks of 8 columns in the row
  static_assert(kBlocks % 4 == 0);
#pragma unroll
  for (int g = 0; g < kBlocks / 4; ++g) {
    uint32_t a[4];  // a[k]: this lane's 2 columns of n-block 4 g + k
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int j = 2 * (4 * g + k);
      a[k] = pack2<Element>(O(i, j), O(i, j + 1));
    }
    const uint4 v = quad_transpose(a, q);
    if (store) *reinterpret_cast<uint4*>(out + (8 * (4 * g + q)) * 2) = v;
  }
}

// This warpgroup's half of O (64 rows x 256 dims, already normalised) as Element into pieces
// 4 wg .. 4 wg + 3 of Q's shared memory (`sq`: 64 rows x 64 dims a piece, 128 B rows, 16-byte
// chunk c of row r at chunk c ^ (r % 8): TMA's 128 B swizzle), for a TMA store. By stmatrix x4:
// the accumulator's fragment is stmatrix's (lane t: row t / 4, columns 2 (t % 4), + 1 of an 8 x 8
// block), so no shuffles; matrices 0-3 are rows +0 / +8 of n-blocks 2k / 2k + 1, lanes 8 j ..
// 8 j + 7 addressing matrix j's rows, and 8 rows of one 16-byte chunk land on 8 distinct banks.
template <class Element, class TO>
__device__ __forceinline__ void stage_out_smem(void* sq, TO const& O, int wg, int warp_in_wg,
                                               int lane) {
  using namespace cute;
  constexpr int kBlocks = size<1>(TO{}.layout()) / 2;  // n-blocks of 8 columns (32)
  static_assert(kBlocks % 2 == 0);
  const int row = 16 * warp_in_wg + ((lane >> 3) & 1) * 8 + (lane & 7);
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(sq)) + row * 128;
  const int block0 = wg * kBlocks + (lane >> 4);  // this lane's n-block over 512 dims, k = 0
#pragma unroll
  for (int k = 0; k < kBlocks / 2; ++k) {
    const int cb = block0 + 2 * k;
    const uint32_t addr = base + (cb >> 3) * 8192 + (((cb & 7) ^ (lane & 7)) << 4);
    const uint32_t r0 = pack2<Element>(O(0, 4 * k), O(0, 4 * k + 1));
    const uint32_t r1 = pack2<Element>(O(1, 4 * k), O(1, 4 * k + 1));
    const uint32_t r2 = pack2<Element>(O(0, 4 * k + 2), O(0, 4 * k + 3));
    const uint32_t r3 = pack2<Element>(O(1, 4 * k + 2), O(1, 4 * k + 3));
    asm volatile("stmatrix.sync.aligned.x4.m8n8.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr),
                 "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
  }
}

}  // namespace attention
}  // namespace openmla::cuda::sm90
