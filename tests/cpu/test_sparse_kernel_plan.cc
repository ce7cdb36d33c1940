// The sparse attention kernel's form table (core/sparse_kernel_plan.h): every row pinned, and
// the prefill-from-cache choice between dequantising each named slot once and decoding directly.
#include "core/sparse_kernel_plan.h"

#include <gtest/gtest.h>

namespace openmla::core {
namespace {

SparseKernelShape shape(int d_qk, int m_blocks, bool quantised, bool bf16_aligned,
                        bool prefill = false, bool dense = false) {
  SparseKernelShape s;
  s.d_qk = d_qk;
  s.m_blocks = m_blocks;
  s.quantised = quantised;
  s.bf16_aligned = bf16_aligned;
  s.prefill = prefill;
  s.dense_mode = dense;
  return s;
}

// Row 1: bf16 tiles of the sparse mode take the seesaw at d 512, with one m-block, or in prefill.
TEST(SparseKernelPlan, Bf16SparseTilesTakeTheSeesaw) {
  for (int m : {1, 2}) {
    for (bool prefill : {false, true}) {
      const SparseKernelForm f = plan_sparse_kernel(shape(512, m, false, true, prefill));
      EXPECT_TRUE(f.seesaw);
      EXPECT_EQ(f.cluster, 1);
    }
    EXPECT_TRUE(plan_sparse_kernel(shape(576, m, false, true, true)).seesaw);
  }
  EXPECT_TRUE(plan_sparse_kernel(shape(576, 1, false, true)).seesaw);
  // d 576 decode with two m-blocks: the standard order.
  EXPECT_FALSE(plan_sparse_kernel(shape(576, 2, false, true)).seesaw);
}

// The seesaw never serves the dense mode, unaligned bf16 rows, or caches of mixed kinds.
TEST(SparseKernelPlan, TheSeesawOnlyForAlignedBf16SparseTiles) {
  EXPECT_FALSE(plan_sparse_kernel(shape(512, 1, false, true, false, true)).seesaw);
  EXPECT_FALSE(plan_sparse_kernel(shape(512, 1, false, false)).seesaw);  // unaligned bf16
  EXPECT_EQ(plan_sparse_kernel(shape(512, 2, false, false)).cluster, 1);
}

// Row 2: quantised keys read by an even count of m-blocks: 2-CTA clusters (the crossover).
TEST(SparseKernelPlan, QuantisedPairsOfMBlocksTakeTheCrossover) {
  for (int d : {576, 512}) {
    for (bool dense : {false, true}) {
      EXPECT_EQ(plan_sparse_kernel(shape(d, 2, true, false, false, dense)).cluster, 2);
      EXPECT_EQ(plan_sparse_kernel(shape(d, 4, true, false, false, dense)).cluster, 2);
      EXPECT_FALSE(plan_sparse_kernel(shape(d, 2, true, false, false, dense)).seesaw);
    }
    EXPECT_EQ(plan_sparse_kernel(shape(d, 2, true, false, true)).cluster, 2);  // prefill
  }
}

// Row 3: the rest, the standard order without a cluster.
TEST(SparseKernelPlan, TheRestTakesTheStandardOrder) {
  for (int d : {576, 512}) {
    for (int m : {1, 3}) {
      const SparseKernelForm f = plan_sparse_kernel(shape(d, m, true, false));
      EXPECT_FALSE(f.seesaw);
      EXPECT_EQ(f.cluster, 1);
    }
  }
  const SparseKernelForm dense = plan_sparse_kernel(shape(576, 1, false, true, false, true));
  EXPECT_FALSE(dense.seesaw);
  EXPECT_EQ(dense.cluster, 1);
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
  EXPECT_TRUE(prefill_dequantizes_once(s));  // 256 decodes a row
  PrefillFromCacheShape few = s;             // decode-like: 2 tokens, each row once
  few.s_q = 2;
  EXPECT_EQ(prefill_compact_rows(few.s_q, few.topk, few.num_slots), 4096);
  EXPECT_FALSE(prefill_dequantizes_once(few));
  PrefillFromCacheShape two_blocks = s;  // 3 tokens x 2 m-blocks: 6 decodes a row
  two_blocks.s_q = 3;
  two_blocks.h_q = 128;
  EXPECT_FALSE(prefill_dequantizes_once(two_blocks));
  two_blocks.num_slots = 768;  // 3 x 2048 x 2 / 768 = 16 decodes a slot
  EXPECT_TRUE(prefill_dequantizes_once(two_blocks));
  for (auto off : {&PrefillFromCacheShape::quantised, &PrefillFromCacheShape::workspace_fits}) {
    PrefillFromCacheShape t = s;
    t.*off = false;
    EXPECT_FALSE(prefill_dequantizes_once(t));  // never without room, never for bf16 rows
  }
  EXPECT_EQ(prefill_compact_rows(0, 2048, 100), 0);
  EXPECT_EQ(prefill_compact_rows(5, 2048, 0), 0);
}

}  // namespace
}  // namespace openmla::core
