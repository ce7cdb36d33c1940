// Host launch helpers shared by the SM90 kernel families (launch.h).
#include "cuda/sm90/attention/launch.h"

#include <atomic>

#include "core/str_cat.h"

namespace openmla::cuda::sm90::attention {
namespace {

constexpr int kMaxCachedDevices = 64;
std::atomic<int> g_cached_arch[kMaxCachedDevices];  // 0: not read yet
std::atomic<int> g_cached_num_sms[kMaxCachedDevices];

}  // namespace

Status cuda_error(const char* op, const char* call, cudaError_t err) {
  if (err == cudaSuccess) return Status::Ok();
  return Status::CudaError(std::string(op) + ": " + call + " failed: " + cudaGetErrorName(err) +
                           " (" + cudaGetErrorString(err) + ")");
}

Status device_facts(const char* op, int device_index, DeviceFacts* facts) {
  if (device_index >= 0 && device_index < kMaxCachedDevices) {
    facts->arch = g_cached_arch[device_index].load(std::memory_order_relaxed);
    facts->num_sms = g_cached_num_sms[device_index].load(std::memory_order_relaxed);
    if (facts->arch > 0 && facts->num_sms > 0) return Status::Ok();
  }
  int count = 0;
  OPENMLA_RETURN_IF_ERROR(cuda_error(op, "cudaGetDeviceCount", cudaGetDeviceCount(&count)));
  if (device_index < 0 || device_index >= count) {
    return Status::InvalidArgument(
        std::string(op) + ": tensors are on cuda:" + std::to_string(device_index) +
        ", but this machine has " + std::to_string(count) + " CUDA device(s)");
  }
  int major = 0, minor = 0, num_sms = 0;
  cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_index);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_index);
  }
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device_index);
  }
  OPENMLA_RETURN_IF_ERROR(cuda_error(op, "cudaDeviceGetAttribute", err));
  facts->arch = major * 10 + minor;
  facts->num_sms = num_sms;
  if (device_index < kMaxCachedDevices) {
    g_cached_arch[device_index].store(facts->arch, std::memory_order_relaxed);
    g_cached_num_sms[device_index].store(facts->num_sms, std::memory_order_relaxed);
  }
  return Status::Ok();
}

Status require_sm90(const char* op, Device device, DeviceFacts* facts) {
  if (device.type != DeviceType::kCUDA) {
    return Status::Internal(std::string(op) + ": the CUDA backend was called with tensors on " +
                            device_name(device));
  }
  OPENMLA_RETURN_IF_ERROR(device_facts(op, device.index, facts));
  if (facts->arch != kSupportedArch) {
    return Status::UnsupportedDevice(
        std::string(op) + ": " + device_name(device) + " is sm_" + std::to_string(facts->arch) +
        "; this build of OpenMLA has CUDA kernels for sm_90 (Hopper: H100, H200, H800, H20) only");
  }
  return Status::Ok();
}

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult status;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &status) != cudaSuccess ||
        status != cudaDriverEntryPointSuccess) {
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

bool strides_aligned(const TensorView& t, int64_t multiple) {
  const size_t bytes = dtype_size_bytes(t.dtype) * multiple;
  if (reinterpret_cast<uintptr_t>(t.data) % bytes != 0) return false;
  for (int d = 0; d + 1 < t.rank; ++d) {
    if (t.shape[d] > 1 && t.strides[d] % multiple != 0) return false;
  }
  return true;
}

std::string strides_string(const TensorView& t) {
  std::string s = "[";
  for (int d = 0; d < t.rank; ++d) s += core::str_cat(d ? ", " : "", t.strides[d]);
  return s + "]";
}

}  // namespace openmla::cuda::sm90::attention
