// The split-KV planner (src/core/schedule.h). Integer arithmetic only, one pass in request order,
// so a GPU planner reproduces it bit for bit.
//
// Lay the requests on a line of cost units: request i occupies [C_i, C_{i+1}), its
// split_overhead_blocks units first, then one unit per key block (C = prefix sum of
// blocks_i + overhead, total T = C_batch). Worker w owns the share [w * S, (w + 1) * S) with
// S = ceil(T / num_sm_parts). A share boundary x inside request r becomes the block boundary
//   k = max(0, x - C_r - overhead)   (0 <= k < blocks_r):
// k > 0 splits request r after k blocks; k = 0 (x inside the overhead) puts all of r in the next
// worker. So every worker does at most S + overhead units (a continued request pays its overhead
// again), each request is covered exactly once and in order, and a request with no keys lands
// whole in one worker (one empty split).
//
// That share plan is the fallback. Up to kScheduleGreedyMaxBatch requests the split plan is the
// greedy deal of schedule_greedy.h at the smallest capacity that fits, which is at most
// S + overhead: the share plan cuts requests where the shares end, so 32 requests of 64 blocks
// over 66 workers (overhead 5) leave most workers two partial pieces (~29 + ~2 blocks, two fp32
// partials to write), where the deal at capacity 37 gives 64 workers one half each.
//
// The whole-request plan moves each boundary x to the nearer end of the request it falls in
// (its start when x - C_r < cost_r / 2, else its end), so no request is split; it is taken when
// its busiest worker has at most S + overhead + combine_blocks units (schedule.h).
//
// Reading a worker's metadata row {begin_request, begin_token, end_request, end_token, ...}:
// it walks requests begin_request ..= end_request (end_request inclusive), request r over tokens
// [r == begin_request ? begin_token : 0, r == end_request ? end_token : seqlen_r), one split
// each, numbered from begin_split. An idle worker has begin_request > end_request.
#include "core/schedule.h"

#include "core/schedule_greedy.h"

#include <algorithm>
#include <vector>

namespace openmla::core {

void plan_decode_schedule_host(const int32_t* seqlens, int batch, int num_sm_parts,
                               int block_tokens, int split_overhead_blocks, int combine_blocks,
                               int32_t* metadata, int32_t* num_splits) {
  const int64_t parts = std::max(num_sm_parts, 1);
  const int64_t tokens_per_block = std::max(block_tokens, 1);
  const int64_t overhead = std::max(split_overhead_blocks, 0);
  auto seqlen = [&](int64_t i) { return std::max<int64_t>(seqlens[i], 0); };
  auto blocks = [&](int64_t i) { return (seqlen(i) + tokens_per_block - 1) / tokens_per_block; };

  std::vector<int64_t> start(static_cast<size_t>(batch) + 1, 0);  // C_i
  for (int64_t i = 0; i < batch; ++i) start[i + 1] = start[i] + blocks(i) + overhead;
  const int64_t total = start[batch];
  const int64_t share = (total + parts - 1) / parts;

  // Boundary w (w < parts - 1) of both plans: (end_request, end_block), end_block 0 meaning
  // "before end_request"; the last worker ends past every request.
  std::vector<int64_t> split_request(parts, batch), split_block(parts, 0), whole_request(parts, batch);
  int64_t request = 0;
  for (int64_t w = 0; w + 1 < parts; ++w) {
    const int64_t x = (w + 1) * share;
    while (request < batch && start[request + 1] <= x) ++request;
    if (request < batch) {
      const int64_t into = x - start[request], cost = start[request + 1] - start[request];
      split_request[w] = request;
      split_block[w] = std::max<int64_t>(0, into - overhead);
      whole_request[w] = 2 * into < cost ? request : request + 1;
    }
  }
  int64_t busiest = 0;
  for (int64_t w = 0; w < parts; ++w) {
    busiest = std::max(busiest, start[whole_request[w]] - start[w > 0 ? whole_request[w - 1] : 0]);
  }
  // Against share + overhead (the share plan's bound), not the deal's capacity below: with the
  // capacity, 32 requests of 1024 keys over 66 workers took the split plan (halves of 8 blocks,
  // capacity 13 against 21 whole) and ran 17% slower than whole (43.6 vs 37.4 µs, H200): the
  // cost model prices a short piece's fp32 partial and the combine too low.
  const bool whole = busiest <= share + overhead + std::max(combine_blocks, 0);

  // The split plan: the greedy deal at the smallest capacity that fits (schedule_greedy.h),
  // which is at most share + overhead (the share plan's bound, where the deal always fits; the
  // candidates stop one above). Past kScheduleGreedyMaxBatch requests, the share plan.
  if (!whole && batch <= kScheduleGreedyMaxBatch) {
    auto request_blocks = [&](int64_t i) { return blocks(i); };
    std::vector<int64_t> deal_request(parts), deal_block(parts);
    for (int64_t capacity = share; capacity <= share + overhead + 1; ++capacity) {
      // Workers the deal does not reach (it ran out of requests) end past every request.
      std::fill(deal_request.begin(), deal_request.end(), batch);
      std::fill(deal_block.begin(), deal_block.end(), 0);
      if (deal_greedy(request_blocks, batch, parts, overhead, capacity,
                      [&](int64_t w, int64_t r, int64_t k) {
                        deal_request[w] = r;
                        deal_block[w] = k;
                      })) {
        split_request = deal_request;
        split_block = deal_block;
        break;
      }
    }
  }

  int64_t begin_request = 0, begin_block = 0, split = 0;
  num_splits[0] = 0;
  for (int64_t w = 0; w < parts; ++w) {
    const int64_t end_request = whole ? whole_request[w] : split_request[w];
    const int64_t end_block = whole ? 0 : split_block[w];
    // Pieces of requests begin_request .. last, where the last is end_request when the boundary
    // splits it, else the request before it.
    const int64_t last = end_block > 0 ? end_request : end_request - 1;
    int32_t* m = metadata + w * kScheduleMetadataInts;
    m[0] = static_cast<int32_t>(begin_request);
    m[1] = static_cast<int32_t>(begin_block * tokens_per_block);
    m[2] = static_cast<int32_t>(last);
    m[3] = static_cast<int32_t>(end_block > 0 ? end_block * tokens_per_block
                                              : (last >= 0 ? seqlen(last) : 0));
    m[4] = static_cast<int32_t>(split);
    m[5] = m[6] = m[7] = 0;
    // Every request that ends inside this worker closes its split count.
    for (int64_t r = begin_request; r <= last; ++r) {
      ++split;
      if (r < last || end_block == 0) num_splits[r + 1] = static_cast<int32_t>(split);
    }
    begin_request = end_request;
    begin_block = end_block;
  }
}

}  // namespace openmla::core
