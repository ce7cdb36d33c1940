#include "core/sparse_split_plan.h"

#include <cstdint>

namespace openmla::core {

int sparse_max_splits(int sms, int64_t ctas) {
  if (ctas <= 0 || ctas >= sms) return 1;
  const int64_t s = (sms + ctas - 1) / ctas;
  return static_cast<int>(s < kSparseMaxSplits ? s : kSparseMaxSplits);
}

SparseSplitPlan plan_sparse_splits(int sms, int64_t ctas, int64_t max_tiles, int overhead_tiles) {
  if (max_tiles <= 0) return {1, 0};
  const int limit = sparse_max_splits(sms, ctas);
  int64_t best_cost = INT64_MAX;
  SparseSplitPlan best = {1, static_cast<int>(max_tiles)};
  for (int s = 1; s <= limit && s <= max_tiles; ++s) {
    const int64_t tps = (max_tiles + s - 1) / s;
    const int64_t splits = (max_tiles + tps - 1) / tps;
    const int64_t waves = (ctas * splits + sms - 1) / sms;
    const int64_t cost = waves * (tps + overhead_tiles) + (splits > 1 ? 1 : 0);
    if (cost < best_cost) {
      best_cost = cost;
      best = {static_cast<int>(splits), static_cast<int>(tps)};
    }
  }
  return best;
}

SparseSplitPlan forced_sparse_splits(int sms, int64_t ctas, int64_t max_tiles,
                                     int tiles_per_split) {
  if (max_tiles <= 0) return {1, 0};
  if (tiles_per_split < 1) tiles_per_split = 1;
  const int64_t limit = sparse_max_splits(sms, ctas);
  int64_t splits = (max_tiles + tiles_per_split - 1) / tiles_per_split;
  splits = splits < limit ? splits : limit;
  const int64_t tps = (max_tiles + splits - 1) / splits;
  return {static_cast<int>((max_tiles + tps - 1) / tps), static_cast<int>(tps)};
}

}  // namespace openmla::core
