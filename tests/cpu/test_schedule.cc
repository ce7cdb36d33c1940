// The split-KV schedule planner (src/core/schedule.h, metadata layout in ops.h), checked by its
// invariants on random and edge-case lengths: every request's tokens covered exactly once and in
// order, split boundaries on block_tokens multiples, num_splits consistent with the pieces,
// begin_split the running split count, and every worker within one share + one overhead (+ the
// combine price when the plan deals whole requests); requests of two shares dealt in halves.
#include <gtest/gtest.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "common/test_data.h"
#include "core/schedule.h"
#include "core/schedule_greedy.h"
#include "openmla/openmla.h"

namespace openmla::testing {
namespace {

struct Plan {
  std::vector<int32_t> metadata, num_splits;
};

Plan plan(const std::vector<int32_t>& seqlens, int parts, int block_tokens) {
  Plan p;
  p.metadata.assign(static_cast<size_t>(parts) * kScheduleMetadataInts, -99);
  p.num_splits.assign(seqlens.size() + 1, -99);
  core::plan_decode_schedule_host(seqlens.data(), static_cast<int>(seqlens.size()), parts,
                                  block_tokens, core::kScheduleSplitOverheadBlocks,
                                  core::kScheduleCombineBlocks, p.metadata.data(),
                                  p.num_splits.data());
  return p;
}

void check_invariants(const std::vector<int32_t>& seqlens, int parts, int block_tokens,
                      const Plan& p) {
  SCOPED_TRACE(::testing::Message() << "batch=" << seqlens.size() << " parts=" << parts
                                    << " block_tokens=" << block_tokens);
  const int64_t batch = seqlens.size();
  const int64_t overhead = core::kScheduleSplitOverheadBlocks;
  auto blocks = [&](int64_t len) { return (len + block_tokens - 1) / block_tokens; };
  int64_t total = 0;
  for (int32_t len : seqlens) total += blocks(len) + overhead;
  const int64_t share = (total + parts - 1) / parts;

  std::vector<int64_t> covered(batch, 0), pieces(batch, 0);  // next expected token, pieces seen
  int64_t split = 0, last_request = -1, max_cost = 0;
  for (int w = 0; w < parts; ++w) {
    const int32_t* m = p.metadata.data() + w * kScheduleMetadataInts;
    EXPECT_EQ(m[5], 0);
    EXPECT_EQ(m[6], 0);
    EXPECT_EQ(m[7], 0);
    EXPECT_EQ(m[4], split) << "worker " << w << ": begin_split is the running split count";
    int64_t cost = 0;
    for (int64_t r = m[0]; r <= m[2]; ++r) {
      ASSERT_GE(r, 0);
      ASSERT_LT(r, batch);
      const int64_t begin = r == m[0] ? m[1] : 0, end = r == m[2] ? m[3] : seqlens[r];
      ASSERT_GE(r, last_request) << "requests in order";
      last_request = r;
      EXPECT_EQ(begin, covered[r]) << "request " << r << " continues where it stopped";
      EXPECT_EQ(begin % block_tokens, 0);
      EXPECT_TRUE(end == seqlens[r] || end % block_tokens == 0) << "split on a block boundary";
      EXPECT_LE(end, seqlens[r]);
      // Only a request with no keys has an empty piece (its one split).
      if (seqlens[r] > 0) {
        EXPECT_LT(begin, end) << "request " << r;
      } else {
        EXPECT_EQ(end, 0);
      }
      covered[r] = end;
      ++pieces[r];
      ++split;
      cost += blocks(end) - begin / block_tokens + overhead;
    }
    max_cost = std::max(max_cost, cost);
  }
  const bool whole = p.num_splits[batch] == batch;  // no request split
  EXPECT_LE(max_cost, share + overhead + (whole ? core::kScheduleCombineBlocks : 0));
  EXPECT_EQ(p.num_splits[0], 0);
  for (int64_t r = 0; r < batch; ++r) {
    EXPECT_EQ(covered[r], seqlens[r]) << "request " << r << " fully covered";
    EXPECT_GE(pieces[r], 1);
    EXPECT_EQ(p.num_splits[r + 1] - p.num_splits[r], pieces[r]) << "request " << r;
  }
  EXPECT_EQ(p.num_splits[batch], split);
  EXPECT_LE(split, core::max_schedule_splits(batch, parts));
  // The pieces of split requests own distinct workspace slots below the bound (whole requests
  // store no partial).
  std::vector<bool> taken(core::max_partial_slots(parts), false);
  for (int64_t r = 0; r < batch; ++r) {
    const int first = p.num_splits[r], n = p.num_splits[r + 1] - first;
    if (n < 2) continue;
    for (int j = 0; j < n; ++j) {
      const int slot = core::partial_slot(first + j, first, static_cast<int>(r));
      ASSERT_GE(slot, 0) << "request " << r;
      ASSERT_LT(slot, core::max_partial_slots(parts)) << "request " << r;
      EXPECT_FALSE(taken[slot]) << "request " << r << " piece " << j << " slot " << slot;
      taken[slot] = true;
    }
  }
}

TEST(Schedule, RandomLengthsKeepInvariants) {
  Rng rng(1);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t batch = rng.randint(0, 40);
    const int parts = static_cast<int>(rng.randint(1, 140));
    const int block_tokens = std::vector<int>{1, 16, 64}[rng.randint(0, 2)];
    std::vector<int32_t> seqlens(batch);
    for (int32_t& len : seqlens)
      len = rng.coin(0.15) ? 0 : static_cast<int32_t>(rng.randint(1, 20000));
    check_invariants(seqlens, parts, block_tokens, plan(seqlens, parts, block_tokens));
  }
}

TEST(Schedule, EdgeCases) {
  const struct {
    std::vector<int32_t> seqlens;
    int parts;
  } cases[] = {
      {{}, 4},                  // no requests
      {{0, 0, 0}, 8},           // nothing to attend: one empty split each
      {{1 << 20}, 132},         // one long request split over every worker
      {{10, 3}, 200},           // far more workers than work
      {{64, 64, 64, 64}, 1},    // one worker takes everything whole
      {{0, 5000, 0, 1, 0}, 7},  // empty requests between long ones
      {{4096, 4096, 4096, 4096}, 132},
  };
  for (const auto& c : cases) {
    const Plan p = plan(c.seqlens, c.parts, 64);
    check_invariants(c.seqlens, c.parts, 64, p);
  }
  // One long request: every worker gets a piece, so it is split parts ways.
  const Plan p = plan({1 << 20}, 132, 64);
  EXPECT_EQ(p.num_splits[1], 132);
  // Workers past the work are idle (begin_request > end_request).
  const Plan idle = plan({10, 3}, 200, 64);
  int busy = 0;
  for (int w = 0; w < 200; ++w) {
    const int32_t* m = idle.metadata.data() + w * kScheduleMetadataInts;
    busy += m[0] <= m[2];
  }
  EXPECT_EQ(busy, 2);
}

// Equal lengths at or above the worker count: whole requests, no split (nothing to combine),
// the busiest worker within the combine price of the split plan. Varlen or few long requests:
// the split plan, whose busiest worker is then within share + overhead.
TEST(Schedule, WholeRequestsWhenSplittingDoesNotPay) {
  struct Case {
    int batch, len, parts;
    bool whole;
  } cases[] = {
      {128, 4096, 66, true},    // 69 units each, share 134: two whole requests a worker (138)
      {128, 1024, 132, true},   // one request a worker, 4 idle
      {128, 8192, 132, true},   //
      {128, 4096, 33, true},    // s_q 2, h_q 128: four requests a worker at most
      {32, 1024, 66, true},     // halves would be capacity 13 against 21 whole, but run slower
      {128, 32768, 132, false}, // one whole request (517) is 10 units above share + overhead
      {4, 4096, 132, false},    // far fewer requests than workers: split
      {1, 131072, 66, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.batch << " x " << c.len << ", " << c.parts << " parts");
    const std::vector<int32_t> lens(c.batch, c.len);
    const Plan p = plan(lens, c.parts, 64);
    check_invariants(lens, c.parts, 64, p);
    EXPECT_EQ(p.num_splits[c.batch] == c.batch, c.whole);
  }
  // Varlen (uniform lengths): a whole plan's busiest worker is far above the share: split.
  Rng rng(3);
  std::vector<int32_t> lens(128);
  for (int32_t& l : lens) l = static_cast<int32_t>(rng.randint(1, 8191));
  const Plan p = plan(lens, 66, 64);
  check_invariants(lens, 66, 64, p);
  EXPECT_GT(p.num_splits[128], 128);
}

// Requests of about two workers' shares are dealt in halves (one piece, one partial a worker),
// not cut where equal shares end (most workers two pieces, ~29 + ~2 blocks).
TEST(Schedule, DealsHalvesWhenRequestsAreTwoShares) {
  for (const auto& [batch, len] : {std::pair{32, 4096}, std::pair{1, 131072}}) {
    SCOPED_TRACE(::testing::Message() << batch << " x " << len);
    const std::vector<int32_t> lens(batch, len);
    const Plan p = plan(lens, 66, 64);
    check_invariants(lens, 66, 64, p);
    const int64_t pieces_per_request = 64 / batch;
    for (int r = 0; r < batch; ++r) {
      EXPECT_EQ(p.num_splits[r + 1] - p.num_splits[r], pieces_per_request) << "request " << r;
    }
    for (int w = 0; w < 66; ++w) {
      const int32_t* m = p.metadata.data() + w * kScheduleMetadataInts;
      if (w >= 64) {
        EXPECT_GT(m[0], m[2]) << "worker " << w << " idle";
        continue;
      }
      EXPECT_EQ(m[0], m[2]) << "worker " << w << ": one piece";
      EXPECT_EQ(m[3] - m[1], len / pieces_per_request) << "worker " << w;
    }
  }
}

// The GPU planner walks the deal a worker at a time (decode_schedule.cu): a worker starting at x
// on the line of C ends at x + capacity (- overhead inside a request), snapped to the start of
// the request it falls in when at most the overhead in. This scalar mirror of that walk must give
// the host deal's boundaries for every overhead and capacity, fitting or not.
TEST(Schedule, WorkerJumpsGiveTheDealsBoundaries) {
  Rng rng(11);
  for (int trial = 0; trial < 3000; ++trial) {
    const int64_t batch = rng.randint(0, 30);
    const int64_t parts = rng.randint(1, 80);
    const int64_t overhead = std::vector<int64_t>{0, 1, 5, 9}[rng.randint(0, 3)];
    std::vector<int64_t> blocks(batch), prefix(batch + 1, 0);
    for (int64_t i = 0; i < batch; ++i) {
      blocks[i] = rng.coin(0.2) ? 0 : rng.randint(1, std::vector<int64_t>{3, 60, 900}[rng.randint(0, 2)]);
      prefix[i + 1] = prefix[i] + blocks[i] + overhead;
    }
    const int64_t total = prefix[batch];
    const int64_t capacity = rng.randint(0, total / parts + overhead + 3);
    SCOPED_TRACE(::testing::Message() << "batch " << batch << " parts " << parts << " overhead "
                                      << overhead << " capacity " << capacity);
    std::vector<std::pair<int64_t, int64_t>> dealt, jumped;
    const bool fits = core::deal_greedy([&](int64_t i) { return blocks[i]; }, batch, parts,
                                        overhead, capacity, [&](int64_t, int64_t r, int64_t k) {
                                          if (r < batch) dealt.emplace_back(r, k);
                                        });
    bool jump_fits = false;
    int64_t x = 0, r = 0;
    bool inside = false;
    for (int64_t w = 0; w < parts; ++w) {
      const int64_t target = x + capacity - (inside ? overhead : 0);
      if (target >= total) {
        jump_fits = true;
        break;
      }
      while (r + 1 < batch && prefix[r + 1] <= target) ++r;
      const int64_t into = target - prefix[r];
      inside = into > overhead;
      x = inside ? target : prefix[r];
      jumped.emplace_back(r, inside ? into - overhead : 0);
    }
    EXPECT_EQ(fits, jump_fits);
    EXPECT_EQ(dealt, jumped);
  }
}

// The public entry point on CPU tensors plans the same schedule, for a strided seqlens view too.
TEST(Schedule, PublicApiMatchesHostPlanner) {
  Rng rng(7);
  const int64_t batch = 9;
  HostTensor seqlens(DType::kInt32, {batch}, {3});
  std::vector<int32_t> lens(batch);
  for (int64_t i = 0; i < batch; ++i) {
    lens[i] = static_cast<int32_t>(rng.randint(0, 3000));
    seqlens.set({i}, lens[i]);
  }
  int parts = 0;
  ASSERT_TRUE(decode_num_sm_parts(Device::cpu(), 1, 128, 1, &parts).ok());
  ASSERT_GE(parts, 1);
  for (int requested : {0, 5}) {
    const int rows = requested ? requested : parts;
    HostTensor metadata(DType::kInt32, {rows, kScheduleMetadataInts}),
        splits(DType::kInt32, {batch + 1});
    DecodeScheduleArgs args;
    args.seqlens = seqlens.view();
    args.num_sm_parts = requested;
    args.block_tokens = 64;
    args.metadata = metadata.view();
    args.num_splits = splits.view();
    const Status st = plan_decode_schedule(args);
    ASSERT_TRUE(st.ok()) << st.message();
    const Plan ref = plan(lens, rows, 64);
    std::vector<int32_t> got_meta, got_splits;
    for (double v : metadata.values()) got_meta.push_back(static_cast<int32_t>(v));
    for (double v : splits.values()) got_splits.push_back(static_cast<int32_t>(v));
    EXPECT_EQ(got_meta, ref.metadata);
    EXPECT_EQ(got_splits, ref.num_splits);
    check_invariants(lens, rows, 64, ref);
  }
}

}  // namespace
}  // namespace openmla::testing
