// The end of a CTA's split (both compute warpgroups, after the row sums are in smem.row_sum):
// O normalised; a split that is its problem's only one writes out (bf16, the attention sink
// applied), lse and max_logits; otherwise its fp32 partial, lse and max go to the workspace for
// the combine (combine.cu). Shared by the two orders.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

#include "cuda/sm90/attention/primitives.cuh"
#include "cuda/sm90/sparse_attention/problem.cuh"

namespace openmla::cuda::sm90 {
namespace sparse {

enum : uint32_t {
  kBarP0 = 1,        // WG0 -> WG1: P and the factors of a stage-0 tile (256)
  kBarP1 = 2,        // the same for stage 1 (256)
  kBarQ = 3,         // Q in shared memory (the standard order: inside WG0, 128; the seesaw 256)
  kBarEpi = 4,       // row sums (and the sink's lse) published (256)
  kBarWg0 = 5,       // the standard order: inside WG0, its P in shared memory (128)
  kBarMax = 6,       // the seesaw: WG0's tile row maxima of the round (256)
  kBarMaxFinal = 7,  // the seesaw: WG1 -> WG0, the round's final row max (256)
};

// `m_run` is the running max (WG0's in the standard order: WG1's is unused), `m_true` the exact
// row max (for max_logits), both in units of the scaled logit / scale.
template <class Traits, class TO, class TC>
__device__ __forceinline__ void write_out(const SparseAttentionParams& p,
                                          typename Traits::SharedStorage& smem, int wg, int t,
                                          int m_block, int split, int problem, TO& O,
                                          TC const& cO_rc, const int (&mrow)[2],
                                          const float (&m_run)[2], const float (&m_true)[2]) {
  using namespace cute;
  constexpr bool kDense = Traits::kDense;
  const int lane = t % 32;
  const bool single = p.num_splits == 1;
  // The lse of row r in natural-log units (m_run: WG0's running max; an empty row: +inf when the
  // split is the problem's only one, -inf for the combine).
  auto lse_of = [&](int r, float l) {
    return l > 0.f ? m_run[r] * p.scale + logf(l) : (single ? INFINITY : -INFINITY);
  };
  const bool sink = single && p.sink != nullptr;
  if (sink) {  // out *= 1 / (1 + exp(sink - lse)): WG1 takes WG0's lse through shared memory
    if (wg == 0 && lane % 4 == 0) {
#pragma unroll
      for (int r = 0; r < 2; ++r) smem.row_lse[mrow[r]] = lse_of(r, smem.row_sum[mrow[r]]);
    }
    attention::bar_sync(kBarEpi, 256);
  }
  // One row at a time (O's registers are the most the warpgroups hold here).
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    Row w;  // the row's query token and head
    if constexpr (kDense) {  // from WG0's table (no division by h_q with O live)
      const uint32_t code = smem.row_code[mrow[r]];
      w.ok = code != ~0u;
      w.i = problem;
      w.j = static_cast<int>(code >> 16);
      w.h = static_cast<int>(code & 0xFFFFu);
      w.token = problem * p.s_q + w.j;
    } else {
      w = row_of<kDense>(p, problem, m_block * 64 + mrow[r]);
    }
    if (!w.ok) continue;
    const float l = smem.row_sum[mrow[r]];
    float f = l > 0.f ? 1.f / l : 0.f;
    if (wg == 0 && lane % 4 == 0) {
      const float lse = lse_of(r, l);
      const float max_logit = m_true[r] == -INFINITY ? -INFINITY : m_true[r] * p.scale;
      if (single) {
        p.lse[w.i * p.lse_stride_b + w.h * p.lse_stride_h + w.j * p.lse_stride_s] = lse;
        if (p.max_logits != nullptr) {
          p.max_logits[w.i * p.max_logits_stride_b + w.h * p.max_logits_stride_h +
                       w.j * p.max_logits_stride_s] = max_logit;
        }
      } else {
        const int64_t at = (static_cast<int64_t>(split) * p.tokens + w.token) * p.h_q + w.h;
        p.lse_partial[at] = lse;
        if (p.max_logits != nullptr) p.max_partial[at] = max_logit;
      }
    }
    if (sink) {
      const float lse = smem.row_lse[mrow[r]];
      f = lse == INFINITY ? 0.f : f / (1.f + expf(p.sink[w.h * p.sink_stride] - lse));
    }
    if (single) {
      char* out = static_cast<char*>(p.out) +
                  (w.i * p.out_stride_b + w.j * p.out_stride_s + w.h * p.out_stride_h +
                   wg * Traits::kVHalfDims) * 2;
#pragma unroll
      for (int c = 0; c < size<1>(O); c += 2) {
        const int col = get<1>(cO_rc(r, c));
        *reinterpret_cast<uint32_t*>(out + col * 2) =
            attention::pack2<cute::bfloat16_t>(O(r, c) * f, O(r, c + 1) * f);
      }
    } else {
      float* out = p.o_partial +
                   ((static_cast<int64_t>(split) * p.tokens + w.token) * p.h_q + w.h) * 512 +
                   wg * Traits::kVHalfDims;
#pragma unroll
      for (int c = 0; c < size<1>(O); c += 2) {
        const int col = get<1>(cO_rc(r, c));
        *reinterpret_cast<float2*>(out + col) = make_float2(O(r, c) * f, O(r, c + 1) * f);
      }
    }
  }
}

}  // namespace sparse
}  // namespace openmla::cuda::sm90
