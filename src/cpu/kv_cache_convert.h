// kv_cache_convert on the CPU: every token decoded and re-encoded by the host codec.
#pragma once

#include "core/validate_convert.h"
#include "openmla/kv_convert.h"

namespace openmla::cpu {

// Arguments arrive validated (core::validate_kv_cache_convert).
Status kv_cache_convert(const KVCacheConvertArgs& args, const core::KVCacheConvertShape& shape);

}  // namespace openmla::cpu
