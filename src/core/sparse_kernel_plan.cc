#include "core/sparse_kernel_plan.h"

namespace openmla::core {

SparseKernelPlan plan_sparse_kernel(const SparseKernelShape& shape,
                                    const SparseKernelSwitches& sw) {
  SparseKernelPlan plan;
  const bool quantised = shape.by_token;
  plan.fill_for_format =
      quantised && shape.format != SparseFillFormat::kNone && !sw.generic_fill;
  // m-blocks 2c and 2c + 1 read the same keys: a 2-CTA cluster decodes each tile once (h_q 128;
  // the dense mode's packed rows), a fill built for one format only.
  plan.pair = plan.fill_for_format && shape.m_blocks % 2 == 0 && sw.pair != 0;

  // The streamed token fill where it measured faster (H100, 16a8ddb, same run): fp8_model1 and
  // fp8_mx always (sparse 1.04-1.07x, dense mode 1.07-1.24x), fp8_v32 in CTA pairs and the dense
  // mode (1.01x, 1.05-1.13x); fp8_v32's unpaired sparse grids and fp4 round by round.
  if (plan.fill_for_format) {
    switch (shape.format) {
      case SparseFillFormat::kFP8_Model1:
      case SparseFillFormat::kFP8_MX:
        plan.stream = 1;
        break;
      case SparseFillFormat::kFP8_V32:
        plan.stream = shape.dense_mode || plan.pair ? 1 : 0;
        break;
      default:
        plan.stream = 0;
    }
    if (sw.stream == 0 || sw.stream == 1) plan.stream = sw.stream;
  }
  // The ring fill (a fill built for one format, unpaired) where it measured faster (H100,
  // d551f67 / 05de8d8, same runs, cold instruction caches): the fp8 formats' sparse grids of 4+
  // tiles a split (1.03-1.10×) and of one (b 1-4 at topk 2048: fp8_v32 1.10-1.17×, fp8_model1
  // 1.01-1.09×); fp8_v32's of two (1.11-1.15×) and three (not measured) too, not fp8_model1's
  // (0.96-0.98× at two; fp8_mx, not measured there, follows it); the dense mode over fp8_model1 / fp8_mx with 4-32 tiles a split
  // (1.01-1.05×; 0.97-1.01× on longer splits at 41d2508). Not fp4 (0.87-0.96×: its decode is the
  // heavier), nor fp8_v32's dense mode (0.95-1.10×, 41d2508), nor the dense mode's short splits.
  const bool ring_format = shape.format == SparseFillFormat::kFP8_V32 ||
                           shape.format == SparseFillFormat::kFP8_Model1 ||
                           shape.format == SparseFillFormat::kFP8_MX;
  const int tiles = shape.tiles_per_split;
  const bool ring_default =
      ring_format &&
      (shape.dense_mode ? shape.format != SparseFillFormat::kFP8_V32 && tiles >= 4 && tiles <= 32
                        : shape.format == SparseFillFormat::kFP8_V32 || tiles <= 1 || tiles >= 4);
  // (Its form decoded by two producer warpgroups, 512 threads, measured 0.85-0.97x and was
  // removed: sparse_decode/NOTES.md.)
  const bool ring = plan.fill_for_format && !plan.pair &&
                    (sw.ring == 1 || (ring_default && sw.ring != 0));
  // Three round slots in place of the one stage (OPENMLA_SPARSE_SLOTS=1; not yet measured: by
  // the switch only; sparse_decode/NOTES.md lever 1).
  plan.ring = !ring ? 0 : sw.slots == 1 ? 2 : 1;
  if (plan.ring) plan.stream = 0;  // (the streaming fill is a register fill: not in this kernel)

  // bf16 keys by cp.async in the sparse mode: the seesaw order where it measured faster (prefill
  // 1.10-1.15x at d 512, 1.04-1.06x at d 576 with one m-block; at d 576 with two it was
  // 0.97-1.01x on prefill and 0.87x on bf16 decode, which keep the first order), and for prefill
  // its staggered form (1.04-1.10x; ef2b6f2).
  const bool prefill_stagger = shape.prefill && sw.stagger != 0;
  // (Quarter-stage barriers were prefill's default at d 576 until the group fill: with it the
  // half-stage barriers measured 1.12-1.16x faster, H100, 0dd750d; the quarters and an L2 hint
  // (+-0.5%) are gone since, sparse_prefill/NOTES.md.)
  const bool stagger = sw.stagger == 1 || prefill_stagger;
  plan.seesaw = !quantised && !shape.dense_mode && shape.bf16_async &&
                (shape.d_qk == 512 || shape.m_blocks == 1 || stagger) && sw.seesaw != 0;
  plan.stagger = plan.seesaw && stagger;
  // bf16 rows by 8-lane groups (sparse mode): prefill's default (1.09-1.24x) and bf16 decode's
  // (1.07-1.18x, H100, 41d2508, same run).
  plan.group_fill = !quantised && !shape.dense_mode && shape.bf16_async && sw.groups != 0;
  return plan;
}

}  // namespace openmla::core
