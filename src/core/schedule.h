// Split-KV schedule planning on the host (the specification of the GPU planner; DESIGN §2.1).
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

}  // namespace openmla::core
