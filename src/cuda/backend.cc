// The CUDA backend's dispatch (cuda_backend.h): every operation checks that its device is an SM90
// GPU, makes that device current, and hands over to a kernel family's launcher; an operation
// with no kernel says so, naming what was asked and what the backend runs today. Never a
// silent fallback to the CPU and never fake output.
#include <cuda_runtime.h>

#include <string>

#include "core/str_cat.h"
#include "cuda/common/decode_schedule.h"
#include "cuda/common/kv_cache_kernels.h"
#include "cuda/common/merge_states.h"
#include "cuda/common/sm_parts.h"
#include "cuda/cuda_backend.h"
#include "cuda/sm90/attention/launch.h"
#include "cuda/sm90/attention/supported.h"
#include "cuda/sm90/dense_decode/launch.h"
#include "cuda/sm90/dense_decode_kv_cache/launch.h"
#include "cuda/sm90/fused_attention/launch.h"
#include "cuda/sm90/sparse_decode/launch.h"
#include "cuda/sm90/sparse_prefill/launch.h"

namespace openmla::cuda {
namespace {

using sm90::attention::cuda_error;
using sm90::attention::DeviceFacts;
using sm90::attention::DeviceGuard;

// UnsupportedDevice unless `device` is an SM90 GPU (sm90/attention/launch.h); fills its arch for
// the messages.
Status require_sm90(const char* op, Device device, int* arch) {
  DeviceFacts facts;
  OPENMLA_RETURN_IF_ERROR(sm90::attention::require_sm90(op, device, &facts));
  *arch = facts.arch;
  return Status::Ok();
}

// What was asked, on which arch, and every operation the backend runs (sm90/attention/supported.h).
Status not_implemented(const char* op, const std::string& asked, int arch) {
  return Status::NotImplemented(
      std::string(op) + ": no CUDA kernel for this device yet (asked: " + asked + " on sm_" +
      std::to_string(arch) + "); today the CUDA backend runs: " + sm90::attention::supported_ops());
}

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
  OPENMLA_RETURN_IF_ERROR(sm90::attention::device_facts("cuda_device_arch", device_index, &facts));
  *sm_arch = facts.arch;
  return Status::Ok();
}

// The schedule's worker count depends only on the SM count (sm_parts.h), so it needs no SM90.
Status decode_num_sm_parts(int device_index, int s_q, int h_q, int h_kv, int* num_sm_parts) {
  DeviceFacts facts;
  OPENMLA_RETURN_IF_ERROR(sm90::attention::device_facts("decode_num_sm_parts", device_index, &facts));
  *num_sm_parts = decode_sm_parts_for(facts.num_sms, s_q, h_q, h_kv);
  return Status::Ok();
}

Status plan_decode_schedule(const DecodeScheduleArgs& args, const core::DecodeScheduleShape& shape,
                            Stream stream) {
  return on_sm90("plan_decode_schedule", shape.device,
                 [&] { return plan_decode_schedule_gpu(args, shape, static_cast<cudaStream_t>(stream)); });
}

// Sized by the dense decode family's launcher (schedule + split partials), or by the KVCache
// path's where that needs more (the caller's workspace serves either: the format is not an
// argument here).
size_t dense_decode_workspace_size(int device_index, int batch, int s_q, int h_q, int h_kv,
                                   int d_v) {
  const size_t views = sm90::dense_decode_workspace_size(device_index, batch, s_q, h_q, h_kv, d_v);
  if (h_kv != 1 || d_v != 512) return views;  // the KVCache path: one kv head, d_v 512
  const size_t cache = sm90::dense_decode_kv_cache_workspace_size(device_index, batch, s_q, h_q);
  return views > cache ? views : cache;
}

Status dense_decode(const DenseDecodeArgs& args, const core::DenseDecodeShape& shape,
                    Stream stream) {
  constexpr const char* kOp = "dense_decode";
  if (args.kv_cache.defined()) {  // a KVCache of any format: the sparse kernel's dense mode
    return on_sm90(kOp, shape.device, [&] {
      return sm90::dense_decode_kv_cache(args, shape, static_cast<cudaStream_t>(stream));
    });
  }
  if (!sm90::attention::supports(kOp, args.q.dtype, static_cast<int>(shape.d_qk))) {
    int arch = 0;
    OPENMLA_RETURN_IF_ERROR(require_sm90(kOp, shape.device, &arch));
    return not_implemented(kOp, core::str_cat("q ", dtype_name(args.q.dtype), ", d_qk ", shape.d_qk),
                           arch);
  }
  return on_sm90(kOp, shape.device,
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

size_t fused_workspace_size(int device_index, int64_t s_q, int64_t h_q) {
  return sm90::fused_workspace_size(device_index, s_q, h_q);
}

Status fused_prefill(const FusedPrefillArgs& args, const core::FusedShape& shape, Stream stream) {
  return on_sm90("fused_norm_rope_attn_rope_cast_prefill", shape.device, [&] {
    return sm90::fused_prefill(args, shape, static_cast<cudaStream_t>(stream));
  });
}

Status fused_decode(const FusedDecodeArgs& args, const core::FusedShape& shape, Stream stream) {
  return on_sm90("fused_norm_rope_attn_rope_cast_decode", shape.device, [&] {
    return sm90::fused_decode(args, shape, static_cast<cudaStream_t>(stream));
  });
}

size_t sparse_prefill_cache_workspace_size(int device_index, int s_q, int h_q, int d_v,
                                           int64_t topk, const KVCache& kv_cache) {
  return sm90::sparse_prefill_cache_workspace_size(device_index, s_q, h_q, d_v, topk, kv_cache);
}

bool sparse_prefill_dequantizes_once(const SparsePrefillArgs& args,
                                     const core::SparsePrefillShape& shape) {
  return sm90::sparse_prefill_dequantizes_once(args, shape);
}

Status sparse_prefill_dequant_once(const SparsePrefillArgs& args,
                                   const core::SparsePrefillShape& shape, Stream stream) {
  return on_sm90("sparse_prefill", shape.device, [&] {
    return sm90::sparse_prefill_dequant_once(args, shape, static_cast<cudaStream_t>(stream));
  });
}

Status sparse_prefill_fp8(const SparsePrefillArgs& args, const core::SparsePrefillShape& shape,
                          Stream stream) {
  return on_sm90("sparse_prefill", shape.device, [&] {
    return sm90::sparse_prefill_fp8(args, shape, static_cast<cudaStream_t>(stream));
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

Status kv_cache_convert(const KVCacheConvertArgs& args, const core::KVCacheConvertShape& shape,
                        Stream stream) {
  return on_sm90("kv_cache_convert", shape.device,
                 [&] { return kv_cache_convert_launch(args, shape, static_cast<cudaStream_t>(stream)); });
}

}  // namespace openmla::cuda
