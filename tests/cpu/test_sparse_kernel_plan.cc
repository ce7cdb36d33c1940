// The sparse kernel's form (core/sparse_kernel_plan.h): the defaults each shape gets, as measured
// and recorded in the kernels' NOTES.md, and every SparseTuning override (tests and benchmarks).
#include <gtest/gtest.h>

#include "core/sparse_kernel_plan.h"

namespace openmla::core {
namespace {

SparseKernelShape quantised(SparseFillFormat f, int d_qk, int m_blocks, bool dense = false) {
  SparseKernelShape s;
  s.d_qk = d_qk;
  s.m_blocks = m_blocks;
  s.dense_mode = dense;
  s.by_token = true;
  s.format = f;
  return s;
}
SparseKernelShape bf16(int d_qk, int m_blocks, bool prefill) {
  SparseKernelShape s;
  s.d_qk = d_qk;
  s.m_blocks = m_blocks;
  s.prefill = prefill;
  s.bf16_async = true;
  return s;
}

TEST(SparseKernelPlan, PrefillRunsTheStaggerAndTheGroupFill) {
  for (int m : {1, 2}) {
    const SparseKernelPlan d512 = plan_sparse_kernel(bf16(512, m, true), {});
    EXPECT_TRUE(d512.seesaw && d512.stagger && d512.group_fill);
    EXPECT_FALSE(d512.pair);
    const SparseKernelPlan d576 = plan_sparse_kernel(bf16(576, m, true), {});
    EXPECT_TRUE(d576.seesaw && d576.stagger && d576.group_fill);
  }
}

TEST(SparseKernelPlan, Bf16DecodeKeepsThePlainOrdersWithTheGroupFill) {
  const SparseKernelPlan d512 = plan_sparse_kernel(bf16(512, 2, false), {});
  EXPECT_TRUE(d512.seesaw && d512.group_fill);
  EXPECT_FALSE(d512.stagger);
  EXPECT_TRUE(plan_sparse_kernel(bf16(576, 2, false), {}).group_fill);
  const SparseKernelPlan d576_h64 = plan_sparse_kernel(bf16(576, 1, false), {});
  EXPECT_TRUE(d576_h64.seesaw);
  EXPECT_FALSE(d576_h64.stagger);
  // d 576 with two m-blocks: the first order (the seesaw measured 0.87x there).
  EXPECT_FALSE(plan_sparse_kernel(bf16(576, 2, false), {}).seesaw);
  // The dense mode never runs the seesaw.
  SparseKernelShape dense = bf16(512, 1, false);
  dense.dense_mode = true;
  EXPECT_FALSE(plan_sparse_kernel(dense, {}).seesaw);
  EXPECT_FALSE(plan_sparse_kernel(dense, {}).group_fill);  // (its producer has no group fill)
}

TEST(SparseKernelPlan, TheTokenFillStreamsWhereItMeasuredFaster) {
  using F = SparseFillFormat;
  // Sparse mode, the register fills (CTA pairs; unpaired grids with the ring off, which the fp8
  // formats otherwise take): fp8_v32 unpaired round by round, paired streamed; fp8_model1 /
  // fp8_mx streamed; fp4 round by round.
  SparseTuning no_ring;
  no_ring.ring = 0;
  EXPECT_EQ(plan_sparse_kernel(quantised(F::kFP8_V32, 576, 1), no_ring).stream, 0);
  const SparseKernelPlan v32_pair = plan_sparse_kernel(quantised(F::kFP8_V32, 576, 2), {});
  EXPECT_TRUE(v32_pair.pair);
  EXPECT_EQ(v32_pair.stream, 1);
  for (int m : {1, 2}) {
    EXPECT_EQ(plan_sparse_kernel(quantised(F::kFP8_Model1, 512, m), no_ring).stream, 1);
    EXPECT_EQ(plan_sparse_kernel(quantised(F::kFP8_MX, 512, m), no_ring).stream, 1);
    EXPECT_EQ(plan_sparse_kernel(quantised(F::kFP4, 512, m), {}).stream, 0);
  }
  // Dense mode: every fp8 format streamed, fp4 not.
  EXPECT_EQ(plan_sparse_kernel(quantised(F::kFP8_V32, 576, 1, true), {}).stream, 1);
  EXPECT_EQ(plan_sparse_kernel(quantised(F::kFP4, 512, 1, true), {}).stream, 0);
  // Quantised grids never take the bf16 orders or fills.
  const SparseKernelPlan q = plan_sparse_kernel(quantised(F::kFP8_V32, 576, 1), {});
  EXPECT_FALSE(q.seesaw || q.group_fill);
  EXPECT_TRUE(q.fill_for_format);
}

TEST(SparseKernelPlan, CachesOfTwoFormatsReadTheFormatAtRunTime) {
  SparseKernelShape s = quantised(SparseFillFormat::kNone, 512, 2);
  const SparseKernelPlan p = plan_sparse_kernel(s, {});
  EXPECT_FALSE(p.fill_for_format);
  EXPECT_FALSE(p.pair);  // a pair needs the fill built for one format
  EXPECT_EQ(p.stream, 0);
}

TEST(SparseKernelPlan, SwitchesOverrideTheDefaults) {
  using F = SparseFillFormat;
  SparseTuning sw;
  sw.stagger = 0;  // prefill's earlier orders
  const SparseKernelPlan plain = plan_sparse_kernel(bf16(576, 2, true), sw);
  EXPECT_FALSE(plain.seesaw || plain.stagger);
  EXPECT_TRUE(plan_sparse_kernel(bf16(512, 1, true), sw).seesaw);
  sw = {};
  sw.stagger = 1;  // the stagger on bf16 decode too
  EXPECT_TRUE(plan_sparse_kernel(bf16(576, 2, false), sw).stagger);
  sw = {};
  sw.seesaw = 0;
  EXPECT_FALSE(plan_sparse_kernel(bf16(512, 1, true), sw).seesaw);
  sw = {};
  sw.groups = 0;
  EXPECT_FALSE(plan_sparse_kernel(bf16(512, 1, true), sw).group_fill);
  EXPECT_FALSE(plan_sparse_kernel(bf16(576, 2, false), sw).group_fill);
  sw.groups = 1;
  EXPECT_TRUE(plan_sparse_kernel(bf16(576, 2, false), sw).group_fill);
  for (int form : {0, 1}) {
    sw = {};
    sw.stream = form;
    EXPECT_EQ(plan_sparse_kernel(quantised(F::kFP4, 512, 1), sw).stream, form);
    EXPECT_EQ(plan_sparse_kernel(quantised(F::kFP8_Model1, 512, 2), sw).stream, form);
  }
  sw = {};
  sw.pair = 0;
  EXPECT_FALSE(plan_sparse_kernel(quantised(F::kFP8_V32, 576, 2), sw).pair);
  sw = {};
  sw.generic_fill = true;
  sw.ring = 1;  // (the ring needs the fill built for one format)
  EXPECT_FALSE(plan_sparse_kernel(quantised(F::kFP8_V32, 576, 1), sw).ring);
  const SparseKernelPlan generic = plan_sparse_kernel(quantised(F::kFP8_V32, 576, 2), sw);
  EXPECT_FALSE(generic.fill_for_format || generic.pair);
  EXPECT_EQ(generic.stream, 0);
}

TEST(SparseKernelPlan, TheRingFillRunsWhereItMeasuredFaster) {
  using F = SparseFillFormat;
  auto ring = [](F f, int m_blocks, bool dense, int tiles, SparseTuning sw = {}) {
    SparseKernelShape s = quantised(f, f == F::kFP8_V32 ? 576 : 512, m_blocks, dense);
    s.tiles_per_split = tiles;
    return plan_sparse_kernel(s, sw);
  };
  // Sparse mode: the fp8 formats, any split, in three round slots but fp8_v32's one-tile splits
  // (one stage); h_q 128 unpaired for it on splits of 4+ tiles.
  for (F f : {F::kFP8_V32, F::kFP8_Model1, F::kFP8_MX}) {
    for (int tiles : {2, 3, 4, 16, 32}) EXPECT_EQ(ring(f, 1, false, tiles).ring, 2);
    EXPECT_EQ(ring(f, 1, false, 32).stream, 0);  // a register fill: not in the ring's kernel
    EXPECT_EQ(ring(f, 1, false, 1).ring, f == F::kFP8_V32 ? 1 : 2);  // one-tile splits
    const SparseKernelPlan h128 = ring(f, 2, false, 32);
    EXPECT_FALSE(h128.pair);
    EXPECT_EQ(h128.ring, 2);
    EXPECT_TRUE(ring(f, 2, false, 2).pair);  // short splits keep the pair (not measured)
    EXPECT_EQ(ring(f, 2, false, 2).ring, 0);
  }
  // fp4: splits of 4+ tiles, unpaired grids only (the pair at h_q 128: the slots 0.93x there).
  EXPECT_EQ(ring(F::kFP4, 1, false, 4).ring, 2);
  EXPECT_EQ(ring(F::kFP4, 1, false, 32).ring, 2);
  EXPECT_EQ(ring(F::kFP4, 1, false, 2).ring, 0);
  EXPECT_TRUE(ring(F::kFP4, 2, false, 32).pair);
  EXPECT_EQ(ring(F::kFP4, 2, false, 32).ring, 0);
  // Dense mode: splits of 4+ tiles in the slots (fp8_v32 at most 16); two m-blocks unpaired in
  // them on the fp8 formats' splits of 4-16 tiles, paired on longer ones and for fp4.
  for (F f : {F::kFP8_Model1, F::kFP8_MX, F::kFP4}) {
    for (int tiles : {4, 16, 64, 512}) EXPECT_EQ(ring(f, 1, true, tiles).ring, 2);
    EXPECT_EQ(ring(f, 1, true, 2).ring, 0);
    EXPECT_TRUE(ring(f, 2, true, 64).pair);
    EXPECT_EQ(ring(f, 2, true, 8).pair, f == F::kFP4);
  }
  EXPECT_EQ(ring(F::kFP8_V32, 1, true, 16).ring, 2);
  EXPECT_EQ(ring(F::kFP8_V32, 1, true, 64).ring, 0);
  EXPECT_EQ(ring(F::kFP8_V32, 1, true, 2).ring, 0);
  EXPECT_FALSE(ring(F::kFP8_V32, 2, true, 16).pair);
  EXPECT_EQ(ring(F::kFP8_V32, 2, true, 16).ring, 2);
  EXPECT_TRUE(ring(F::kFP8_V32, 2, true, 32).pair);
  EXPECT_TRUE(ring(F::kFP8_V32, 2, true, 2).pair);
  // The switches: the ring off anywhere (the pairs back); on wherever the kernel runs
  // (unpaired, one format), in the slots unless `slots` is 0.
  SparseTuning off;
  off.ring = 0;
  EXPECT_FALSE(ring(F::kFP8_V32, 1, false, 32, off).ring);
  EXPECT_TRUE(ring(F::kFP8_V32, 2, false, 32, off).pair);
  EXPECT_EQ(ring(F::kFP8_Model1, 1, false, 32, off).stream, 1);
  SparseTuning on;
  on.ring = 1;
  for (F f : {F::kFP8_V32, F::kFP8_Model1, F::kFP8_MX, F::kFP4}) {
    for (bool dense : {false, true}) {
      EXPECT_EQ(ring(f, 1, dense, 2, on).ring, 2);
      EXPECT_EQ(ring(f, 2, dense, 2, on).ring, 0);  // paired unless the pair is off
      SparseTuning unpaired = on;
      unpaired.pair = 0;
      EXPECT_EQ(ring(f, 2, dense, 32, unpaired).ring, 2);
    }
  }
  SparseTuning paired;  // the pair forced: no ring at h_q 128
  paired.pair = 1;
  EXPECT_TRUE(ring(F::kFP8_V32, 2, false, 32, paired).pair);
  EXPECT_EQ(ring(F::kFP8_V32, 2, false, 32, paired).ring, 0);
  SparseTuning one_stage;  // the one-stage form where it is compiled (sparse mode, d 576)
  one_stage.slots = 0;
  EXPECT_EQ(ring(F::kFP8_V32, 1, false, 32, one_stage).ring, 1);
  EXPECT_EQ(ring(F::kFP8_Model1, 1, false, 32, one_stage).ring, 2);  // d 512: the slots
  EXPECT_EQ(ring(F::kFP8_MX, 1, true, 16, one_stage).ring, 2);       // the dense mode: the slots
  EXPECT_TRUE(ring(F::kFP8_V32, 2, false, 32, one_stage).pair);
  SparseTuning slots;  // the slots even on fp8_v32's one-tile splits
  slots.slots = 1;
  EXPECT_EQ(ring(F::kFP8_V32, 1, false, 1, slots).ring, 2);
  // The slots' keys staged as fp16 (form 3, compiled for the dense mode) where the slots run
  // over an fp8 format; not fp4 (no e2m1 conversion on SM90), not the register fills, not the
  // sparse mode.
  SparseTuning fp16;
  fp16.fp16 = 1;
  for (F f : {F::kFP8_V32, F::kFP8_Model1, F::kFP8_MX}) {
    EXPECT_EQ(ring(f, 1, false, 32, fp16).ring, 2);
    EXPECT_EQ(ring(f, 2, false, 32, fp16).ring, 2);  // h_q 128 unpaired in the slots
    EXPECT_EQ(ring(f, 1, true, 16, fp16).ring, 3);
    EXPECT_EQ(ring(f, 2, true, 64, fp16).ring, 0);   // the pair
  }
  EXPECT_EQ(ring(F::kFP8_V32, 1, false, 1, fp16).ring, 1);  // fp8_v32's one-tile splits
  EXPECT_EQ(ring(F::kFP4, 1, false, 32, fp16).ring, 2);
  EXPECT_EQ(ring(F::kFP8_V32, 1, false, 32).ring, 2);  // not the sparse grids' default
  // The default on the dense mode's memory-bound grids (at most 32 rows) with 64+ tiles a split.
  auto dense_rows = [](F f, int rows, int tiles, SparseTuning sw = {}) {
    SparseKernelShape s = quantised(f, f == F::kFP8_V32 ? 576 : 512, 1, true);
    s.rows = rows;
    s.tiles_per_split = tiles;
    return plan_sparse_kernel(s, sw);
  };
  for (F f : {F::kFP8_V32, F::kFP8_Model1, F::kFP8_MX}) {
    EXPECT_EQ(dense_rows(f, 16, 64).ring, 3);
    EXPECT_EQ(dense_rows(f, 32, 512).ring, 3);
    EXPECT_EQ(dense_rows(f, 16, 64).stream, 0);
    EXPECT_EQ(dense_rows(f, 64, 64).ring, f == F::kFP8_V32 ? 0 : 2);  // h_q 64: not faster
    EXPECT_EQ(dense_rows(f, 16, 16).ring, 2);                           // short splits
    SparseTuning no_fp16;
    no_fp16.fp16 = 0;
    EXPECT_EQ(dense_rows(f, 16, 64, no_fp16).ring, f == F::kFP8_V32 ? 0 : 2);
    SparseTuning no_ring;
    no_ring.ring = 0;
    EXPECT_EQ(dense_rows(f, 16, 64, no_ring).ring, 0);
  }
  EXPECT_EQ(dense_rows(F::kFP4, 16, 64).ring, 2);
  EXPECT_FALSE(plan_sparse_kernel(quantised(F::kNone, 512, 1), on).ring);  // two formats
  EXPECT_FALSE(plan_sparse_kernel(bf16(512, 1, false), on).ring);
  EXPECT_FALSE(plan_sparse_kernel(bf16(576, 1, true), on).ring);
}

// Sparse prefill from a cache: dequantise once where the direct path decodes each row 8+ times.
TEST(PrefillFromCachePlan, DequantisesOnceWhereKeysRepeat) {
  PrefillFromCacheShape s;
  s.s_q = 4096;
  s.topk = 2048;
  s.h_q = 64;
  s.num_slots = 32768;
  s.quantised = true;
  s.workspace_fits = true;
  EXPECT_EQ(prefill_compact_rows(s.s_q, s.topk, s.num_slots), 32768);
  EXPECT_TRUE(prefill_dequantizes_once(s, -1));   // 256 decodes a row
  EXPECT_FALSE(prefill_dequantizes_once(s, 0));   // forced off
  PrefillFromCacheShape few = s;                  // decode-like: 2 tokens, each row once
  few.s_q = 2;
  EXPECT_EQ(prefill_compact_rows(few.s_q, few.topk, few.num_slots), 4096);
  EXPECT_FALSE(prefill_dequantizes_once(few, -1));
  EXPECT_TRUE(prefill_dequantizes_once(few, 1));  // forced on
  PrefillFromCacheShape two_blocks = s;           // 3 tokens x 2 m-blocks: 6 decodes a row
  two_blocks.s_q = 3;
  two_blocks.h_q = 128;
  EXPECT_FALSE(prefill_dequantizes_once(two_blocks, -1));
  two_blocks.num_slots = 768;  // 3 x 2048 x 2 / 768 = 16 decodes a slot
  EXPECT_TRUE(prefill_dequantizes_once(two_blocks, -1));
  for (auto off : {&PrefillFromCacheShape::quantised, &PrefillFromCacheShape::workspace_fits}) {
    PrefillFromCacheShape t = s;
    t.*off = false;
    EXPECT_FALSE(prefill_dequantizes_once(t, -1));
    EXPECT_FALSE(prefill_dequantizes_once(t, 1));  // never without room, never for bf16 rows
  }
  EXPECT_EQ(prefill_compact_rows(0, 2048, 100), 0);
  EXPECT_EQ(prefill_compact_rows(5, 2048, 0), 0);
}

}  // namespace
}  // namespace openmla::core
