// The greedy deal behind the split plan (schedule.h), shared word for word by the host planner
// and the GPU planner's threads so that both plan bit for bit.
//
// Workers take requests in order, each up to `capacity` cost units: a request piece costs its key
// blocks plus `overhead` (a continued request pays the overhead again). A request that does not
// fit is split when more than the overhead is left (the worker takes room - overhead blocks), else
// it goes whole to the next worker. For a fixed capacity, filling each worker as far as it goes
// never leaves later workers more to do, so the smallest capacity at which the deal fits the
// workers is the smallest busiest worker any in-order plan of this cost model has.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define OPENMLA_HOST_DEVICE __host__ __device__
#else
#define OPENMLA_HOST_DEVICE
#endif

namespace openmla::core {

// Above this many requests the planners keep the share plan (the GPU planner holds every
// request's line position in shared memory for its walk).
constexpr int64_t kScheduleGreedyMaxBatch = 512;

// Deals requests 0 .. batch-1 (blocks(i) key blocks each) over `parts` workers of `capacity` units.
// record(w, request, block) gets each worker's end until the requests run out: the worker stops
// before block `block` of `request` (block 0: before the request; request == batch: past every
// request). Returns whether every request was dealt.
template <class Blocks, class Record>
OPENMLA_HOST_DEVICE bool deal_greedy(const Blocks& blocks, int64_t batch, int64_t parts,
                                     int64_t overhead, int64_t capacity, const Record& record) {
  int64_t request = 0, done = 0;  // the next request and how many of its blocks are dealt
  // Cost of the rest of `request` as one piece, and of the request after it: read one request
  // ahead, so the GPU thread's shared-memory load is off the walk's dependency chain.
  int64_t rest = batch > 0 ? blocks(0) + overhead : 0;
  int64_t following = batch > 1 ? blocks(1) + overhead : 0;
  for (int64_t w = 0; w < parts && request < batch; ++w) {
    int64_t room = capacity;
    while (request < batch) {
      if (rest <= room) {
        room -= rest;
        ++request;
        done = 0;
        rest = following;
        following = request + 1 < batch ? blocks(request + 1) + overhead : 0;
        continue;
      }
      if (room > overhead) {  // split: room - overhead < the blocks left
        done += room - overhead;
        rest -= room - overhead;
      }
      break;
    }
    record(w, request, done);
  }
  return request == batch;
}

}  // namespace openmla::core
