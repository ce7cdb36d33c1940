// The public entry points of dense MHA prefill: validate through core, run the CPU backend on CPU
// tensors and the SM90 kernels on CUDA tensors (forward and backward), never a silent CPU
// fallback; a build without the CUDA backend refuses CUDA tensors (UnsupportedDevice).
#include <string>

#include "core/str_cat.h"
#include "core/validate_mha.h"
#include "cpu/mha_prefill.h"
#ifdef OPENMLA_WITH_CUDA
#include "cuda/cuda_backend.h"
#endif
#include "openmla/ops.h"
#ifdef OPENMLA_WITH_CUDA
#include "cuda/sm90/mha_prefill/backward/launch.h"
#endif

namespace openmla {
namespace {

[[maybe_unused]] Status no_cuda_backend(const char* op, Device device) {
  return Status::UnsupportedDevice(core::str_cat(
      op, ": the tensors are on ", device_name(device),
      " but this build of OpenMLA has no CUDA backend (it was configured without a CUDA "
      "compiler)"));
}

}  // namespace

Status mha_prefill(const MhaPrefillArgs& args, [[maybe_unused]] Stream stream) {
  core::MhaPrefillShape shape;
  OPENMLA_RETURN_IF_ERROR(core::validate_mha_prefill(args, &shape));
  if (shape.device.type == DeviceType::kCPU) return cpu::mha_prefill(args, shape);
#ifdef OPENMLA_WITH_CUDA
  return cuda::mha_prefill(args, shape, stream);
#else
  return no_cuda_backend("mha_prefill", shape.device);
#endif
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
    return no_cuda_backend("mha_prefill_backward", shape.device);
#endif
  }
  return cpu::mha_prefill_backward(args, shape);
}

}  // namespace openmla
