// Host side of SM90 sparse decode (launch.h): validated arguments into the sparse attention
// kernel's parameters.
#include "cuda/sm90/sparse_decode/launch.h"

#include <cstdint>

#include "core/str_cat.h"
#include "cuda/sm90/attention/launch.h"
#include "cuda/sm90/sparse_attention/params.h"

namespace openmla::cuda::sm90 {
namespace {

constexpr const char* kOp = "sparse_decode";
constexpr int kKeysPerTile = 64;

}  // namespace

size_t sparse_decode_workspace_size(int device_index, int batch, int s_q, int h_q, int d_v) {
  if (batch <= 0 || s_q <= 0 || h_q <= 0 || d_v <= 0) return 0;
  const int64_t tokens = static_cast<int64_t>(batch) * s_q;
  return sparse_workspace_bytes(device_index, tokens, tokens * ((h_q + 63) / 64), h_q);
}

Status sparse_decode(const SparseDecodeArgs& args, const core::SparseDecodeShape& shape,
                     cudaStream_t stream, const SparseTuning& tuning) {
  if (shape.d_v != 512) {
    return Status::NotImplemented(
        core::str_cat(kOp, ": d_v ", shape.d_v, " has no CUDA kernel (d_v 512 only)"));
  }
  if (shape.topk > (1 << 24) || shape.extra_topk > (1 << 24)) {
    return Status::InvalidArgument(core::str_cat(kOp, ": indices: topk ", shape.topk,
                                                 " / extra_topk ", shape.extra_topk,
                                                 " above the kernel's 2^24"));
  }
  OPENMLA_RETURN_IF_ERROR(check_q_out(kOp, args.q, args.out));
  SparseAttentionParams p = {};
  set_q_out_lse(args.q, args.out, args.lse, &p);
  if (args.max_logits.defined()) {
    p.max_logits = args.max_logits.data_as<float>();
    p.max_logits_stride_b = args.max_logits.strides[0];
    p.max_logits_stride_h = args.max_logits.strides[1];
    p.max_logits_stride_s = args.max_logits.strides[2];
  }
  OPENMLA_RETURN_IF_ERROR(sparse_cache_params(kOp, args.k_cache, "k_cache", &p.cache[0]));
  p.indices[0] = args.indices.data_as<const int32_t>();
  p.indices_stride_b[0] = args.indices.strides[0];
  p.indices_stride_s[0] = args.indices.strides[1];
  p.indices_stride_k[0] = args.indices.strides[2];
  p.lengths[0] = args.topk_length.defined() ? args.topk_length.data_as<const int32_t>() : nullptr;
  p.lengths_stride[0] = args.topk_length.defined() ? args.topk_length.strides[0] : 0;
  p.topk[0] = static_cast<int>(shape.topk);
  p.cache[1] = p.cache[0];
  p.indices[1] = p.indices[0];
  if (args.extra_k_cache.defined()) {
    OPENMLA_RETURN_IF_ERROR(
        sparse_cache_params(kOp, args.extra_k_cache, "extra_k_cache", &p.cache[1]));
    p.indices[1] = args.extra_indices.data_as<const int32_t>();
    p.indices_stride_b[1] = args.extra_indices.strides[0];
    p.indices_stride_s[1] = args.extra_indices.strides[1];
    p.indices_stride_k[1] = args.extra_indices.strides[2];
    p.lengths[1] = args.extra_topk_length.defined()
                       ? args.extra_topk_length.data_as<const int32_t>()
                       : nullptr;
    p.lengths_stride[1] = args.extra_topk_length.defined() ? args.extra_topk_length.strides[0] : 0;
    p.topk[1] = static_cast<int>(shape.extra_topk);
  }
  p.sink = args.attn_sink.defined() ? args.attn_sink.data_as<const float>() : nullptr;
  p.sink_stride = args.attn_sink.defined() ? args.attn_sink.strides[0] : 0;

  p.batch = static_cast<int>(shape.batch);
  p.s_q = static_cast<int>(shape.s_q);
  p.h_q = static_cast<int>(shape.h_q);
  p.tokens = p.batch * p.s_q;
  p.scale = shape.softmax_scale;
  p.scale_log2 = shape.softmax_scale * 1.4426950408889634f;
  const int64_t max_tiles = (shape.topk + kKeysPerTile - 1) / kKeysPerTile +
                            (shape.extra_topk + kKeysPerTile - 1) / kKeysPerTile;
  return launch_sparse_attention(p, static_cast<int>(shape.d_qk), max_tiles, args.workspace,
                                 shape.device.index, stream, kOp, args.batch_invariant,
                                 /*prefill=*/false, tuning);
}

Status sparse_decode_with_tuning(const SparseDecodeArgs& args, const SparseTuning& tuning,
                                 cudaStream_t stream) {
  core::SparseDecodeShape shape;
  OPENMLA_RETURN_IF_ERROR(core::validate_sparse_decode(args, &shape));
  attention::DeviceFacts facts;
  OPENMLA_RETURN_IF_ERROR(attention::require_sm90(kOp, shape.device, &facts));
  attention::DeviceGuard guard;
  OPENMLA_RETURN_IF_ERROR(guard.enter(kOp, shape.device.index));
  return sparse_decode(args, shape, stream, tuning);
}

}  // namespace openmla::cuda::sm90
