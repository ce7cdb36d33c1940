// Entry points of the fused norm-rope-attention-rope-cast operations: validate, then run the
// backend of the tensors' device (the CPU definition, or the SM90 sparse attention kernel with
// its fused steps).
#include "openmla/fused_attention.h"

#include <string>

#include "core/str_cat.h"
#include "core/validate_fused.h"
#include "cpu/fused_backend.h"
#ifdef OPENMLA_WITH_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace openmla {
namespace {

#ifndef OPENMLA_WITH_CUDA
Status no_cuda_backend(const char* op, Device device) {
  return Status::UnsupportedDevice(core::str_cat(
      op, ": the tensors are on ", device_name(device),
      " but this build of OpenMLA has no CUDA backend (it was configured without a CUDA "
      "compiler)"));
}
#endif

}  // namespace

size_t fused_norm_rope_attn_rope_cast_workspace_size([[maybe_unused]] Device device,
                                                     [[maybe_unused]] int64_t s_q,
                                                     [[maybe_unused]] int64_t h_q) {
#ifdef OPENMLA_WITH_CUDA
  if (device.type == DeviceType::kCUDA) return cuda::fused_workspace_size(device.index, s_q, h_q);
#endif
  return 0;  // the CPU backend needs none
}

Status fused_norm_rope_attn_rope_cast_prefill(const FusedPrefillArgs& args,
                                              [[maybe_unused]] Stream stream) {
  core::FusedShape shape;
  OPENMLA_RETURN_IF_ERROR(core::validate_fused_prefill(args, &shape));
  if (shape.device.type == DeviceType::kCPU) return cpu::fused_prefill(args, shape);
#ifdef OPENMLA_WITH_CUDA
  return cuda::fused_prefill(args, shape, stream);
#else
  return no_cuda_backend("fused_norm_rope_attn_rope_cast_prefill", shape.device);
#endif
}

Status fused_norm_rope_attn_rope_cast_decode(const FusedDecodeArgs& args,
                                             [[maybe_unused]] Stream stream) {
  core::FusedShape shape;
  OPENMLA_RETURN_IF_ERROR(core::validate_fused_decode(args, &shape));
  if (shape.device.type == DeviceType::kCPU) return cpu::fused_decode(args, shape);
#ifdef OPENMLA_WITH_CUDA
  return cuda::fused_decode(args, shape, stream);
#else
  return no_cuda_backend("fused_norm_rope_attn_rope_cast_decode", shape.device);
#endif
}

}  // namespace openmla
