// GPU split-KV planner (decode_schedule.h): the host walk of src/core/schedule.cc, in parallel.
//
// The host lays requests on a line of cost units (request i occupies [C_i, C_{i+1}),
// cost_i = ceil(seqlen_i / block_tokens) + overhead) and ends worker w's share at
// x_w = (w + 1) * share: inside the request with C_i <= x_w < C_{i+1}, after block
// max(0, x_w - C_i - overhead). Here each request finds the boundaries that fall inside it
// (a prefix sum gives C_i), then each worker reads its two boundaries and a second prefix sum
// over workers gives every worker's first split. Integer arithmetic as on the host (int64).
// The whole-request plan's boundaries (the nearer end of the request a boundary falls in) come
// from the same pass; a max over its workers' loads picks the plan, as on the host. Up to
// core::kScheduleGreedyMaxBatch requests a split plan's boundaries are then replaced by the
// greedy deal's (core/schedule_greedy.h), as on the host: candidate capacities in parallel, one
// a warp, the smallest that fits taken.
#include "cuda/common/decode_schedule.h"

#include <string>

#include "core/schedule.h"
#include "core/schedule_greedy.h"
#include "cuda/common/smem_opt_in.h"
#include "openmla/ops.h"

namespace openmla::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

// Exclusive prefix sum over the block; `total` gets the block's sum. Every thread must call it.
__device__ int64_t block_exclusive_scan(int64_t v, int64_t* warp_sums, int64_t* total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int64_t x = v;
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const int64_t y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  __syncthreads();  // warp_sums is free (the previous scan's readers are done)
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  int64_t offset = 0, sum = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const int64_t s = warp_sums[w];
    if (w < warp) offset += s;
    sum += s;
  }
  *total = sum;
  return offset + x - v;
}

// Max over the block; every thread must call it.
__device__ int64_t block_max(int64_t v, int64_t* warp_sums) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    const int64_t y = __shfl_xor_sync(0xffffffffu, v, o);
    v = y > v ? y : v;
  }
  __syncthreads();
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kWarps; ++w) v = warp_sums[w] > v ? warp_sums[w] : v;
  return v;
}

// Shared memory of the kernel: per boundary, the split plan's (end_request, end_block), the
// whole plan's end_request and its cost offset C_{end_request}.
size_t planner_smem_bytes(int parts) {
  return (3 * sizeof(int32_t) + sizeof(int64_t)) * static_cast<size_t>(parts);
}

