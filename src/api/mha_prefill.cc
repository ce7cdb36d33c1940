// The public entry points of dense MHA prefill: validate through core, run the CPU backend on CPU
// tensors and the CUDA backend's SM90 forward kernel on CUDA tensors. The backward has no GPU
// kernel yet: CUDA tensors get NotImplemented there, never a silent CPU fallback.
#include <string>

#include "core/str_cat.h"
#include "core/validate_mha.h"
#include "cpu/mha_prefill.h"
#ifdef OPENMLA_WITH_CUDA
#include "cuda/cuda_backend.h"
#endif
#include "openmla/ops.h"

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
  if (shape.device.type == DeviceType::kCPU) return cpu::mha_prefill(args, shape);
#ifdef OPENMLA_WITH_CUDA
  return cuda::mha_prefill(args, shape, stream);
#else
  return Status::UnsupportedDevice(core::str_cat(
      "mha_prefill: the tensors are on ", device_name(shape.device),
      " but this build of OpenMLA has no CUDA backend (it was configured without a CUDA "
      "compiler)"));
#endif
}

Status mha_prefill_backward(const MhaPrefillBackwardArgs& args, [[maybe_unused]] Stream stream) {
  core::MhaPrefillShape shape;
  OPENMLA_RETURN_IF_ERROR(core::validate_mha_prefill_backward(args, &shape));
  if (shape.device.type != DeviceType::kCPU) {
    return no_gpu_kernel("mha_prefill_backward", shape.device);
  }
  return cpu::mha_prefill_backward(args, shape);
}

}  // namespace openmla
