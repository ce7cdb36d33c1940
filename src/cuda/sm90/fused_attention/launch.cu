// Host side of the fused V4 attention on SM90 (launch.h): the sparse attention kernel's
// parameters as sparse decode (paged caches) or sparse prefill (bf16 kv) fill them, with q read
// in the permute_q_b_proj layout and the fused steps on (SparseFusedParams).
#include "cuda/sm90/fused_attention/launch.h"

#include <algorithm>
#include <cstdint>

#include "core/str_cat.h"
#include "cuda/sm90/sparse_decode/launch.h"
#include "cuda/sm90/sparse_decode/params.h"

namespace openmla::cuda::sm90 {
namespace {

constexpr int kDims = 512;  // d_qk = d_v of the kernel's fused form
constexpr int64_t kKeysPerTile = 64;

template <typename... Parts>
Status not_implemented(const char* op, const Parts&... parts) {
  return Status::NotImplemented(core::str_cat(op, ": ", parts...));
}

// What the kernel needs beyond validation: d 512, q's 16-byte chunks, out_fp8's 4-byte groups.
Status check_kernel_shapes(const char* op, const core::FusedShape& s, const TensorView& q,
                           const TensorView& out_fp8) {
  if (s.d_qk != kDims || s.d_v != kDims) {
    return not_implemented(op, "q / d_v: the CUDA kernel is built for d_qk = d_v = 512 "
                           "(FlashMLA's size), got d_qk ", s.d_qk, ", d_v ", s.d_v);
  }
  if (reinterpret_cast<uintptr_t>(q.data) % 16 != 0 || (s.s_q > 1 && q.strides[0] % 8 != 0)) {
    return not_implemented(op, "q: the CUDA kernel loads 16-byte pieces; expected a 16-byte "
                           "aligned address and a token stride that is a multiple of 8, got "
                           "stride ", q.strides[0]);
  }
  if (reinterpret_cast<uintptr_t>(out_fp8.data) % 4 != 0 ||
      (s.s_q > 1 && out_fp8.strides[0] % 4 != 0) ||
      (s.n_wv_group > 1 && out_fp8.strides[1] % 4 != 0)) {
    return not_implemented(op, "out_fp8: the CUDA kernel stores 4-byte groups; expected a "
                           "4-byte aligned address and strides that are multiples of 4");
  }
  return Status::Ok();
}

// q, lse, the fused steps and the sizes shared by both modes: every query token a problem of
// its own (batch = s_q tokens of one token each).
void fill_common(const FusedNormRopeCast& f, const TensorView& q, const TensorView& out_fp8,
                 const TensorView& out_sf, const TensorView& lse, const TensorView& attn_sink,
                 const core::FusedShape& s, SparseDecodeParams* p) {
  p->q = q.data;
  p->q_stride_b = q.strides[0];
  p->q_stride_s = 0;
  p->q_stride_h = 16;                     // head h's chunk c of 16 dims at c * h_q * 16 + h * 16
  p->q_stride_c16 = 16 * s.h_q;
  p->lse = lse.data_as<float>();
  p->lse_stride_b = lse.strides[0];
  p->lse_stride_h = lse.strides[1];
  p->lse_stride_s = 0;
  if (attn_sink.defined()) {
    p->sink = attn_sink.data_as<const float>();
    p->sink_stride = attn_sink.strides[0];
  }
  SparseFusedParams& u = p->fused;
  u.on = true;
  u.q_norm = f.enable_q_norm;
  u.eps = f.rms_norm_eps;
  u.positions = f.token_positions.data_as<const int32_t>();
  u.positions_stride = f.token_positions.strides[0];
  u.num_positions = s.num_positions;
  u.cos_sin = f.cos_sin_cache.data_as<const float>();
  u.cos_sin_stride0 = f.cos_sin_cache.strides[0];
  u.cos_sin_stride1 = f.cos_sin_cache.strides[1];
  u.out_fp8 = out_fp8.data_as<uint8_t>();
  u.out_stride_s = out_fp8.strides[0];
  u.out_stride_g = out_fp8.strides[1];
  u.out_sf = out_sf.data_as<int32_t>();
  u.sf_stride_s = out_sf.strides[0];
  u.sf_stride_g = out_sf.strides[1];
  u.sf_stride_k = out_sf.strides[2];
  u.group_size = static_cast<int>(s.wv_group_size);
  p->batch = static_cast<int>(s.s_q);
  p->s_q = 1;
  p->h_q = static_cast<int>(s.h_q);
  p->tokens = p->batch;
  p->scale = s.softmax_scale;
  p->scale_log2 = s.softmax_scale * 1.4426950408889634f;
}

}  // namespace

size_t fused_workspace_size(int device_index, int64_t s_q, int64_t h_q) {
  if (s_q <= 0 || h_q <= 0 || s_q > INT32_MAX || h_q > INT32_MAX) return 0;
  // Decode plans its splits over s_q * ceil(h_q / 64) CTAs, prefill over s_q: the larger bound.
  const int h = static_cast<int>(h_q);
  return std::max(sparse_workspace_bytes(device_index, s_q, 1, s_q * ((h_q + 63) / 64), h),
                  sparse_workspace_bytes(device_index, s_q, 1, s_q, h));
}

Status fused_prefill(const FusedPrefillArgs& args, const core::FusedShape& shape,
                     cudaStream_t stream, const core::SparseTuning& tuning) {
  constexpr const char* kOp = "fused_norm_rope_attn_rope_cast_prefill";
  OPENMLA_RETURN_IF_ERROR(check_kernel_shapes(kOp, shape, args.q, args.out_fp8));
  if (shape.topk > (1 << 24)) {
    return Status::InvalidArgument(
        core::str_cat(kOp, ": indices: topk ", shape.topk, " above the kernel's 2^24"));
  }
  if (shape.s_kv > INT32_MAX) {
    return Status::InvalidArgument(
        core::str_cat(kOp, ": kv: ", shape.s_kv, " tokens; int32 indices address at most 2^31"));
  }
  if (shape.s_q == 0) return Status::Ok();
  SparseDecodeParams p = {};
  fill_common(args.fused, args.q, args.out_fp8, args.out_sf, args.lse, args.attn_sink, shape, &p);
  p.max_logits = args.max_logits.data_as<float>();
  p.max_logits_stride_b = args.max_logits.strides[0];
  p.max_logits_stride_h = args.max_logits.strides[1];
  KVCache rows;  // kv as a bf16 cache of one-token pages
  rows.data = args.kv.data;
  rows.layout = default_kv_layout(KVFormat::kBF16, 1, kDims);
  rows.layout.block_stride = args.kv.strides[0] * 2;
  rows.num_blocks = shape.s_kv;
  rows.device = args.kv.device;
  if (shape.s_kv > 1 && rows.layout.block_stride < kDims * 2) {
    return not_implemented(kOp, "kv: the CUDA kernel reads token rows apart; expected a token "
                           "stride of at least 512 elements, got ", args.kv.strides[0]);
  }
  OPENMLA_RETURN_IF_ERROR(sparse_cache_params(rows, "kv", &p.cache[0], tuning));
  set_key_list(&p, 0, args.indices.data_as<const int32_t>(), args.indices.strides[0], 0,
               args.indices.strides[2], args.topk_length, shape.topk);
  p.cache[1] = p.cache[0];
  p.indices[1] = p.indices[0];
  return launch_sparse_attention(p, kDims, (shape.topk + kKeysPerTile - 1) / kKeysPerTile,
                                 args.workspace, shape.device.index, stream, kOp,
                                 /*batch_invariant=*/false, /*prefill=*/true, tuning);
}

Status fused_decode(const FusedDecodeArgs& args, const core::FusedShape& shape,
                    cudaStream_t stream, const core::SparseTuning& tuning) {
  constexpr const char* kOp = "fused_norm_rope_attn_rope_cast_decode";
  OPENMLA_RETURN_IF_ERROR(check_kernel_shapes(kOp, shape, args.q, args.out_fp8));
  if (shape.topk > (1 << 24) || shape.extra_topk > (1 << 24)) {
    return Status::InvalidArgument(core::str_cat(kOp, ": indices: topk ", shape.topk,
                                                 " / extra_topk ", shape.extra_topk,
                                                 " above the kernel's 2^24"));
  }
  SparseDecodeParams p = {};
  fill_common(args.fused, args.q, args.out_fp8, args.out_sf, args.lse, args.attn_sink, shape, &p);
  OPENMLA_RETURN_IF_ERROR(sparse_cache_params(args.k_cache, "k_cache", &p.cache[0], tuning));
  // indices [s_q, topk]: token i's row is "request" i's (s_q = 1 a request).
  set_key_list(&p, 0, args.indices.data_as<const int32_t>(), args.indices.strides[0], 0,
               args.indices.strides[1], args.topk_length, shape.topk);
  p.cache[1] = p.cache[0];
  p.indices[1] = p.indices[0];
  if (args.extra_k_cache.defined()) {
    OPENMLA_RETURN_IF_ERROR(
        sparse_cache_params(args.extra_k_cache, "extra_k_cache", &p.cache[1], tuning));
    const TensorView& extra = args.extra_indices;
    set_key_list(&p, 1, extra.data_as<const int32_t>(), extra.strides[0], 0, extra.strides[1],
                 args.extra_topk_length, shape.extra_topk);
  }
  const int64_t max_tiles = (shape.topk + kKeysPerTile - 1) / kKeysPerTile +
                            (shape.extra_topk + kKeysPerTile - 1) / kKeysPerTile;
  return launch_sparse_attention(p, kDims, max_tiles, args.workspace, shape.device.index, stream,
                                 kOp, args.batch_invariant, /*prefill=*/false, tuning);
}

}  // namespace openmla::cuda::sm90