__global__ void __launch_bounds__(kThreads) plan_decode_schedule_kernel(const DecodeSchedulePlan p) {
  extern __shared__ int64_t boundary[];  // planner_smem_bytes
  __shared__ int64_t warp_sums[kWarps];
  const int64_t batch = p.batch;
  const int64_t parts = p.num_sm_parts > 1 ? p.num_sm_parts : 1;
  const int64_t tokens_per_block = p.block_tokens > 1 ? p.block_tokens : 1;
  const int64_t overhead = p.split_overhead_blocks > 0 ? p.split_overhead_blocks : 0;
  auto seqlen = [&](int64_t i) -> int64_t {
    const int64_t len = p.seqlens[i * p.seqlens_stride];
    return len > 0 ? len : 0;
  };
  auto cost = [&](int64_t i) {
    return (seqlen(i) + tokens_per_block - 1) / tokens_per_block + overhead;
  };
  // C_i for the greedy deal (C_batch = total), up to core::kScheduleGreedyMaxBatch requests.
  __shared__ int64_t prefix[core::kScheduleGreedyMaxBatch + 1];
  int64_t* whole_start = boundary;  // C at the whole plan's boundary w
  int32_t* end_request = reinterpret_cast<int32_t*>(boundary + parts);
  int32_t* end_block = end_request + parts;
  int32_t* whole_request = end_block + parts;

  int64_t local = 0;
  for (int64_t i = threadIdx.x; i < batch; i += kThreads) local += cost(i);
  int64_t total = 0;
  block_exclusive_scan(local, warp_sums, &total);
  const int64_t share = (total + parts - 1) / parts;
  for (int64_t w = threadIdx.x; w < parts; w += kThreads) {
    end_request[w] = static_cast<int32_t>(batch);  // a boundary past every request
    end_block[w] = 0;
    whole_request[w] = static_cast<int32_t>(batch);
    whole_start[w] = total;
  }
  __syncthreads();

  // Boundaries x_w of workers w < parts - 1 (the last worker always ends past every request).
  int64_t carry = 0;
  for (int64_t base = 0; base < batch; base += kThreads) {
    const int64_t i = base + threadIdx.x;
    const int64_t c = i < batch ? cost(i) : 0;
    int64_t chunk = 0;
    const int64_t begin = carry + block_exclusive_scan(c, warp_sums, &chunk);  // C_i
    carry += chunk;
    if (i < batch && batch <= core::kScheduleGreedyMaxBatch) prefix[i] = begin;
    if (i < batch && c > 0 && share > 0) {
      const int64_t end = begin + c;  // C_{i+1}
      int64_t w_lo = (begin + share - 1) / share - 1;  // first w with x_w >= C_i
      int64_t w_hi = (end - 1) / share - 1;            // last w with x_w < C_{i+1}
      if (w_lo < 0) w_lo = 0;
      if (w_hi > parts - 2) w_hi = parts - 2;
      for (int64_t w = w_lo; w <= w_hi; ++w) {
        const int64_t into = (w + 1) * share - begin;
        end_request[w] = static_cast<int32_t>(i);
        end_block[w] = static_cast<int32_t>(into > overhead ? into - overhead : 0);
        const bool before = 2 * into < c;
        whole_request[w] = static_cast<int32_t>(before ? i : i + 1);
        whole_start[w] = before ? begin : end;
      }
    }
  }
  __syncthreads();

  // The whole plan's busiest worker decides between the plans.
  int64_t busiest = 0;
  for (int64_t w = threadIdx.x; w < parts; w += kThreads) {
    const int64_t load = whole_start[w] - (w > 0 ? whole_start[w - 1] : 0);
    busiest = load > busiest ? load : busiest;
  }
  busiest = block_max(busiest, warp_sums);
  const int64_t combine_blocks = p.combine_blocks > 0 ? p.combine_blocks : 0;

  // Up to kScheduleGreedyMaxBatch requests the split plan is the greedy deal at the smallest
  // capacity that fits (core/schedule_greedy.h). Candidates share .. share + overhead + 1 (the
  // deal fits at share + overhead) run at once, one a warp, each recording its boundaries in
  // shared memory when they all fit there (else the winner's deal runs again, recording).
  //
  // A warp walks the deal a worker at a time (not a request at a time, as the host does; the
  // same boundaries): on the line of C, a worker starting at x ends at the target
  // x + capacity (- overhead when x is inside a request: the continued piece pays it again).
  // Inside request r (C_r <= target < C_{r+1}), more than the overhead in: a split at block
  // target - C_r - overhead; else the worker stops before r (the host's "room <= overhead").
  // At or past C_batch: every request is dealt. The lanes find r 32 requests at a time.
  //
  // Whole requests when the busiest whole worker is within the combine price of the share
  // plan's bound (as on the host); only a split plan needs the deal.
  const bool whole = busiest <= share + overhead + combine_blocks;
  if (!whole && batch <= core::kScheduleGreedyMaxBatch) {
    constexpr int kRecordSlots = 2048;
    __shared__ int2 records[kRecordSlots];  // candidate t, worker w: (end request, end block)
    __shared__ int32_t recorded[kWarps];    // workers recorded by each warp's last candidate
    if (threadIdx.x == 0) prefix[batch] = total;
    __syncthreads();
    const int64_t candidates = overhead + 2;
    const bool inline_records = candidates <= kWarps && candidates * parts <= kRecordSlots;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    // One candidate's walk; record(w, request, block) for each worker until the requests run
    // out. Returns whether they ran out within the workers. Positions in T: int32 when the line
    // is short enough (every real batch), which halves the walk's dependent chain of 64-bit
    // adds and compares; C of the request found comes from the lane that read it (no second
    // shared-memory round trip a worker).
    const bool narrow = total + share + overhead + 2 < INT32_MAX;
    auto walk = [&](auto zero, int64_t capacity_in, auto&& record) {
      using T = decltype(zero);
      const T capacity = static_cast<T>(capacity_in), over = static_cast<T>(overhead),
              end = static_cast<T>(total);
      auto c_of = [&](int i) -> T {
        if constexpr (sizeof(T) == 4) {
          return reinterpret_cast<const int32_t*>(prefix)[2 * i];  // the low word (< 2^31)
        } else {
          return prefix[i];
        }
      };
      T x = 0;              // the next worker's start
      int r = 0;            // the request holding it
      bool inside = false;  // x is past the start of request r (a split)
      for (int64_t w = 0; w < parts; ++w) {
        const T target = x + capacity - (inside ? over : 0);
        if (target >= end) return true;
        // The last request r' >= r with C_r' <= target (C_r <= x <= target; inside implies
        // capacity > overhead, as only then does the deal split), 32 requests at a time.
        T c_r = 0, last = 0;  // C_r', and C of the last request of a full chunk
        for (;;) {
          const int i = r + lane;
          const T v = i < batch ? c_of(i) : end;  // end > target
          const int n = __popc(__ballot_sync(0xffffffffu, v <= target));
          if (n == 0) {  // only after a full chunk: its last request
            --r;
            c_r = last;
            break;
          }
          c_r = __shfl_sync(0xffffffffu, v, n - 1);
          r += n - 1;
          if (n < 32) break;
          last = c_r;
          ++r;
        }
        const T into = target - c_r;
        inside = into > over;
        x = inside ? target : c_r;
        record(w, r, static_cast<int64_t>(inside ? into - over : 0));
      }
      return false;
    };
    auto walk_any = [&](int64_t capacity, auto&& record) {
      return narrow ? walk(int32_t{0}, capacity, record) : walk(int64_t{0}, capacity, record);
    };
    int64_t best = -INT64_MAX;  // minus the smallest capacity that fits
    for (int64_t t = warp; t < candidates; t += kWarps) {
      int2* mine = records + t * parts;
      int32_t n = 0;
      const bool fits = walk_any(share + t, [&](int64_t w, int64_t r, int64_t k) {
        if (inline_records && lane == 0) {
          mine[w] = make_int2(static_cast<int32_t>(r), static_cast<int32_t>(k));
        }
        n = static_cast<int32_t>(w + 1);
      });
      if (inline_records && lane == 0) recorded[t] = n;
      if (fits && -(share + t) > best) best = -(share + t);
    }
    best = block_max(best, warp_sums);
    if (best != -INT64_MAX) {
      const int64_t t = -best - share;
      for (int64_t w = threadIdx.x; w < parts; w += kThreads) {
        const bool dealt = inline_records && w < recorded[t];
        end_request[w] = dealt ? records[t * parts + w].x : static_cast<int32_t>(batch);
        end_block[w] = dealt ? records[t * parts + w].y : 0;
      }
      __syncthreads();
      if (!inline_records && warp == 0) {
        walk_any(-best, [&](int64_t w, int64_t r, int64_t k) {
          if (lane == 0) {
            end_request[w] = static_cast<int32_t>(r);
            end_block[w] = static_cast<int32_t>(k);
          }
        });
      }
      __syncthreads();
    }
  }

  auto boundary_request = [&](int64_t w) -> int64_t {
    return whole ? whole_request[w] : end_request[w];
  };
  auto boundary_block = [&](int64_t w) -> int64_t { return whole ? 0 : end_block[w]; };

  // Worker w walks from boundary w - 1 to boundary w; its first split is the number of request
  // pieces of the workers before it.
  int64_t split_carry = 0;
  for (int64_t base = 0; base < parts; base += kThreads) {
    const int64_t w = base + threadIdx.x;
    int64_t begin_request = 0, begin_block = 0, end_req = batch, end_blk = 0, last = -1;
    int64_t pieces = 0;
    if (w < parts) {
      if (w > 0) {
        begin_request = boundary_request(w - 1);
        begin_block = boundary_block(w - 1);
      }
      end_req = boundary_request(w);
      end_blk = boundary_block(w);
      last = end_blk > 0 ? end_req : end_req - 1;
      pieces = last >= begin_request ? last - begin_request + 1 : 0;
    }
    int64_t chunk = 0;
    const int64_t split = split_carry + block_exclusive_scan(pieces, warp_sums, &chunk);
    split_carry += chunk;
    if (w < parts) {
      int32_t* m = p.metadata + w * p.metadata_stride_part;
      const int64_t f = p.metadata_stride_field;
      m[0] = static_cast<int32_t>(begin_request);
      m[f] = static_cast<int32_t>(begin_block * tokens_per_block);
      m[2 * f] = static_cast<int32_t>(last);
      m[3 * f] = static_cast<int32_t>(end_blk > 0 ? end_blk * tokens_per_block
                                                  : (last >= 0 ? seqlen(last) : 0));
      m[4 * f] = static_cast<int32_t>(split);
      m[5 * f] = m[6 * f] = m[7 * f] = 0;
      for (int64_t r = begin_request; r <= last; ++r) {
        if (r < last || end_blk == 0) {
          p.num_splits[(r + 1) * p.num_splits_stride] =
              static_cast<int32_t>(split + (r - begin_request) + 1);
        }
      }
    }
  }
  if (threadIdx.x == 0) p.num_splits[0] = 0;
}

}  // namespace

