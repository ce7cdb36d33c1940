// Host side of SM90 dense MHA prefill backward (launch.h, NOTES.md): checks what the kernels need
// beyond core's validation (16-byte aligned rows for cp.async, the workspace, grid limits), fills
// the parameter block and runs: memset of the dQ accumulator, preprocess (D), main, postprocess.
#include "cuda/sm90/mha_prefill/backward/launch.h"

#include <cmath>
#include <cstdint>

#include <cute/numeric/numeric_types.hpp>

#include "core/str_cat.h"
#include "cuda/sm90/attention/launch.h"

namespace openmla::cuda::sm90 {
namespace {

constexpr const char* kOp = "mha_prefill_backward";

using attention::cuda_error;
using attention::strides_aligned;
using attention::strides_string;

template <typename... Parts>
Status invalid(Parts&&... parts) {
  return Status::InvalidArgument(core::str_cat(kOp, ": ", parts...));
}

struct WorkspaceLayout {
  size_t dq_accum = 0, delta = 0, total = 0;
};
WorkspaceLayout workspace_layout(int64_t total_q, int64_t h_q, int64_t d_qk) {
  attention::WorkspaceCarver carver;
  WorkspaceLayout l;
  l.dq_accum = carver.take(static_cast<size_t>(total_q * h_q * d_qk) * sizeof(float));
  l.delta = carver.take(static_cast<size_t>(total_q * h_q) * sizeof(float));
  l.total = carver.total;
  return l;
}

template <class Element>
cudaError_t launch_all(const mha_bwd::MhaBwdParams& p, int d_qk, size_t accum_bytes, cudaStream_t stream) {
  const bool any_query = p.total_q > 0 && p.h_q > 0;
  if (any_query) {
    if (cudaError_t err = cudaMemsetAsync(p.dq_accum, 0, accum_bytes, stream); err != cudaSuccess) {
      return err;
    }
    if (cudaError_t err = mha_bwd::launch_preprocess<Element>(p, stream); err != cudaSuccess) {
      return err;
    }
  }
  if (p.batch > 0 && p.max_seqlen_kv > 0 && p.h_kv > 0) {
    const cudaError_t err = d_qk == 128 ? mha_bwd::launch_main<Element, 128>(p, stream)
                                        : mha_bwd::launch_main<Element, 192>(p, stream);
    if (err != cudaSuccess) return err;
  }
  if (any_query) return mha_bwd::launch_postprocess<Element>(p, d_qk, stream);
  return cudaSuccess;
}

}  // namespace

size_t mha_prefill_backward_workspace_size(int64_t total_q, int64_t h_q, int64_t d_qk) {
  if (total_q <= 0 || h_q <= 0 || d_qk <= 0) return 0;
  return workspace_layout(total_q, h_q, d_qk).total;
}

Status mha_prefill_backward(const MhaPrefillBackwardArgs& args,
                            const core::MhaPrefillShape& shape, cudaStream_t stream) {
  // The arguments first (no device query: a bad call is refused the same on any machine).
  if (shape.d_v != 128 || (shape.d_qk != 128 && shape.d_qk != 192)) {
    return Status::NotImplemented(core::str_cat(kOp, ": d_qk ", shape.d_qk, ", d_v ", shape.d_v,
                                                " has no CUDA kernel (d_qk 128 or 192, d_v 128)"));
  }
  // The main kernel reads q, k, v and dout rows with 16-byte cp.async.
  const struct {
    const TensorView* t;
    const char* name;
  } rows[] = {{&args.q, "q"}, {&args.k, "k"}, {&args.v, "v"}, {&args.dout, "dout"}};
  for (const auto& r : rows) {
    if (!strides_aligned(*r.t, 8)) {
      return invalid(r.name, ": strides must be multiples of 8 elements and the data 16-byte "
                     "aligned for the CUDA kernel; got strides ", strides_string(*r.t));
    }
  }
  if (shape.batch > 65535) return invalid("cu_seqlens_q: batch ", shape.batch, " above 65535");
  if (shape.h_kv > 65535) return invalid("k: h_kv ", shape.h_kv, " above 65535");
  if (shape.max_seqlen_q > INT32_MAX || shape.max_seqlen_kv > INT32_MAX) {
    return invalid("max_seqlen_q, max_seqlen_kv: above 2^31 - 1");
  }
  const WorkspaceLayout l = workspace_layout(shape.total_q, shape.h_q, shape.d_qk);
  const size_t needed = mha_prefill_backward_workspace_size(shape.total_q, shape.h_q, shape.d_qk);
  if (needed > 0 && (args.workspace.data == nullptr || args.workspace.bytes < needed)) {
    return invalid("workspace: ", args.workspace.bytes, " bytes at ", args.workspace.data,
                   "; this call needs ", needed,
                   " (mha_prefill_backward_workspace_size(device, total_q, total_kv, h_q, h_kv, "
                   "d_qk, d_v))");
  }
  if (needed > 0 && reinterpret_cast<uintptr_t>(args.workspace.data) % 16 != 0) {
    return invalid("workspace: its data must be 16-byte aligned; got ", args.workspace.data);
  }

  attention::DeviceFacts facts;
  OPENMLA_RETURN_IF_ERROR(attention::require_sm90(kOp, shape.device, &facts));
  attention::DeviceGuard guard;
  OPENMLA_RETURN_IF_ERROR(guard.enter(kOp, shape.device.index));

  mha_bwd::MhaBwdParams p = {};
  p.q = args.q.data;
  p.k = args.k.data;
  p.v = args.v.data;
  p.dout = args.dout.data;
  p.out = args.out.data;
  p.q_stride_t = args.q.strides[0];
  p.q_stride_h = args.q.strides[1];
  p.k_stride_t = args.k.strides[0];
  p.k_stride_h = args.k.strides[1];
  p.v_stride_t = args.v.strides[0];
  p.v_stride_h = args.v.strides[1];
  p.do_stride_t = args.dout.strides[0];
  p.do_stride_h = args.dout.strides[1];
  p.o_stride_t = args.out.strides[0];
  p.o_stride_h = args.out.strides[1];
  p.lse = args.lse.data_as<float>();
  p.lse_stride_t = args.lse.strides[0];
  p.lse_stride_h = args.lse.strides[1];
  p.cu_seqlens_q = args.cu_seqlens_q.data_as<int>();
  p.cu_seqlens_kv = args.cu_seqlens_kv.data_as<int>();
  p.dq = args.dq.data;
  p.dk = args.dk.data;
  p.dv = args.dv.data;
  p.dq_stride_t = args.dq.strides[0];
  p.dq_stride_h = args.dq.strides[1];
  p.dk_stride_t = args.dk.strides[0];
  p.dk_stride_h = args.dk.strides[1];
  p.dv_stride_t = args.dv.strides[0];
  p.dv_stride_h = args.dv.strides[1];
  p.dq_f32 = args.dq.dtype == DType::kFP32;
  p.dk_f32 = args.dk.dtype == DType::kFP32;
  p.dv_f32 = args.dv.dtype == DType::kFP32;
  char* ws = static_cast<char*>(args.workspace.data);
  p.dq_accum = needed > 0 ? reinterpret_cast<float*>(ws + l.dq_accum) : nullptr;
  p.delta = needed > 0 ? reinterpret_cast<float*>(ws + l.delta) : nullptr;
  p.total_q = shape.total_q;
  p.batch = static_cast<int>(shape.batch);
  p.h_q = static_cast<int>(shape.h_q);
  p.h_kv = static_cast<int>(shape.h_kv);
  p.group = static_cast<int>(shape.h_q / shape.h_kv);
  p.max_seqlen_q = static_cast<int>(shape.max_seqlen_q);
  p.max_seqlen_kv = static_cast<int>(shape.max_seqlen_kv);
  p.causal = args.causal;
  p.scale = shape.softmax_scale;
  p.scale_log2 = shape.softmax_scale * static_cast<float>(M_LOG2E);

  const size_t accum_bytes = static_cast<size_t>(shape.total_q * shape.h_q * shape.d_qk) * 4;
  const int d_qk = static_cast<int>(shape.d_qk);
  const cudaError_t err = args.q.dtype == DType::kBF16
                              ? launch_all<cute::bfloat16_t>(p, d_qk, accum_bytes, stream)
                              : launch_all<cute::half_t>(p, d_qk, accum_bytes, stream);
  return cuda_error(kOp, "kernel launch", err);
}

}  // namespace openmla::cuda::sm90
