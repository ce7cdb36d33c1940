#include "core/sparse_kernel_plan.h"

#include <algorithm>

namespace openmla::core {

SparseKernelPlan plan_sparse_kernel(const SparseKernelShape& shape,
                                    const SparseTuning& sw) {
  SparseKernelPlan plan;
  const bool quantised = shape.by_token;
  plan.fill_for_format =
      quantised && shape.format != SparseFillFormat::kNone && !sw.generic_fill;
  // m-blocks 2c and 2c + 1 read the same keys: a 2-CTA cluster decodes each tile once (h_q 128;
  // the dense mode's packed rows), a fill built for one format only. Not where the slot ring
  // (below) runs unpaired by default, each CTA decoding every tile itself, on the fp8 formats'
  // splits of 4+ tiles: in the sparse mode (1.03-1.06x the pair; H100, 55a8170, same run, cold;
  // h_q 128 b 64/128 s_q 1/2 topk 2048 and V4's rows; fp4 0.93x) and the dense mode's splits of
  // at most 16 tiles (1.01-1.08x; 6e7091e; 0.96-1.00x on longer ones, fp4 0.93-0.97x).
  const bool fp8_format = shape.format == SparseFillFormat::kFP8_V32 ||
                          shape.format == SparseFillFormat::kFP8_Model1 ||
                          shape.format == SparseFillFormat::kFP8_MX;
  const int tiles = shape.tiles_per_split;
  const bool unpair_for_slots = fp8_format && tiles >= 4 && (!shape.dense_mode || tiles <= 16) &&
                                sw.pair != 1 && sw.ring != 0 && sw.slots != 0;
  plan.pair = plan.fill_for_format && shape.m_blocks % 2 == 0 && sw.pair != 0 && !unpair_for_slots;

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
  // The ring fill (a fill built for one format, unpaired: raw bytes by cp.async, decoded by the
  // producer warpgroup into shared memory) where it measured faster than the register fills, in
  // its two forms: three 32-key round slots (ring 2) and one 64-key bf16 stage (ring 1). Measured
  // on an H100 in same runs with cold instruction caches (55a8170; the one-stage form's own rows
  // d551f67 / 05de8d8):
  // - sparse mode, the fp8 formats: the slots 1.03-1.13x the one stage on splits of 16-32 tiles,
  //   which was 1.03-1.10x the register fills; fp8_v32's one-tile splits keep the one stage (the
  //   slots 0.95-0.97x there; one stage 1.10-1.17x the register fill), its two-tile splits take
  //   the slots (1.05x); fp8_model1's one-tile splits the slots (1.00-1.03x) and its two-tile
  //   splits the slots too (1.11x the register fill, where the one stage was 0.96-0.98x; fp8_mx,
  //   not measured there, follows it);
  // - sparse mode, fp4 on splits of 4+ tiles: the slots 1.10-1.13x its register fill (the one
  //   stage 0.87-0.96x); its short splits are not measured;
  // - dense mode, splits of 4+ tiles: fp8_model1 / fp8_mx the slots 1.07-1.13x (16-512 tiles),
  //   fp4 1.03-1.08x, fp8_v32 1.03-1.04x on splits of at most 16 tiles and 0.99x on longer ones
  //   (which keep the register fill); the dense mode's shorter splits are not measured.
  // (The ring decoded by two producer warpgroups, 512 threads, measured 0.85-0.97x and was
  // removed: sparse_decode/NOTES.md.)
  bool slots_default = false, one_stage_default = false;
  if (!shape.dense_mode) {
    one_stage_default = shape.format == SparseFillFormat::kFP8_V32 && tiles <= 1;
    slots_default = (fp8_format && !one_stage_default) ||
                    (shape.format == SparseFillFormat::kFP4 && tiles >= 4);
  } else {
    slots_default = tiles >= 4 && (fp8_format || shape.format == SparseFillFormat::kFP4) &&
                    (shape.format != SparseFillFormat::kFP8_V32 || tiles <= 16);
  }
  const bool ring = plan.fill_for_format && !plan.pair &&
                    (sw.ring == 1 || ((slots_default || one_stage_default) && sw.ring != 0));
  // `slots` picks the form wherever the ring runs; forced on elsewhere, the slots. The one stage
  // is compiled for the sparse mode at d 576 only (where it is a default): elsewhere the slots.
  const bool one_stage_built = !shape.dense_mode && shape.d_qk == 576;
  const bool slots = !one_stage_built || sw.slots == 1 || (sw.slots != 0 && !one_stage_default);
  plan.ring = !ring ? 0 : slots ? 2 : 1;
  // The slots' keys staged as fp16 (the fp8 formats: SM90 has no e2m1
  // conversion) where it measured faster (H100, 00da531, same run, cold): the dense mode's
  // memory-bound grids (one m-block of at most 32 rows) on splits of 64+ tiles, 1.01-1.05x
  // (fp8_v32 there otherwise takes the register fill). Elsewhere it measured 0.91-1.00x (the
  // sparse grids, h_q 64-128, the dense mode's short splits), and it is compiled for the dense
  // mode only: elsewhere never.
  const bool fp16_default = shape.dense_mode && fp8_format && shape.m_blocks == 1 &&
                            shape.rows <= 32 && tiles >= 64 && plan.fill_for_format &&
                            !plan.pair && sw.ring != 0 && sw.slots != 0;
  if (fp16_default && sw.fp16 != 0) plan.ring = 3, plan.stream = 0;
  if (plan.ring == 2 && fp8_format && shape.dense_mode && sw.fp16 == 1) plan.ring = 3;
  if (plan.ring) plan.stream = 0;  // (the streaming fill is a register fill: not in this kernel)

  // bf16 keys by cp.async in the sparse mode: the seesaw order where it measured faster (prefill
  // 1.10-1.15x at d 512, 1.04-1.06x at d 576 with one m-block; at d 576 with two it was
  // 0.97-1.01x on prefill and 0.87x on bf16 decode, which keep the first order), and for prefill
  // its staggered form (1.04-1.10x; ef2b6f2).
  const bool prefill_stagger = shape.prefill && sw.stagger != 0;
  // (Quarter-stage barriers were prefill's default at d 576 until the group fill: with it the
  // half-stage barriers measured 1.12-1.16x faster, H100, 0dd750d; the quarters and an L2 hint
  // (+-0.5%) are gone since, sparse_decode/NOTES.md.)
  const bool stagger = sw.stagger == 1 || prefill_stagger;
  plan.seesaw = !quantised && !shape.dense_mode && shape.bf16_async &&
                (shape.d_qk == 512 || shape.m_blocks == 1 || stagger) && sw.seesaw != 0;
  plan.stagger = plan.seesaw && stagger;
  // bf16 rows by 8-lane groups (sparse mode): prefill's default (1.09-1.24x) and bf16 decode's
  // (1.07-1.18x, H100, 41d2508, same run).
  plan.group_fill = !quantised && !shape.dense_mode && shape.bf16_async && sw.groups != 0;
  return plan;
}

int64_t prefill_compact_rows(int64_t s_q, int64_t topk, int64_t num_slots) {
  if (s_q <= 0 || topk <= 0 || num_slots <= 0) return 0;
  return std::min(num_slots, s_q * topk);  // s_q < 2^31, topk <= 2^24: no overflow
}

bool prefill_dequantizes_once(const PrefillFromCacheShape& shape, int forced) {
  const int64_t rows = prefill_compact_rows(shape.s_q, shape.topk, shape.num_slots);
  if (!shape.quantised || !shape.workspace_fits || rows == 0 || forced == 0) return false;
  if (forced == 1) return true;
  // The direct path decodes a named key once per query token and 64-head block that gathers it;
  // the compacting one once, plus ~70 µs of marking, scanning and remapping at s_q 4096 (its
  // costing in sparse_decode/NOTES.md). Taken where the direct path would decode each row 8
  // times or more on average.
  const int64_t m_blocks = (shape.h_q + 63) / 64;
  const double decodes = static_cast<double>(shape.s_q) * shape.topk * m_blocks;
  return decodes >= 8.0 * static_cast<double>(rows);
}

}  // namespace openmla::core