cudaError_t launch_plan_decode_schedule(const DecodeSchedulePlan& plan, cudaStream_t stream) {
  const int parts = plan.num_sm_parts > 1 ? plan.num_sm_parts : 1;
  if (parts > kMaxPlannerSmParts) return cudaErrorInvalidValue;
  const size_t smem_bytes = planner_smem_bytes(parts);
  // Above the default limit with thousands of workers.
  if (const cudaError_t err = allow_dynamic_smem(plan_decode_schedule_kernel, smem_bytes);
      err != cudaSuccess) {
    return err;
  }
  plan_decode_schedule_kernel<<<1, kThreads, smem_bytes, stream>>>(plan);
  return cudaGetLastError();
}

Status plan_decode_schedule_gpu(const DecodeScheduleArgs& args,
                                const core::DecodeScheduleShape& shape, cudaStream_t stream) {
  if (shape.num_sm_parts > kMaxPlannerSmParts) {
    return Status::NotImplemented("plan_decode_schedule: num_sm_parts " +
                                  std::to_string(shape.num_sm_parts) + " above the GPU planner's " +
                                  std::to_string(kMaxPlannerSmParts));
  }
  DecodeSchedulePlan plan;
  plan.seqlens = args.seqlens.data_as<const int32_t>();
  plan.seqlens_stride = args.seqlens.strides[0];
  plan.batch = static_cast<int>(shape.batch);
  plan.num_sm_parts = static_cast<int>(shape.num_sm_parts);
  plan.block_tokens = args.block_tokens;
  plan.split_overhead_blocks = core::kScheduleSplitOverheadBlocks;
  plan.combine_blocks = core::kScheduleCombineBlocks;
  plan.metadata = args.metadata.data_as<int32_t>();
  plan.metadata_stride_part = args.metadata.strides[0];
  plan.metadata_stride_field = args.metadata.strides[1];
  plan.num_splits = args.num_splits.data_as<int32_t>();
  plan.num_splits_stride = args.num_splits.strides[0];
  const cudaError_t err = launch_plan_decode_schedule(plan, stream);
  if (err != cudaSuccess) {
    return Status::CudaError(std::string("plan_decode_schedule: launch: ") + cudaGetErrorString(err));
  }
  return Status::Ok();
}

}  // namespace openmla::cuda
