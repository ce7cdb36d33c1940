// The sparse kernels' split plan (core/sparse_split_plan.h): every plan covers the key list,
// stays within the workspace's split bound, and the plans of the benchmark's shapes are the ones
// bench/RESULTS.md's figures ran with.
#include <gtest/gtest.h>

#include <cstdint>

#include "core/sparse_split_plan.h"

namespace openmla::core {
namespace {

void expect_valid(const SparseSplitPlan& plan, int sms, int64_t ctas, int64_t max_tiles) {
  if (max_tiles == 0) {
    EXPECT_EQ(plan.num_splits, 1);
    EXPECT_EQ(plan.tiles_per_split, 0);
    return;
  }
  ASSERT_GE(plan.num_splits, 1);
  ASSERT_GE(plan.tiles_per_split, 1);
  // Every tile walked by one split: the splits cover the list, and none is empty.
  EXPECT_GE(static_cast<int64_t>(plan.num_splits) * plan.tiles_per_split, max_tiles);
  EXPECT_LT(static_cast<int64_t>(plan.num_splits - 1) * plan.tiles_per_split, max_tiles);
  EXPECT_LE(plan.num_splits, sparse_max_splits(sms, ctas)) << "more splits than the workspace";
}

TEST(SparseSplitPlan, CoversTheListWithinTheWorkspaceBound) {
  for (int sms : {1, 16, 78, 132}) {
    for (int64_t ctas : {1, 2, 3, 7, 64, 131, 132, 133, 1000}) {
      for (int64_t tiles : {0, 1, 2, 5, 31, 32, 33, 256, 1000}) {
        for (int overhead : {0, 1, 4, 16}) {
          expect_valid(plan_sparse_splits(sms, ctas, tiles, overhead), sms, ctas, tiles);
        }
        for (int forced : {1, 2, 3, 8, 16, 300}) {
          expect_valid(forced_sparse_splits(sms, ctas, tiles, forced), sms, ctas, tiles);
        }
      }
    }
  }
}

TEST(SparseSplitPlan, MaxSplitsFillsTheSmsOnce) {
  EXPECT_EQ(sparse_max_splits(132, 1), 132);
  EXPECT_EQ(sparse_max_splits(132, 4), 33);
  EXPECT_EQ(sparse_max_splits(132, 64), 3);
  EXPECT_EQ(sparse_max_splits(132, 132), 1);
  EXPECT_EQ(sparse_max_splits(132, 500), 1);
  EXPECT_EQ(sparse_max_splits(1000, 1), kSparseMaxSplits);
}

// The plans behind the H100 figures (132 SMs, topk 2048 = 32 tiles, overhead 1): h_q 16 at b 1,
// 4, 8 (one m-block a token), b 64 at h_q 64 and 128 (two m-blocks a token).
TEST(SparseSplitPlan, BenchmarkShapes) {
  auto plan = [](int64_t ctas) { return plan_sparse_splits(132, ctas, 32, 1); };
  EXPECT_EQ(plan(1).num_splits, 32);   // b 1: 32 one-tile splits
  EXPECT_EQ(plan(4).num_splits, 32);   // b 4: 128 CTAs, one wave
  EXPECT_EQ(plan(8).num_splits, 16);   // b 8: 16 splits of 2 tiles
  EXPECT_EQ(plan(8).tiles_per_split, 2);
  EXPECT_EQ(plan(64).num_splits, 2);   // b 64, h_q 64: 2 splits of 16 tiles
  EXPECT_EQ(plan(64).tiles_per_split, 16);
  EXPECT_EQ(plan(128).num_splits, 1);  // b 64, h_q 128 (or b 128, h_q 64): unsplit
}

TEST(SparseSplitPlan, ForcedSplitLengthIsKeptWhereTheBoundAllows) {
  const SparseSplitPlan p8 = forced_sparse_splits(132, 4, 32, 8);
  EXPECT_EQ(p8.num_splits, 4);
  EXPECT_EQ(p8.tiles_per_split, 8);
  // b 64 h_q 64: the workspace holds 3 splits, so 1-tile splits become 3 of 11 tiles.
  const SparseSplitPlan p1 = forced_sparse_splits(132, 64, 32, 1);
  EXPECT_EQ(p1.num_splits, 3);
  EXPECT_EQ(p1.tiles_per_split, 11);
  // Longer than the list: one split.
  const SparseSplitPlan p64 = forced_sparse_splits(132, 1, 32, 64);
  EXPECT_EQ(p64.num_splits, 1);
  EXPECT_EQ(p64.tiles_per_split, 32);
}

}  // namespace
}  // namespace openmla::core
