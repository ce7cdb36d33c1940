// Host launch helpers every SM90 kernel family shares (src/cuda/sm90/attention/): CUDA errors as a
// Status, the device's facts read once and the one sm_90 check, TMA descriptors (the driver's
// encoder, a 16-bit tensor's byte strides), the alignment checks a kernel's loads need, and the
// carving of a caller's workspace into aligned regions.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "openmla/status.h"
#include "openmla/tensor.h"

namespace openmla::cuda::sm90::attention {

// Ok for cudaSuccess, else CudaError "op: call failed: cudaErrorName (description)".
Status cuda_error(const char* op, const char* call, cudaError_t err);

// What the launchers need to know of a device, read once per device (it never changes, and a
// decode step runs every few microseconds).
struct DeviceFacts {
  int arch = 0;     // compute capability, major * 10 + minor
  int num_sms = 0;  // streaming multiprocessors
};
Status device_facts(const char* op, int device_index, DeviceFacts* facts);

// Every kernel is built for sm_90a, whose machine code runs on compute capability 9.0 only.
constexpr int kSupportedArch = 90;

// UnsupportedDevice unless `device` is an SM90 GPU (the one place this is checked); fills its
// facts for the caller's messages and launch geometry.
Status require_sm90(const char* op, Device device, DeviceFacts* facts);

// Makes the operation's device current for the call and restores the caller's one after, so a
// launch lands on the device the tensors live on.
class DeviceGuard {
 public:
  DeviceGuard() = default;
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  Status enter(const char* op, int device_index) {
    int current = 0;
    if (cudaError_t err = cudaGetDevice(&current); err != cudaSuccess) {
      return cuda_error(op, "cudaGetDevice", err);
    }
    if (current == device_index) return Status::Ok();
    if (cudaError_t err = cudaSetDevice(device_index); err != cudaSuccess) {
      return cuda_error(op, "cudaSetDevice", err);
    }
    previous_ = current;
    return Status::Ok();
  }

 private:
  int previous_ = -1;
};

// --- TMA descriptors ---------------------------------------------------------------------------

// The driver's cuTensorMapEncodeTiled through the runtime (no libcuda link needed), or null.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder();

// The map element type of a 16-bit tensor (bf16 or fp16).
inline CUtensorMapDataType tensor_map_dtype(DType dtype) {
  return dtype == DType::kBF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
}

// Byte strides of a 16-bit tensor's dims 1..N-1 from the caller's element strides. A dim of size
// 1 is never stepped: it gets the dense stride, whatever the caller's (which TMA may refuse).
template <int N>
void tensor_map_strides(const cuuint64_t (&dims)[N], const int64_t (&given)[N - 1],
                        cuuint64_t (&strides)[N - 1]) {
  uint64_t dense = dims[0] * 2;
  for (int d = 0; d < N - 1; ++d) {
    strides[d] = dims[d + 1] > 1 ? static_cast<cuuint64_t>(given[d]) * 2 : dense;
    dense = strides[d] * dims[d + 1];
  }
}

// --- alignment ---------------------------------------------------------------------------------

// Strides (elements) of every dim of size > 1 except the last are multiples of `multiple`, and
// the base address is aligned to `multiple` elements.
bool strides_aligned(const TensorView& t, int64_t multiple);

// "[s0, s1, ...]", for the messages of the checks above.
std::string strides_string(const TensorView& t);

// --- workspace ---------------------------------------------------------------------------------

// Every region of a workspace starts on 256 bytes (a TMA map's base needs 16, vector loads 16).
constexpr size_t kWorkspaceAlign = 256;
constexpr size_t workspace_align_up(size_t bytes) {
  return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
}

// Lays regions out one after another: take(bytes) returns a region's offset, and `total` is the
// workspace's size so far (aligned).
struct WorkspaceCarver {
  size_t total = 0;
  size_t take(size_t bytes) {
    const size_t offset = total;
    total = workspace_align_up(total + bytes);
    return offset;
  }
};

}  // namespace openmla::cuda::sm90::attention
