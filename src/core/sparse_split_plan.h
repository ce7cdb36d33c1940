// The split plan of the SM90 sparse kernels (sparse decode, sparse prefill, dense decode over a
// KVCache): how many splits each problem's key list is cut into, and how many 64-key tiles a split
// walks. The host computes it per launch (src/cuda/sm90/sparse_decode/launch.cu); CPU tests check
// it here.
#pragma once

#include <cstdint>

namespace openmla::core {

// Splits of one problem at most: enough to fill every SM even for one CTA a problem (b 1 over a
// long dense context). The workspace's partials are sized by it (sparse_decode/launch.cu).
constexpr int kSparseMaxSplits = 256;

struct SparseSplitPlan {
  int num_splits;       // the grid's y
  int tiles_per_split;  // tiles each split walks (the last may walk fewer)
};

// The most splits any plan takes for `ctas` CTAs a split on `sms` SMs: enough CTAs to fill the
// SMs once (the workspace is sized by this bound).
int sparse_max_splits(int sms, int64_t ctas);

// The split count with the least modelled time: waves of CTAs times (tiles a CTA walks + a
// CTA's fixed cost in tiles, `overhead_tiles`), plus one for the combine when split, over
// 1 .. sparse_max_splits. (Enough CTAs to fill the SMs, but in whole waves: 64 tokens x 1
// m-block on 132 SMs take 2 splits in one wave, not 3 in two.) max_tiles 0: {1, 0}.
SparseSplitPlan plan_sparse_splits(int sms, int64_t ctas, int64_t max_tiles, int overhead_tiles);

// `tiles_per_split` tiles a split (an A/B switch of the launch), with never more splits than
// sparse_max_splits: fewer, longer splits where the bound cuts in.
SparseSplitPlan forced_sparse_splits(int sms, int64_t ctas, int64_t max_tiles,
                                     int tiles_per_split);

}  // namespace openmla::core
