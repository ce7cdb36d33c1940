// Online softmax of the SM90 attention kernels (first user: dense_decode/kernel.cuh): row maxima
// and sums as trees, the lazy running max, O's rescale, and P = exp2(S - m) packed into the A
// fragment of P V. Rows are a wgmma accumulator seen as (2 rows, n cols) a thread (mma.cuh).
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

#include "cuda/sm90/attention/primitives.cuh"

namespace openmla::cuda::sm90 {
namespace attention {

// One level of a reduction tree: v[j] op= v[j + W] for j < W, then the next level.
template <bool kMax, int W>
__device__ __forceinline__ void reduce_levels(float* v) {
#pragma unroll
  for (int j = 0; j < W; ++j) v[j] = kMax ? fmaxf(v[j], v[j + W]) : v[j] + v[j + W];
  if constexpr (W > 1) reduce_levels<kMax, W / 2>(v);
}

// Max (or sum) of row i of this thread's accumulator values, as a tree (a dependent chain put
// 16 operations on the path the other warpgroup waits on). The levels are template recursion:
// `for (w = n / 2; w > 0; w /= 2)` was left rolled at n = 16, with v[] in local memory.
template <bool kMax, class TS>
__device__ __forceinline__ float row_reduce(TS const& S, int i) {
  constexpr int n = cute::size<1>(TS{}.layout());
  float v[n];
#pragma unroll
  for (int j = 0; j < n; ++j) v[j] = S(i, j);
  reduce_levels<kMax, n / 2>(v);
  return v[0];
}

template <class TO>
__device__ __forceinline__ void rescale_rows(TO& O, const float (&scale)[2]) {
  using namespace cute;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int j = 0; j < size<1>(O); ++j) O(i, j) *= scale[i];
  }
}

// O's rows times `scale`, skipped when every factor of the warp is 1 (exact; with the lazy
// running max below nearly every tile after a request's first).
template <class TO>
__device__ __forceinline__ void rescale_rows_if(TO& O, const float (&scale)[2]) {
  if (__any_sync(0xffffffffu, scale[0] != 1.f || scale[1] != 1.f)) rescale_rows(O, scale);
}

// The running max moves only when a tile's row max exceeds it by more than `thr` (2^8 in P's
// units): P is then at most 256 (exact in every 16-bit type's range, fp32 sums), and O rarely
// needs a rescale (FA4's lazy rescaling). -inf (no key yet) always moves.
__device__ __forceinline__ float lazy_max(float m, float tile_max, float thr) {
  return tile_max > m + thr ? tile_max : m;
}

// The running max m as an exp2 exponent offset: rows that have seen no key yet (m = -inf) use 0
// so exp2(-inf - 0) = 0 instead of NaN.
__device__ __forceinline__ float max_base(float m, float scale_log2) {
  return m == -INFINITY ? 0.f : m * scale_log2;
}

// P = exp(S - m) in place (S's accumulator order) and its row sums.
template <class TS>
__device__ __forceinline__ void exp_rows(TS& S, const float (&base)[2], float sl2,
                                         float (&row_sum)[2]) {
  using namespace cute;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int j = 0; j < size<1>(S); ++j) S(i, j) = exp2_approx(S(i, j) * sl2 - base[i]);
    row_sum[i] = row_reduce<false>(S, i);
  }
}
// The accumulator (its flat order, tSrS, compact) packed into the A fragment of P V: the
// accumulator's register order is the fragment's, 2 values a word.
template <class Element, class TAcc, class TP>
__device__ __forceinline__ void pack_p(TAcc const& tSrS, TP& tOrP) {
  using namespace cute;
  static_assert(decltype(size(tSrS))::value == 2 * decltype(size(recast<uint32_t>(tOrP)))::value);
  Tensor P32 = recast<uint32_t>(tOrP);
#pragma unroll
  for (int k = 0; k < size(P32); ++k) P32(k) = pack2<Element>(tSrS(2 * k), tSrS(2 * k + 1));
}

// P = exp(S - m), its row sums, and P packed for P V.
template <class Element, class TS, class TAcc, class TP>
__device__ __forceinline__ void softmax_to_p(TS& S, TAcc const& tSrS, const float (&base)[2],
                                             float sl2, float (&row_sum)[2], TP& tOrP) {
  exp_rows(S, base, sl2, row_sum);
  pack_p<Element>(tSrS, tOrP);
}

// The same with each column of P (after the row sums) times col_scale(j) before packing: sparse
// decode's fp16-staged keys (sparse_decode/traits.h kFp16), whose V rows carry a power of two of
// their own.
template <class Element, class TS, class TAcc, class TP, class ColScale>
__device__ __forceinline__ void softmax_to_p_cols(TS& S, TAcc const& tSrS, const float (&base)[2],
                                                  float sl2, float (&row_sum)[2], TP& tOrP,
                                                  ColScale&& col_scale) {
  using namespace cute;
  exp_rows(S, base, sl2, row_sum);
#pragma unroll
  for (int j = 0; j < size<1>(S); ++j) {
    const float g = col_scale(j);
#pragma unroll
    for (int i = 0; i < 2; ++i) S(i, j) *= g;
  }
  pack_p<Element>(tSrS, tOrP);
}

}  // namespace attention
}  // namespace openmla::cuda::sm90
