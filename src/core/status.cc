#include "openmla/status.h"

namespace openmla {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kNotImplemented: return "not implemented";
    case StatusCode::kUnsupportedDevice: return "unsupported device";
    case StatusCode::kCudaError: return "CUDA error";
    case StatusCode::kInternal: return "internal error";
  }
  return "unknown";
}

}  // namespace openmla
