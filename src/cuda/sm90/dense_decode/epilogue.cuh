// The end of a request in the dense decode kernel (kernel.cuh): O normalised by both warpgroups'
// row sums, the rows' lse, and the output: out directly for a request with one split (through
// Q's shared memory and a TMA store, or by the threads' 16-byte / 4-byte stores), else the
// split's fp32 partial into the workspace for combine.cu. Called by both compute warpgroups after
// kBarEpilogue; every argument is the calling thread's (its warpgroup wg, thread t in it, lane).
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

#include "core/schedule.h"
#include "cuda/sm90/attention/fragments.cuh"
#include "cuda/sm90/attention/primitives.cuh"
#include "cuda/sm90/dense_decode/params.h"
#include "cuda/sm90/dense_decode/producer.cuh"

namespace openmla::cuda::sm90 {
namespace dense_decode_detail {
using namespace attention;  // the shared device pieces (src/cuda/sm90/attention/)

// O's two rows of this thread (row_of, in the 64-row block) divided by the row sums the two
// warpgroups left in smem.row_sum, and (by WG0's row leaders) each row's lse: into lse for a
// request with one split (+inf for a row without keys), else into lse_accum at the split's
// global index (-inf: the split saw no key; a split outside the workspace is not stored).
template <class Traits, class TO>
__device__ __forceinline__ void normalize_and_store_lse(const DenseDecodeParams& p,
                                                        typename Traits::SharedStorage& smem,
                                                        TO& O, const int (&row_of)[2],
                                                        const float (&m_run)[2], int wg,
                                                        bool row_leader, int m_block, int kv_head,
                                                        int r, bool single) {
  using namespace cute;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int grow = m_block * 64 + row_of[i];
    const float l = smem.row_sum[0][row_of[i]] + smem.row_sum[1][row_of[i]];
    const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
    for (int j = 0; j < size<1>(O); ++j) O(i, j) *= inv;
    if (grow >= p.rows || !(wg == 0 && row_leader)) continue;
    const int s = grow / p.group, h = kv_head * p.group + grow % p.group;
    const float lse = l > 0.f ? m_run[i] * p.scale + logf(l) : (single ? INFINITY : -INFINITY);
    if (single) {
      p.lse[r * p.lse_stride_b + h * p.lse_stride_h + s * p.lse_stride_s] = lse;
    } else {
      const int split = smem.range[core::kBeginSplit] + (r - smem.range[core::kBeginRequest]);
      if (split >= 0 && split < p.max_splits) {  // else a corrupted schedule (params.h)
        p.lse_accum[(static_cast<int64_t>(split) * p.s_q + s) * p.h_q + h] = lse;
      }
    }
  }
}

// Output of request rr, O already normalised. (Its 64 KB of stores hold both warpgroups ~4-6k
// clocks at a request boundary; deferring them under the next request's first QK^T kept O live
// across requests and spilled 1.9 KB: NOTES.md.) cO_rc: O's (row, dim) coordinates.
template <class Traits, class TO, class TC>
__device__ __forceinline__ void write_out(const DenseDecodeParams& p,
                                          typename Traits::SharedStorage& smem, TO const& O,
                                          TC const& cO_rc, const int (&row_of)[2], int wg, int t,
                                          int lane, int m_block, int kv_head, int rr, bool single,
                                          int first_split) {
  using namespace cute;
  using Element = typename Traits::Element;
  if (!single) {
    // A split's fp32 partial, in the accumulator's own order (combine.h, "o_accum"): float4 k
    // of thread t of warpgroup wg is rows r, r + 8 x columns 256 wg + 8 k + 2 (t % 4), + 1,
    // at float4 (32 wg + k) * 32 row_groups + t of the CTA's block, so a warp stores 512
    // contiguous bytes an instruction. (Row-major 8-byte stores, 8 rows x 32 B an
    // instruction, cost ~12 µs of b 32 x 4096's 89 where every CTA stores at once; this order
    // ~2: NOTES.md.) Only the warps of the first row_groups 16-row groups have a block slot;
    // threads whose rows are both past the request's store nothing.
    const int split = smem.range[core::kBeginSplit] + (rr - smem.range[core::kBeginRequest]);
    const int slot = core::partial_slot(split, first_split, rr);
    if (slot < 0 || slot >= p.max_slots) return;  // a corrupted schedule (params.h)
    const int64_t block = core::partial_block(slot, kv_head, m_block, p.h_kv, p.m_blocks);
    const int lanes = 32 * p.row_groups;  // the block's float4s of one column slot
    const int block_float4s = core::partial_block_float4s(p.row_groups, Traits::kHeadDimV);
    float4* out = reinterpret_cast<float4*>(p.o_accum) + block * block_float4s +
                  wg * (Traits::kVHalfDims / 8) * lanes + t;
    if (m_block * 64 + row_of[0] >= p.rows) return;  // both rows past the request's
#pragma unroll
    for (int k = 0; k < size<1>(O) / 2; ++k) {
      out[k * lanes] = make_float4(O(0, 2 * k), O(0, 2 * k + 1), O(1, 2 * k), O(1, 2 * k + 1));
    }
    return;
  }
  if (p.out_tma) {
    // Through Q's shared memory (free since kBarEpilogue) and a TMA store, so the rows drain
    // to memory while the next request computes; the next Q loads once they are read out.
    stage_out_smem<Element>(smem.q, O, wg, t / 32, lane);
    fence_async_smem();
    if (wg == 0) {  // (constant barrier ids: a computed one makes ptxas reserve all 16)
      bar_sync(kBarWg0, 128);
    } else {
      bar_sync(kBarWg1, 128);
    }
    if (t == 0) store_out_tma<Traits>(p, smem, rr, kv_head, m_block, wg);
    return;
  }
  auto out_row = [&](int i) {  // this warpgroup's half of row i in out
    const int grow = m_block * 64 + row_of[i];
    const int s = grow / p.group, h = kv_head * p.group + grow % p.group;
    return static_cast<char*>(p.out) + (rr * p.out_stride_b + s * p.out_stride_s +
                                        h * p.out_stride_h + wg * Traits::kVHalfDims) * 2;
  };
  if (p.output_stores == 2) {
    // (Every lane takes part in the quads' shuffles; rows past the request's skip the store.)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      store_row_16B<Element>(out_row(i), O, i, lane % 4, m_block * 64 + row_of[i] < p.rows);
    }
    return;
  }
  if (p.output_stores != 1) return;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int grow = m_block * 64 + row_of[i];
    if (grow >= p.rows) continue;
    // From one opaque first column, so the others' offsets are constants: else their 32
    // addresses were hoisted out of the request loop into registers (and spilled).
    const int col0 = get<1>(cO_rc(i, 0));
    int opaque = col0;
    asm volatile("" : "+r"(opaque));
    char* out = out_row(i) + opaque * 2;
#pragma unroll
    for (int j = 0; j < size<1>(O); j += 2) {
      const int col = get<1>(cO_rc(i, j)) - col0;
      *reinterpret_cast<uint32_t*>(out + col * 2) = pack2<Element>(O(i, j), O(i, j + 1));
    }
  }
}

}  // namespace dense_decode_detail
}  // namespace openmla::cuda::sm90
