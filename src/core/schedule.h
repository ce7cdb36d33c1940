// Split-KV schedule planning on the host (the specification of the GPU planner; docs/semantics.md, dense decode).
//
// Work of request i is  blocks_i = ceil(seqlen_i / block_tokens)  plus a fixed cost per split
// (`split_overhead_blocks`, the price of reloading q and writing a partial). Requests are dealt in
// order over `num_sm_parts` workers, each filled up to the smallest capacity at which the deal
// fits (schedule_greedy.h; above kScheduleGreedyMaxBatch requests, equal shares of the total); a
// request that straddles a worker's end is split there. Requests with seqlen 0 get one (empty)
// split so their output is written.
// Splitting has a price the model does not see: fp32 partials written and read back by a combine
// pass. So the planner also deals whole requests (each share boundary moved to the nearest
// request boundary) and takes that plan when its busiest worker carries at most
// `combine_blocks` more than one share + one overhead (the equal-share plan's bound): then no
// request is split and the combine has nothing to do (equal-length batches at or above the
// worker count).
#pragma once

#include <cstdint>

#include "openmla/ops.h"

namespace openmla::core {

// A worker's row of the schedule metadata, by field (the layout openmla/ops.h documents); the
// decode kernels read its first kScheduleRowFields ints.
enum ScheduleField : int {
  kBeginRequest = 0,  // the first request the worker walks
  kBeginToken = 1,    // its first key in that request
  kEndRequest = 2,    // the last request it walks (inclusive; < kBeginRequest: an idle worker)
  kEndToken = 3,      // one past its last key in that request
  kBeginSplit = 4,    // the global split index of its first piece
  kScheduleRowFields = 5,
};

constexpr int kScheduleSplitOverheadBlocks = 5;
// What a split plan costs beyond its shares (the combine pass), in key blocks of one worker.
constexpr int kScheduleCombineBlocks = 6;

// metadata: [num_sm_parts, kScheduleMetadataInts], num_splits: [batch + 1] (contiguous).
void plan_decode_schedule_host(const int32_t* seqlens, int batch, int num_sm_parts,
                               int block_tokens, int split_overhead_blocks, int combine_blocks,
                               int32_t* metadata, int32_t* num_splits);

// A bound on the number of splits any schedule of this size holds (workspace sizing).
inline int64_t max_schedule_splits(int64_t batch, int64_t num_sm_parts) {
  return batch + num_sm_parts;
}

// Split partials in the decode workspace (cuda/common/combine.h, "o_accum"); constexpr, so
// the CUDA kernels call them too.

// The 16-row groups of a decode CTA's 64 rows that hold a query row, for s_q * group = rows_kv
// rows a kv head: only those warps' accumulators are stored.
constexpr int partial_row_groups(int rows_kv) {
  return ((rows_kv < 64 ? rows_kv : 64) + 15) / 16;
}

// o_accum's slot of global split `split` of request r, whose first split is `first`: piece j
// of a split request takes slot 2 (first - r) + j. first - r counts the extra splits of the
// requests before r, and a split request adds n - 1 >= 1 of them for its n pieces, so the next
// split request's slots start at least 2 (n - 1) >= n later: no two pieces share a slot, and
// whole requests (which store none) take no room.
constexpr int partial_slot(int split, int first, int r) {
  return split + first - 2 * r;
}

// o_accum's block index of (partial slot, kv head, m-block): the decode kernel stores, the
// combine reads and the workspace sizes by this one rule. A block holds 16 partial_row_groups
// rows x d_v floats (partial_block_floats), in the decode CTA's accumulator order (combine.h).
constexpr int64_t partial_block(int slot, int kv_head, int m_block, int h_kv, int m_blocks) {
  return (static_cast<int64_t>(slot) * h_kv + kv_head) * m_blocks + m_block;
}
// The same block in float4s, from the count of 16-row groups the kernels hold.
constexpr int partial_block_float4s(int row_groups, int d_v) { return row_groups * 16 * d_v / 4; }
constexpr int64_t partial_block_floats(int rows_kv, int d_v) {
  return static_cast<int64_t>(4) * partial_block_float4s(partial_row_groups(rows_kv), d_v);
}

// Slots any schedule of num_sm_parts workers needs: its splits number at most batch +
// num_sm_parts (core::max_schedule_splits), so the extra splits at most num_sm_parts.
constexpr int64_t max_partial_slots(int64_t num_sm_parts) { return 2 * num_sm_parts; }

}  // namespace openmla::core
