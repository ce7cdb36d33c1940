// The public entry point of kv_cache_convert: validate through core, then the backend the caches
// live on.
#include "openmla/kv_convert.h"

#include <string>

#include "core/validate_convert.h"
#include "cpu/kv_cache_convert.h"
#ifdef OPENMLA_WITH_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace openmla {

Status kv_cache_convert(const KVCacheConvertArgs& args, [[maybe_unused]] Stream stream) {
  core::KVCacheConvertShape shape;
  OPENMLA_RETURN_IF_ERROR(core::validate_kv_cache_convert(args, &shape));
  if (shape.device.type == DeviceType::kCPU) return cpu::kv_cache_convert(args, shape);
#ifdef OPENMLA_WITH_CUDA
  return cuda::kv_cache_convert(args, shape, stream);
#else
  return Status::UnsupportedDevice("kv_cache_convert: the caches are on " +
                                   device_name(shape.device) +
                                   " but this build of OpenMLA has no CUDA backend (it was "
                                   "configured without a CUDA compiler)");
#endif
}

}  // namespace openmla
