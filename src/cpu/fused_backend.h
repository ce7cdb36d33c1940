// The CPU backend of the fused norm-rope-attention-rope-cast operations (fused_attention.cc).
// Arguments arrive validated (src/core/validate_fused.h).
#pragma once

#include "core/validate_fused.h"
#include "openmla/fused_attention.h"

namespace openmla::cpu {

Status fused_prefill(const FusedPrefillArgs& args, const core::FusedShape& shape);
Status fused_decode(const FusedDecodeArgs& args, const core::FusedShape& shape);

}  // namespace openmla::cpu
