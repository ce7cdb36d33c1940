// The sparse decode kernel's epilogue (consume.cuh).
#pragma once

#include "core/schedule.h"
#include "cuda/sm90/sparse_decode/consume_parts.cuh"
#include "cuda/sm90/sparse_decode/fused_out.cuh"

namespace openmla::cuda::sm90 {
namespace sparse_decode_detail {

// Both compute warpgroups, after the loop: normalise O; out (bf16, the sink applied) and lse
// when the split is the problem's only one, else the split's fp32 partial and lse (and max).
template <class Traits, class A_O, class A_cO_rc>
__device__ __forceinline__ void write_output(const SparseDecodeParams& p,
                                             typename Traits::SharedStorage& smem, int wg, int lane,
                                             int problem, int split, int m_block, A_O& O,
                                             A_cO_rc& cO_rc, const int (&mrow)[2],
                                             float (&m_run)[2], float (&m_true)[2]) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr bool kDense = Traits::kDense;

  // ---- epilogue: normalise; out + lse (one split) or the split's partial ----
  // (kFp16: the problem and split read again here, so WG0 holds neither through its loop)
  const int problem_e = Traits::kFp16 ? p.problem0 + static_cast<int>(blockIdx.z) : problem;
  const int split_e = Traits::kFp16 ? static_cast<int>(blockIdx.y) : split;
  Row rows[2];  // the query token and head of each of the thread's rows
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if constexpr (kDense) {  // from WG0's table (no division by h_q with O live)
      const uint32_t code = smem.row_code[mrow[r]];
      rows[r].ok = code != ~0u;
      rows[r].i = problem_e;
      rows[r].j = static_cast<int>(code >> 16);
      rows[r].h = static_cast<int>(code & 0xFFFFu);
      rows[r].token = problem_e * p.s_q + rows[r].j;
    } else {
      rows[r] = row_of<kDense>(p, problem_e, m_block * 64 + mrow[r]);
    }
  }
  const bool single = p.num_splits == 1;
  float lse[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = smem.row_sum[mrow[r]];
    float inv = l > 0.f ? 1.f / l : 0.f;
    if constexpr (Traits::kFp16) inv *= exp2_int(smem.o_exp[0]);  // O's units (e_ref)
    // m_run is WG0's; WG1 needs only the lse for the sink, so it reads it back below.
    lse[r] = l > 0.f ? m_run[r] * p.scale + logf(l) : (single ? INFINITY : -INFINITY);
#pragma unroll
    for (int c = 0; c < size<1>(O); ++c) O(r, c) *= inv;
  }
  if (wg == 0 && lane % 4 == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const Row& w = rows[r];
      if (!w.ok) continue;
      const float max_logit = m_true[r] == -INFINITY ? -INFINITY : m_true[r] * p.scale;
      if (single) {
        p.lse[w.i * p.lse_stride_b + w.h * p.lse_stride_h + w.j * p.lse_stride_s] = lse[r];
        if (p.max_logits != nullptr) {
          p.max_logits[w.i * p.max_logits_stride_b + w.h * p.max_logits_stride_h +
                       w.j * p.max_logits_stride_s] = max_logit;
        }
      } else {  // lse_accum [global split, s_pack, h_q] (cuda/common/combine.h)
        const int64_t split_g = static_cast<int64_t>(problem_e) * p.num_splits + split_e;
        const int64_t at =
            (split_g * p.s_pack + (w.token - problem_e * p.s_pack)) * p.h_q + w.h;
        p.lse_partial[at] = lse[r];
        if (p.max_logits != nullptr) p.max_partial[at] = max_logit;
      }
    }
  }
  if (single && p.sink != nullptr) {
    // WG1's lse: WG0's rows, published through row_sum's neighbour (the max) would cost a
    // barrier; the factor only needs lse, which WG0 writes to smem.rescale after the loop.
    if (wg == 0) {
      if (lane % 4 == 0) {
#pragma unroll
        for (int r = 0; r < 2; ++r) reinterpret_cast<float*>(smem.rescale)[mrow[r]] = lse[r];
      }
    }
    bar_sync(kBarEpi, 256);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float l = reinterpret_cast<const float*>(smem.rescale)[mrow[r]];
      float f = 0.f;
      if (rows[r].ok && l != INFINITY) {
        f = 1.f / (1.f + expf(p.sink[rows[r].h * p.sink_stride] - l));
      }
#pragma unroll
      for (int c = 0; c < size<1>(O); ++c) O(r, c) *= f;
    }
  }
  if constexpr (Traits::kFused) {
    if (single && p.fused.on) {  // the fused op: O's RoPE, the e4m3 cast and its scales
      fused_store_rows(p, wg, lane, O, cO_rc, rows, smem.fused_cs, smem.fused_bad != 0);
      return;
    }
  }
  if (!single) {
    // The split's fp32 partial in the accumulators' own order (cuda/common/combine.h,
    // "o_accum"): float4 k of thread t of warpgroup wg is rows r, r + 8 x dims 256 wg + 8 k +
    // 2 (t % 4), + 1, at float4 (32 wg + k) * 32 G + t of the block of (slot = global split,
    // m-block), so a warp stores 512 contiguous bytes an instruction. Only the warps of the
    // first G 16-row groups hold a row of the problem; threads whose rows are both past the
    // problem's store nothing.
    const int rows_kv = p.s_pack * p.h_q;
    const int groups = core::partial_row_groups(rows_kv);
    if (m_block * 64 + mrow[0] >= rows_kv) return;
    const int slot = problem_e * p.num_splits + split_e;
    const int64_t block = core::partial_block(slot, 0, m_block, 1, p.m_blocks);
    const int lanes = 32 * groups;
    float4* out = reinterpret_cast<float4*>(p.o_partial) +
                  block * core::partial_block_float4s(groups, 512) +
                  wg * (Traits::kVHalfDims / 8) * lanes + threadIdx.x % 128;
#pragma unroll
    for (int k = 0; k < size<1>(O) / 2; ++k) {
      out[k * lanes] = make_float4(O(0, 2 * k), O(0, 2 * k + 1), O(1, 2 * k), O(1, 2 * k + 1));
    }
    return;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const Row& w = rows[r];
    if (!w.ok) continue;
    {
      char* out = static_cast<char*>(p.out) + (w.i * p.out_stride_b + w.j * p.out_stride_s +
                                               w.h * p.out_stride_h + wg * Traits::kVHalfDims) *
                                                  2;
#pragma unroll
      for (int c = 0; c < size<1>(O); c += 2) {
        const int col = get<1>(cO_rc(r, c));
        *reinterpret_cast<uint32_t*>(out + col * 2) = pack2<Element>(O(r, c), O(r, c + 1));
      }
    }
  }
}

}  // namespace sparse_decode_detail
}  // namespace openmla::cuda::sm90
