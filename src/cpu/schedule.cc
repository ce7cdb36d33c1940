// The CPU side of the split-KV schedule: the host planner on host tensors, and the thread count
// that stands in for the number of SMs.
#include "core/schedule.h"

#include <omp.h>

#include <vector>

#include "cpu/cpu_backend.h"

namespace openmla::cpu {

int num_threads() { return omp_get_max_threads(); }

Status plan_decode_schedule(const DecodeScheduleArgs& args,
                            const core::DecodeScheduleShape& shape) {
  // The validator requires contiguous outputs; seqlens may be a strided view.
  const int batch = static_cast<int>(shape.batch);
  std::vector<int32_t> seqlens(batch);
  for (int i = 0; i < batch; ++i) {
    seqlens[i] = args.seqlens.data_as<const int32_t>()[i * args.seqlens.strides[0]];
  }
  core::plan_decode_schedule_host(seqlens.data(), batch, static_cast<int>(shape.num_sm_parts),
                                  args.block_tokens, core::kScheduleSplitOverheadBlocks,
                                  core::kScheduleCombineBlocks,
                                  args.metadata.data_as<int32_t>(),
                                  args.num_splits.data_as<int32_t>());
  return Status::Ok();
}

}  // namespace openmla::cpu
