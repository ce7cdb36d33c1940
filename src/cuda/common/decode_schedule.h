// The split-KV schedule planned on the GPU: one small kernel that reproduces
// core::plan_decode_schedule_host (src/core/schedule.h) bit for bit, from device-resident
// per-request key counts, so planning is graph-capturable and needs no host round trip.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/validate.h"
#include "openmla/ops.h"

namespace openmla::cuda {

struct DecodeSchedulePlan {
  const int32_t* seqlens = nullptr;  // [batch]
  int64_t seqlens_stride = 1;
  int batch = 0;
  int num_sm_parts = 1;
  int block_tokens = 64;
  int split_overhead_blocks = 0;
  int combine_blocks = 0;  // core::kScheduleCombineBlocks: when whole requests beat splitting
  int32_t* metadata = nullptr;  // [num_sm_parts, kScheduleMetadataInts]
  int64_t metadata_stride_part = 0, metadata_stride_field = 1;
  int32_t* num_splits = nullptr;  // [batch + 1]
  int64_t num_splits_stride = 1;
};

// The largest num_sm_parts the planner kernel takes (its per-worker state lives in shared memory).
constexpr int kMaxPlannerSmParts = 4096;

// One launch of one block on `stream`. Returns the launch's error.
cudaError_t launch_plan_decode_schedule(const DecodeSchedulePlan& plan, cudaStream_t stream);

// The public plan_decode_schedule on device tensors (validated): the host planner's
// split overhead and combine price (core::kScheduleSplitOverheadBlocks, kScheduleCombineBlocks),
// args.block_tokens.
Status plan_decode_schedule_gpu(const DecodeScheduleArgs& args,
                                const core::DecodeScheduleShape& shape, cudaStream_t stream);

}  // namespace openmla::cuda
