// The public entry points: validate through core, pick the backend from where the tensors live,
// call it. The only place that knows both backends.
#include "openmla/ops.h"

#include <string>

#include "core/prefill_as_decode.h"
#include "core/validate.h"
#include "cpu/cpu_backend.h"
#ifdef OPENMLA_WITH_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace openmla {
namespace {

#ifndef OPENMLA_WITH_CUDA
Status no_cuda_backend(const char* op, Device device) {
  return Status::UnsupportedDevice(std::string(op) + ": the tensors are on " + device_name(device) +
                                   " but this build of OpenMLA has no CUDA backend (it was "
                                   "configured without a CUDA compiler)");
}
#endif

// Without the CUDA backend the cuda:: names don't exist; dispatch() never calls this branch then.
#ifdef OPENMLA_WITH_CUDA
#define OPENMLA_CUDA_CALL(expr) [&] { return (expr); }
#else
#define OPENMLA_CUDA_CALL(expr) [] { return Status::Internal("unreachable"); }
#endif

// Runs `cpu_call` or `cuda_call` by device; both are nullary lambdas returning Status.
template <typename CpuCall, typename CudaCall>
Status dispatch([[maybe_unused]] const char* op, Device device, CpuCall&& cpu_call, [[maybe_unused]] CudaCall&& cuda_call) {
  if (device.type == DeviceType::kCPU) return cpu_call();
#ifdef OPENMLA_WITH_CUDA
  return cuda_call();
#else
  return no_cuda_backend(op, device);
#endif
}

}  // namespace

Status decode_num_sm_parts(Device device, int s_q, int h_q, int h_kv, int* num_sm_parts) {
  if (num_sm_parts == nullptr) return Status::InvalidArgument("decode_num_sm_parts: num_sm_parts is null");
  if (s_q < 1 || h_q < 1 || h_kv < 1 || h_q % h_kv != 0) {
    return Status::InvalidArgument("decode_num_sm_parts: expected s_q >= 1, h_q >= 1, h_kv >= 1 "
                                   "dividing h_q; got s_q=" + std::to_string(s_q) +
                                   ", h_q=" + std::to_string(h_q) + ", h_kv=" + std::to_string(h_kv));
  }
  if (device.type == DeviceType::kCPU) {
    *num_sm_parts = cpu::num_threads();
    return Status::Ok();
  }
#ifdef OPENMLA_WITH_CUDA
  return cuda::decode_num_sm_parts(device.index, s_q, h_q, h_kv, num_sm_parts);
#else
  return no_cuda_backend("decode_num_sm_parts", device);
#endif
}

Status plan_decode_schedule(const DecodeScheduleArgs& args, [[maybe_unused]] Stream stream) {
  core::DecodeScheduleShape shape;
  OPENMLA_RETURN_IF_ERROR(core::validate_decode_schedule(args, &shape));
  return dispatch("plan_decode_schedule", shape.device,
                  [&] { return cpu::plan_decode_schedule(args, shape); },
                  OPENMLA_CUDA_CALL(cuda::plan_decode_schedule(args, shape, stream)));
}

size_t dense_decode_workspace_size(Device device, int batch, int s_q, int h_q, int h_kv, int d_v) {
  // Sizes no decode accepts need no workspace (dense_decode then names the bad argument).
  if (batch < 0 || s_q < 1 || h_q < 1 || h_kv < 1 || h_q % h_kv != 0 || d_v < 1) return 0;
#ifdef OPENMLA_WITH_CUDA
  if (device.type == DeviceType::kCUDA) {
    return cuda::dense_decode_workspace_size(device.index, batch, s_q, h_q, h_kv, d_v);
  }
#endif
  (void)device, (void)batch, (void)s_q, (void)h_q, (void)h_kv, (void)d_v;
  return 0;  // the CPU backend needs no workspace
}

Status dense_decode(const DenseDecodeArgs& args, [[maybe_unused]] Stream stream) {
  core::DenseDecodeShape shape;
  OPENMLA_RETURN_IF_ERROR(core::validate_dense_decode(args, &shape));
  return dispatch("dense_decode", shape.device, [&] { return cpu::dense_decode(args, shape); },
                  OPENMLA_CUDA_CALL(cuda::dense_decode(args, shape, stream)));
}

size_t sparse_decode_workspace_size(Device device, int batch, int s_q, int h_q, int d_v) {
  (void)device, (void)batch, (void)s_q, (void)h_q, (void)d_v;
#if defined(OPENMLA_WITH_CUDA)
  if (device.type == DeviceType::kCUDA) {
    return cuda::sparse_decode_workspace_size(device.index, batch, s_q, h_q, d_v);
  }
#endif
  return 0;  // the CPU backend needs none
}

