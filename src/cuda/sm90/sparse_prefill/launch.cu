// Host side of SM90 sparse prefill (launch.h). bf16 kv [s_kv, h_kv, d_qk]: each kv head is a
// bf16 "cache" of s_kv one-token pages (block stride = kv's token stride), read by its group of
// h_q / h_kv query heads with indices[:, g, :]; one launch per kv head. (The kv_cache variant,
// keys from a paged cache in any format, is sparse decode with the query tokens as its batch:
// src/api routes it there.)
#include "cuda/sm90/sparse_prefill/launch.h"

#include "core/str_cat.h"
#include "cuda/sm90/sparse_decode/launch.h"
#include "cuda/sm90/sparse_decode/params.h"

namespace openmla::cuda::sm90 {

size_t sparse_prefill_workspace_size(int device_index, int s_q, int h_q, int d_v) {
  if (s_q <= 0 || h_q <= 0 || d_v <= 0) return 0;
  // A kv head's launch has s_q x ceil(group / 64) >= s_q CTAs and group <= h_q heads.
  return sparse_workspace_bytes(device_index, s_q, 1, s_q, h_q);
}

Status sparse_prefill(const SparsePrefillArgs& args, const core::SparsePrefillShape& shape,
                      cudaStream_t stream, const core::SparseTuning& tuning) {
  constexpr const char* kOp = "sparse_prefill";
  if (shape.d_v != 512) {
    return Status::NotImplemented(
        core::str_cat(kOp, ": d_v ", shape.d_v, " has no CUDA kernel (d_v 512 only)"));
  }
  if (shape.topk > (1 << 24)) {
    return Status::InvalidArgument(
        core::str_cat(kOp, ": indices: topk ", shape.topk, " above the kernel's 2^24"));
  }
  if (shape.s_kv > INT32_MAX) {
    return Status::InvalidArgument(
        core::str_cat(kOp, ": kv: ", shape.s_kv, " tokens; int32 indices address at most 2^31"));
  }
  OPENMLA_RETURN_IF_ERROR(check_q_out(kOp, args.q, args.out));
  const TensorView& q = args.q;
  const TensorView& kv = args.kv;
  const int group = static_cast<int>(shape.h_q / shape.h_kv);
  for (int g = 0; g < shape.h_kv; ++g) {
    const int64_t h0 = static_cast<int64_t>(g) * group;  // the kv head's first query head
    SparseDecodeParams p = {};
    p.q = static_cast<const uint16_t*>(q.data) + h0 * q.strides[1];
    p.q_stride_b = q.strides[0];
    p.q_stride_h = q.strides[1];
    p.out = static_cast<uint16_t*>(args.out.data) + h0 * args.out.strides[1];
    p.out_stride_b = args.out.strides[0];
    p.out_stride_h = args.out.strides[1];
    p.lse = args.lse.data_as<float>() + h0 * args.lse.strides[1];
    p.lse_stride_b = args.lse.strides[0];
    p.lse_stride_h = args.lse.strides[1];
    p.max_logits = args.max_logits.data_as<float>() + h0 * args.max_logits.strides[1];
    p.max_logits_stride_b = args.max_logits.strides[0];
    p.max_logits_stride_h = args.max_logits.strides[1];

    KVCache rows;  // kv head g as a bf16 cache of one-token pages
    rows.data = static_cast<uint16_t*>(kv.data) + g * kv.strides[1];
    rows.layout = default_kv_layout(KVFormat::kBF16, 1, static_cast<int>(shape.d_qk));
    rows.layout.block_stride = kv.strides[0] * 2;
    rows.num_blocks = shape.s_kv;
    rows.device = kv.device;
    if (shape.s_kv > 1 && rows.layout.block_stride < shape.d_qk * 2) {
      return Status::NotImplemented(core::str_cat(
          kOp, ": kv: the CUDA kernel reads token rows apart; expected a token stride of at least ",
          shape.d_qk, " elements, got ", kv.strides[0]));
    }
    OPENMLA_RETURN_IF_ERROR(sparse_cache_params(rows, "kv", &p.cache[0], tuning));
    set_key_list(&p, 0, args.indices.data_as<const int32_t>() + g * args.indices.strides[1],
                 args.indices.strides[0], 0, args.indices.strides[2], args.topk_length,
                 shape.topk);
    p.cache[1] = p.cache[0];
    p.indices[1] = p.indices[0];
    if (args.attn_sink.defined()) {
      p.sink = args.attn_sink.data_as<const float>() + h0 * args.attn_sink.strides[0];
      p.sink_stride = args.attn_sink.strides[0];
    }
    p.batch = static_cast<int>(shape.s_q);
    p.s_q = 1;
    p.h_q = group;
    p.tokens = p.batch;
    p.scale = shape.softmax_scale;
    p.scale_log2 = shape.softmax_scale * 1.4426950408889634f;
    OPENMLA_RETURN_IF_ERROR(launch_sparse_attention(p, static_cast<int>(shape.d_qk),
                                                    (shape.topk + 63) / 64, args.workspace,
                                                    shape.device.index, stream, kOp,
                                                    /*batch_invariant=*/false,
                                                    /*prefill=*/true, tuning));
  }
  return Status::Ok();
}

}  // namespace openmla::cuda::sm90
