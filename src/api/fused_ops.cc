// Entry points of the fused norm-rope-attention-rope-cast operations: validate, then run the
// backend of the tensors' device. The Hopper kernel is not built yet: CUDA tensors get
// NotImplemented after validation.
#include "openmla/fused_attention.h"

#include <string>

#include "core/str_cat.h"
#include "core/validate_fused.h"
#include "cpu/fused_backend.h"

namespace openmla {
namespace {

Status no_kernel(const char* op, Device device) {
  return Status::NotImplemented(core::str_cat(
      op, ": the tensors are on ", device_name(device),
      " but the fused Hopper (SM90) kernel is not built yet; the CPU backend runs this operation "
      "(docs/semantics.md, fused norm-rope-attention-rope-cast)"));
}

}  // namespace

Status fused_norm_rope_attn_rope_cast_prefill(const FusedPrefillArgs& args,
                                              [[maybe_unused]] Stream stream) {
  core::FusedShape shape;
  OPENMLA_RETURN_IF_ERROR(core::validate_fused_prefill(args, &shape));
  if (shape.device.type != DeviceType::kCPU) {
    return no_kernel("fused_norm_rope_attn_rope_cast_prefill", shape.device);
  }
  return cpu::fused_prefill(args, shape);
}

Status fused_norm_rope_attn_rope_cast_decode(const FusedDecodeArgs& args,
                                             [[maybe_unused]] Stream stream) {
  core::FusedShape shape;
  OPENMLA_RETURN_IF_ERROR(core::validate_fused_decode(args, &shape));
  if (shape.device.type != DeviceType::kCPU) {
    return no_kernel("fused_norm_rope_attn_rope_cast_decode", shape.device);
  }
  return cpu::fused_decode(args, shape);
}

}  // namespace openmla
