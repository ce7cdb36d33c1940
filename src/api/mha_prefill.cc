// The public entry points of dense MHA prefill: validate through core, run the CPU backend on CPU
// tensors. No GPU kernel exists yet in any build: CUDA tensors get NotImplemented, never a silent
// CPU fallback.
#include <string>

#include "core/str_cat.h"
#include "core/validate_mha.h"
#include "cpu/mha_prefill.h"
#include "openmla/ops.h"
#ifdef OPENMLA_WITH_CUDA
#include "cuda/sm90/mha_prefill/backward/launch.h"
#endif

namespace openmla {
namespace {

Status no_gpu_kernel(const char* op, Device device) {
  return Status::NotImplemented(core::str_cat(
      op, ": the tensors are on ", device_name(device),
      " but the GPU kernel of dense MHA prefill is not built yet (the SM90 kernel has not "
      "landed); the CPU backend runs it on CPU tensors"));
}

}  // namespace

Status mha_prefill(const MhaPrefillArgs& args, [[maybe_unused]] Stream stream) {
  core::MhaPrefillShape shape;
  OPENMLA_RETURN_IF_ERROR(core::validate_mha_prefill(args, &shape));
  if (shape.device.type != DeviceType::kCPU) return no_gpu_kernel("mha_prefill", shape.device);
  return cpu::mha_prefill(args, shape);
}

size_t mha_prefill_backward_workspace_size([[maybe_unused]] Device device,
                                           [[maybe_unused]] int64_t total_q,
                                           [[maybe_unused]] int64_t total_kv,
                                           [[maybe_unused]] int64_t h_q,
                                           [[maybe_unused]] int64_t h_kv,
                                           [[maybe_unused]] int64_t d_qk,
                                           [[maybe_unused]] int64_t d_v) {
#ifdef OPENMLA_WITH_CUDA
  if (device.type == DeviceType::kCUDA) {
    return cuda::sm90::mha_prefill_backward_workspace_size(total_q, h_q, d_qk);
  }
#endif
  return 0;  // the CPU backend needs none
}

Status mha_prefill_backward(const MhaPrefillBackwardArgs& args, [[maybe_unused]] Stream stream) {
  core::MhaPrefillShape shape;
  OPENMLA_RETURN_IF_ERROR(core::validate_mha_prefill_backward(args, &shape));
  if (shape.device.type != DeviceType::kCPU) {
#ifdef OPENMLA_WITH_CUDA
    return cuda::sm90::mha_prefill_backward(args, shape, static_cast<cudaStream_t>(stream));
#else
    return no_gpu_kernel("mha_prefill_backward", shape.device);
#endif
  }
  return cpu::mha_prefill_backward(args, shape);
}

}  // namespace openmla
