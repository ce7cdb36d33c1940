// The CUDA backend's dispatch (cuda_backend.h): every operation checks that its device is an SM90
// GPU, makes that device current, and hands over to a kernel family's launcher; an operation
// with no kernel says so, naming what was asked and what the backend runs today. Never a
// silent fallback to the CPU and never fake output.
#include <cuda_runtime.h>

#include <atomic>
#include <string>

#include "core/str_cat.h"
#include "cuda/common/decode_schedule.h"
#include "cuda/common/kv_cache_kernels.h"
#include "cuda/common/merge_states.h"
#include "cuda/common/sm_parts.h"
#include "cuda/cuda_backend.h"
#include "cuda/sm90/dense_decode/launch.h"
#include "cuda/sm90/sparse_decode/launch.h"
#include "cuda/sm90/sparse_prefill/launch.h"

namespace openmla::cuda {
namespace {

// Every kernel is built for sm_90a, whose machine code runs on compute capability 9.0 only.
constexpr int kSupportedArch = 90;

// The operations the CUDA backend runs today; every NotImplemented message quotes this, so a
// kernel family adds its operation here when it wires its launcher below.
constexpr const char* kOpsWithKernels =
    "dense_decode (bf16/fp16, d_qk 576/512), sparse_decode (bf16, fp8_v32, fp8_model1, fp8_mx, "
    "fp4 caches, d_v 512), sparse_prefill (bf16 kv or any cache format, d_v 512), "
    "merge_attention_states, kv_cache_write, "
    "kv_cache_gather, kv_cache_convert, plan_decode_schedule";

Status cuda_error(const char* op, const char* call, cudaError_t err) {
  return Status::CudaError(std::string(op) + ": " + call + " failed: " + cudaGetErrorName(err) +
                           " (" + cudaGetErrorString(err) + ")");
}

// Compute capability and SM count per device, read once (a device's facts don't change, and
// this runs on every decode step).
struct DeviceFacts {
  int arch = 0;
  int num_sms = 0;
};
constexpr int kMaxCachedDevices = 64;
std::atomic<int> g_cached_arch[kMaxCachedDevices];  // 0: not read yet
std::atomic<int> g_cached_num_sms[kMaxCachedDevices];

Status device_facts(const char* op, int device_index, DeviceFacts* facts) {
  if (device_index >= 0 && device_index < kMaxCachedDevices) {
    facts->arch = g_cached_arch[device_index].load(std::memory_order_relaxed);
    facts->num_sms = g_cached_num_sms[device_index].load(std::memory_order_relaxed);
    if (facts->arch > 0 && facts->num_sms > 0) return Status::Ok();
  }
  int count = 0;
  if (cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    return cuda_error(op, "cudaGetDeviceCount", err);
  }
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
  if (err != cudaSuccess) return cuda_error(op, "cudaDeviceGetAttribute", err);
  facts->arch = major * 10 + minor;
  facts->num_sms = num_sms;
  if (device_index < kMaxCachedDevices) {
    g_cached_arch[device_index].store(facts->arch, std::memory_order_relaxed);
    g_cached_num_sms[device_index].store(facts->num_sms, std::memory_order_relaxed);
  }
  return Status::Ok();
}

// UnsupportedDevice unless `device` is an SM90 GPU; fills its arch for the messages.
Status require_sm90(const char* op, Device device, int* arch) {
  if (device.type != DeviceType::kCUDA) {
    return Status::Internal(std::string(op) + ": the CUDA backend was called with tensors on " +
                            device_name(device));
  }
  DeviceFacts facts;
  OPENMLA_RETURN_IF_ERROR(device_facts(op, device.index, &facts));
  if (facts.arch != kSupportedArch) {
    return Status::UnsupportedDevice(
        std::string(op) + ": " + device_name(device) + " is sm_" + std::to_string(facts.arch) +
        "; this build of OpenMLA has CUDA kernels for sm_90 (Hopper: H100, H200, H800, H20) only");
  }
  *arch = facts.arch;
  return Status::Ok();
}

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

// Checks that `device` is an SM90 GPU, makes it current for the call, then runs `launch`.
template <typename Launch>
Status on_sm90(const char* op, Device device, Launch&& launch) {
  int arch = 0;
  OPENMLA_RETURN_IF_ERROR(require_sm90(op, device, &arch));
  DeviceGuard guard;
  OPENMLA_RETURN_IF_ERROR(guard.enter(op, device.index));
  return launch();
}

}  // namespace

Status device_arch(int device_index, int* sm_arch) {
  DeviceFacts facts;
  OPENMLA_RETURN_IF_ERROR(device_facts("cuda_device_arch", device_index, &facts));
  *sm_arch = facts.arch;
  return Status::Ok();
}

// The schedule's worker count depends only on the SM count (sm_parts.h), so it needs no SM90.
Status decode_num_sm_parts(int device_index, int s_q, int h_q, int h_kv, int* num_sm_parts) {
  DeviceFacts facts;
  OPENMLA_RETURN_IF_ERROR(device_facts("decode_num_sm_parts", device_index, &facts));
  *num_sm_parts = decode_sm_parts_for(facts.num_sms, s_q, h_q, h_kv);
  return Status::Ok();
}

Status plan_decode_schedule(const DecodeScheduleArgs& args, const core::DecodeScheduleShape& shape,
                            Stream stream) {
  return on_sm90("plan_decode_schedule", shape.device,
                 [&] { return plan_decode_schedule_gpu(args, shape, static_cast<cudaStream_t>(stream)); });
}

// Sized by the dense decode family's launcher (schedule + split partials).
size_t dense_decode_workspace_size(int device_index, int batch, int s_q, int h_q, int h_kv,
                                   int d_v) {
  return sm90::dense_decode_workspace_size(device_index, batch, s_q, h_q, h_kv, d_v);
}

Status dense_decode(const DenseDecodeArgs& args, const core::DenseDecodeShape& shape,
                    Stream stream) {
  return on_sm90("dense_decode", shape.device,
                 [&] { return sm90::dense_decode(args, shape, static_cast<cudaStream_t>(stream)); });
}

size_t sparse_decode_workspace_size(int device_index, int batch, int s_q, int h_q, int d_v) {
  return sm90::sparse_decode_workspace_size(device_index, batch, s_q, h_q, d_v);
}

Status sparse_decode(const SparseDecodeArgs& args, const core::SparseDecodeShape& shape,
                     Stream stream) {
  return on_sm90("sparse_decode", shape.device, [&] {
    return sm90::sparse_decode(args, shape, static_cast<cudaStream_t>(stream));
  });
}

size_t sparse_prefill_workspace_size(int device_index, int s_q, int h_q, int d_v) {
  return sm90::sparse_prefill_workspace_size(device_index, s_q, h_q, d_v);
}

Status sparse_prefill(const SparsePrefillArgs& args, const core::SparsePrefillShape& shape,
                      Stream stream) {
  return on_sm90("sparse_prefill", shape.device, [&] {
    return sm90::sparse_prefill(args, shape, static_cast<cudaStream_t>(stream));
  });
}

Status merge_attention_states(const MergeStatesArgs& args, const core::MergeStatesShape& shape,
                              Stream stream) {
  constexpr const char* kOp = "merge_attention_states";
  int arch = 0;
  OPENMLA_RETURN_IF_ERROR(require_sm90(kOp, shape.device, &arch));
  DeviceGuard guard;
  OPENMLA_RETURN_IF_ERROR(guard.enter(kOp, shape.device.index));

  MergeStatesParams params;
  params.part_out = args.part_out.data;
  params.part_out_dtype = args.part_out.dtype;
  params.part_lse = args.part_lse.data_as<const float>();
  params.out = args.out.data;
  params.out_dtype = args.out.dtype;
  for (int d = 0; d < 3; ++d) {
    params.part_out_strides[d] = args.part_out.stride(d);
    params.part_lse_strides[d] = args.part_lse.stride(d);
  }
  for (int d = 0; d < 2; ++d) params.out_strides[d] = args.out.stride(d);
  if (args.lse.defined()) {
    params.lse = args.lse.data_as<float>();
    for (int d = 0; d < 2; ++d) params.lse_strides[d] = args.lse.stride(d);
  }
  params.num_parts = shape.num_parts;
  params.tokens = shape.tokens;
  params.heads = shape.heads;
  params.d_v = shape.d_v;
  if (cudaError_t err = launch_merge_states(params, static_cast<cudaStream_t>(stream));
      err != cudaSuccess) {
    return cuda_error(kOp, "merge_states_kernel launch", err);
  }
  return Status::Ok();
}

Status kv_cache_write(const KVCacheWriteArgs& args, const core::KVCacheWriteShape& shape,
                      Stream stream) {
  return on_sm90("kv_cache_write", shape.device,
                 [&] { return kv_cache_write_launch(args, shape, static_cast<cudaStream_t>(stream)); });
}

Status kv_cache_gather(const KVCacheGatherArgs& args, const core::KVCacheWriteShape& shape,
                       Stream stream) {
  return on_sm90("kv_cache_gather", shape.device,
                 [&] { return kv_cache_gather_launch(args, shape, static_cast<cudaStream_t>(stream)); });
}

}  // namespace openmla::cuda
