// The CUDA backend's dense MHA prefill (cuda_backend.h): the device must be an SM90 GPU, made
// current for the call, then the forward kernel family's launcher (sm90/mha_prefill/). The
// backward runs its own SM90 launcher (src/api/mha_prefill.cc calls it directly).
#include <cuda_runtime.h>

#include "cuda/cuda_backend.h"
#include "cuda/sm90/attention/launch.h"
#include "cuda/sm90/mha_prefill/launch.h"

namespace openmla::cuda {

Status mha_prefill(const MhaPrefillArgs& args, const core::MhaPrefillShape& shape, Stream stream) {
  constexpr const char* kOp = "mha_prefill";
  sm90::attention::DeviceFacts facts;
  OPENMLA_RETURN_IF_ERROR(sm90::attention::require_sm90(kOp, shape.device, &facts));
  sm90::attention::DeviceGuard guard;
  OPENMLA_RETURN_IF_ERROR(guard.enter(kOp, shape.device.index));
  return sm90::mha_prefill_forward(args, shape, static_cast<cudaStream_t>(stream));
}

}  // namespace openmla::cuda
