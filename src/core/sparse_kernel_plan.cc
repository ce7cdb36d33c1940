#include "core/sparse_kernel_plan.h"

#include <algorithm>

namespace openmla::core {

SparseKernelForm plan_sparse_kernel(const SparseKernelShape& shape) {
  SparseKernelForm form;
  // 1. bf16 tiles in the sparse mode with one m-block, at d 512, or in prefill: the seesaw, each
  //    compute warpgroup a QK^T and half of two P Vs (sparse prefill 1.04-1.19x the standard
  //    order on an H100; at d 576 with two m-blocks it was 0.87x on bf16 decode).
  if (shape.bf16_aligned && !shape.dense_mode &&
      (shape.d_qk == 512 || shape.m_blocks == 1 || shape.prefill)) {
    form.seesaw = true;
    return form;
  }
  // 2. Quantised keys read by an even count of m-blocks (h_q 65-128; the dense mode's packed
  //    rows): 2-CTA clusters, each CTA decoding half of every tile into both (the crossover),
  //    so a tile is loaded and decoded once, not once per m-block.
  if (shape.quantised && shape.m_blocks % 2 == 0) form.cluster = 2;
  // 3. Everything else: the standard order, one CTA.
  return form;
}

int64_t prefill_compact_rows(int64_t s_q, int64_t topk, int64_t num_slots) {
  if (s_q <= 0 || topk <= 0 || num_slots <= 0) return 0;
  return std::min(num_slots, s_q * topk);  // s_q < 2^31, topk <= 2^24: no overflow
}

bool prefill_dequantizes_once(const PrefillFromCacheShape& shape) {
  const int64_t rows = prefill_compact_rows(shape.s_q, shape.topk, shape.num_slots);
  if (!shape.quantised || !shape.workspace_fits || rows == 0) return false;
  // The direct path decodes a named key once per query token and 64-head block that gathers it;
  // the compacting one once, plus ~70 µs of marking, scanning and remapping at s_q 4096.
  // Taken where the direct path would decode each row 8 times or more on average.
  const int64_t m_blocks = (shape.h_q + 63) / 64;
  const double decodes = static_cast<double>(shape.s_q) * shape.topk * m_blocks;
  return decodes >= 8.0 * static_cast<double>(rows);
}

}  // namespace openmla::core