Status sparse_decode(const SparseDecodeArgs& args, [[maybe_unused]] Stream stream) {
  core::SparseDecodeShape shape;
  OPENMLA_RETURN_IF_ERROR(core::validate_sparse_decode(args, &shape));
  return dispatch("sparse_decode", shape.device, [&] { return cpu::sparse_decode(args, shape); },
                  OPENMLA_CUDA_CALL(cuda::sparse_decode(args, shape, stream)));
}

size_t sparse_prefill_workspace_size(Device device, int s_q, int h_q, int d_v) {
  (void)device, (void)s_q, (void)h_q, (void)d_v;
#if defined(OPENMLA_WITH_CUDA)
  if (device.type == DeviceType::kCUDA) {
    return cuda::sparse_prefill_workspace_size(device.index, s_q, h_q, d_v);
  }
#endif
  return 0;  // the CPU backend needs none
}

size_t sparse_prefill_workspace_size(Device device, int s_q, int h_q, int d_v, int64_t topk,
                                     const KVCache& kv_cache) {
  (void)topk, (void)kv_cache;
#if defined(OPENMLA_WITH_CUDA)
  if (device.type == DeviceType::kCUDA) {
    return cuda::sparse_prefill_cache_workspace_size(device.index, s_q, h_q, d_v, topk, kv_cache);
  }
#endif
  return sparse_prefill_workspace_size(device, s_q, h_q, d_v);
}

Status sparse_prefill(const SparsePrefillArgs& args, [[maybe_unused]] Stream stream) {
  core::SparsePrefillShape shape;
  OPENMLA_RETURN_IF_ERROR(core::validate_sparse_prefill(args, &shape));
  if (args.kv_cache.defined()) {
    if (args.fp8_tensor_cores) {
      // The FP8 tensor-core path (opt-in; validated to come with kv_cache): its own roundings,
      // so its own CPU definition. The CUDA kernel checks its workspace (the size with topk and
      // kv_cache).
      return dispatch("sparse_prefill", shape.device,
                      [&] { return cpu::sparse_prefill_fp8(args, shape); },
                      OPENMLA_CUDA_CALL(cuda::sparse_prefill_fp8(args, shape, stream)));
    }
#if defined(OPENMLA_WITH_CUDA)
    // Each named slot dequantised once where the keys repeat across query tokens and the
    // workspace holds the rows (the workspace size overload with topk and kv_cache).
    if (shape.device.type == DeviceType::kCUDA && cuda::sparse_prefill_dequantizes_once(args, shape)) {
      return cuda::sparse_prefill_dequant_once(args, shape, stream);
    }
#endif
    return sparse_decode(core::sparse_prefill_as_decode(args), stream);
  }
  return dispatch("sparse_prefill", shape.device, [&] { return cpu::sparse_prefill(args, shape); },
                  OPENMLA_CUDA_CALL(cuda::sparse_prefill(args, shape, stream)));
}

Status merge_attention_states(const MergeStatesArgs& args, [[maybe_unused]] Stream stream) {
  core::MergeStatesShape shape;
  OPENMLA_RETURN_IF_ERROR(core::validate_merge_states(args, &shape));
  return dispatch("merge_attention_states", shape.device,
                  [&] { return cpu::merge_attention_states(args, shape); },
                  OPENMLA_CUDA_CALL(cuda::merge_attention_states(args, shape, stream)));
}

Status kv_cache_write(const KVCacheWriteArgs& args, [[maybe_unused]] Stream stream) {
  core::KVCacheWriteShape shape;
  OPENMLA_RETURN_IF_ERROR(core::validate_kv_cache_write(args, &shape));
  return dispatch("kv_cache_write", shape.device, [&] { return cpu::kv_cache_write(args, shape); },
                  OPENMLA_CUDA_CALL(cuda::kv_cache_write(args, shape, stream)));
}

Status kv_cache_gather(const KVCacheGatherArgs& args, [[maybe_unused]] Stream stream) {
  core::KVCacheWriteShape shape;
  OPENMLA_RETURN_IF_ERROR(core::validate_kv_cache_gather(args, &shape));
  return dispatch("kv_cache_gather", shape.device, [&] { return cpu::kv_cache_gather(args, shape); },
                  OPENMLA_CUDA_CALL(cuda::kv_cache_gather(args, shape, stream)));
}

bool cuda_backend_available() {
#ifdef OPENMLA_WITH_CUDA
  return true;
#else
  return false;
#endif
}

Status cuda_device_arch(int device_index, int* sm_arch) {
  if (sm_arch == nullptr) return Status::InvalidArgument("cuda_device_arch: sm_arch is null");
#ifdef OPENMLA_WITH_CUDA
  return cuda::device_arch(device_index, sm_arch);
#else
  (void)device_index;
  return no_cuda_backend("cuda_device_arch", Device::cuda(device_index));
#endif
}

}  // namespace openmla
