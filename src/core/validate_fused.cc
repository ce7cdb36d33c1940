#include "core/validate_fused.h"

#include <cmath>
#include <cstdint>
#include <string>

#include "core/str_cat.h"
#include "core/validate.h"

namespace openmla::core {
namespace {

template <typename... Parts>
Status invalid(const char* op, const Parts&... parts) {
  return Status::InvalidArgument(str_cat(op, ": ", parts...));
}

Status check_present(const TensorView& t, const char* op, const char* arg) {
  if (!t.defined()) return invalid(op, arg, ": required tensor is missing");
  if (t.rank < 0 || t.rank > kMaxTensorRank) {
    return invalid(op, arg, ": expected 0 to ", kMaxTensorRank, " dimensions, got rank ", t.rank);
  }
  for (int d = 0; d < t.rank; ++d) {
    if (t.shape[d] < 0) return invalid(op, arg, ": negative size in shape ", t.shape_string());
  }
  const int64_t elements = t.numel();
  if (elements == INT64_MAX) {
    return invalid(op, arg, ": shape ", t.shape_string(), " has more than 2^63 elements");
  }
  if (t.data == nullptr && elements > 0) return invalid(op, arg, ": data pointer is null");
  return Status::Ok();
}

Status check_tensor(const TensorView& t, int rank, DType dtype, Device device, const char* op,
                    const char* arg) {
  OPENMLA_RETURN_IF_ERROR(check_present(t, op, arg));
  OPENMLA_RETURN_IF_ERROR(check_rank(t, rank, op, arg));
  OPENMLA_RETURN_IF_ERROR(check_dtype(t, dtype, op, arg));
  return check_device(t, device, op, arg);
}

Status check_optional_vector(const TensorView& t, int64_t n, DType dtype, Device device,
                             const char* op, const char* arg, const char* dim_name) {
  if (!t.defined()) return Status::Ok();
  OPENMLA_RETURN_IF_ERROR(check_tensor(t, 1, dtype, device, op, arg));
  return check_dim(t, 0, n, op, arg, dim_name);
}

Status check_cache(const KVCache& cache, Device device, const char* op, const char* arg) {
  if (!cache.defined()) return invalid(op, arg, ": required KV cache is missing (data is null)");
  if (cache.num_blocks < 0) return invalid(op, arg, ".num_blocks: expected >= 0, got ", cache.num_blocks);
  const std::string layout_arg = str_cat(op, ": ", arg, ".layout");
  OPENMLA_RETURN_IF_ERROR(check_kv_layout(cache.layout, layout_arg.c_str()));
  if (cache.device != device) {
    return invalid(op, arg, ": expected device ", device_name(device), " (q's device), got ",
                   device_name(cache.device));
  }
  return Status::Ok();
}

// q, the settings, positions, cos/sin cache, attn_sink, topk_length and the cast outputs: all
// that prefill and decode share. Fills everything of `s` but topk / extra_topk / s_kv.
Status check_common(const FusedNormRopeCast& f, const TensorView& q, const TensorView& topk_length,
                    const TensorView& attn_sink, int d_v, float softmax_scale,
                    const TensorView& out_fp8, const TensorView& out_sf, const TensorView& lse,
                    const char* op, FusedShape* s) {
  OPENMLA_RETURN_IF_ERROR(check_present(q, op, "q"));
  OPENMLA_RETURN_IF_ERROR(check_rank(q, 3, op, "q"));
  OPENMLA_RETURN_IF_ERROR(check_dtype(q, DType::kBF16, op, "q"));
  const Device dev = q.device;
  s->device = dev;
  s->s_q = q.shape[0];
  s->h_q = q.shape[1];
  s->d_qk = q.shape[2];
  s->d_v = d_v;
  if (s->h_q < 1) return invalid(op, "q: expected h_q (dim 1) >= 1, got ", s->h_q);
  constexpr int64_t kMaxDim = INT32_MAX;  // sizes of int32 range, as FlashMLA's
  if (s->s_q > kMaxDim || s->h_q > kMaxDim || s->d_qk > kMaxDim) {
    return invalid(op, "q: expected every dim < 2^31, got shape ", q.shape_string());
  }
  if (s->d_qk > 1 && q.strides[2] != 1) {
    return invalid(op, "q: expected a contiguous last dim (stride 1), got stride ", q.strides[2]);
  }
  if (s->h_q > 1 && q.strides[1] != s->d_qk) {
    return invalid(op, "q: each token's h_q * d_qk values must be contiguous (the "
                   "permute_q_b_proj layout): expected stride(1) == d_qk = ", s->d_qk, ", got ",
                   q.strides[1]);
  }
  // The settings FlashMLA's kernels take (the others are refused there too).
  if (f.is_rope_neox_style) return invalid(op, "is_rope_neox_style: only false is supported");
  if (f.rope_dim != 64) return invalid(op, "rope_dim: expected 64, got ", f.rope_dim);
  if (f.num_per_channels != 32) {
    return invalid(op, "num_per_channels: expected 32, got ", f.num_per_channels);
  }
  if (!f.use_tma_aligned_col_major_sf) {
    return invalid(op, "use_tma_aligned_col_major_sf: only true is supported");
  }
  if (!f.round_sf) return invalid(op, "round_sf: only true is supported");
  if (!f.use_packed_ue8m0) return invalid(op, "use_packed_ue8m0: only true is supported");
  if (!(f.rms_norm_eps >= 0.f) || !std::isfinite(f.rms_norm_eps)) {
    return invalid(op, "rms_norm_eps: expected a finite value >= 0, got ", f.rms_norm_eps);
  }
  s->rope_dim = f.rope_dim;
  // Head dims: q's chunks of 16, the output's chunks of 32, RoPE on the last rope_dim of both.
  if (d_v < f.rope_dim || d_v % 32 != 0) {
    return invalid(op, "d_v: expected a multiple of 32 and >= rope_dim (", f.rope_dim, "), got ", d_v);
  }
  if (s->d_qk < d_v || s->d_qk % 16 != 0) {
    return invalid(op, "q: expected head dim (dim 2) a multiple of 16 and >= d_v (", d_v,
                   "), got ", s->d_qk);
  }
  if (f.n_wv_group < 1 || s->h_q % f.n_wv_group != 0) {
    return invalid(op, "n_wv_group: expected a divisor of h_q = ", s->h_q, ", got ", f.n_wv_group);
  }
  s->n_wv_group = f.n_wv_group;
  s->wv_group_size = s->h_q / f.n_wv_group;
  const int64_t group_dims = s->wv_group_size * d_v;
  if (group_dims % 128 != 0) {
    return invalid(op, "n_wv_group: wv_group_size * d_v = ", group_dims,
                   " must be a multiple of 128 (4 packed scales of 32 values)");
  }
  s->softmax_scale = softmax_scale > 0.f ? softmax_scale
                                         : 1.f / std::sqrt(static_cast<float>(s->d_qk));

  OPENMLA_RETURN_IF_ERROR(check_tensor(f.token_positions, 1, DType::kInt32, dev, op, "token_positions"));
  OPENMLA_RETURN_IF_ERROR(check_dim(f.token_positions, 0, s->s_q, op, "token_positions", "0 (s_q)"));
  OPENMLA_RETURN_IF_ERROR(check_tensor(f.cos_sin_cache, 2, DType::kFP32, dev, op, "cos_sin_cache"));
  OPENMLA_RETURN_IF_ERROR(
      check_dim(f.cos_sin_cache, 1, f.rope_dim, op, "cos_sin_cache", "1 (rope_dim)"));
  s->num_positions = f.cos_sin_cache.shape[0];
  if (dev.type == DeviceType::kCPU) {
    const int32_t* pos = f.token_positions.data_as<const int32_t>();
    for (int64_t i = 0; i < s->s_q; ++i) {
      const int64_t p = pos[i * f.token_positions.strides[0]];
      if (p < 0 || p >= s->num_positions) {
        return invalid(op, "token_positions: entry ", i, " is ", p,
                       ", outside the cos_sin_cache's positions [0, ", s->num_positions, ")");
      }
    }
  }
  OPENMLA_RETURN_IF_ERROR(
      check_optional_vector(topk_length, s->s_q, DType::kInt32, dev, op, "topk_length", "0 (s_q)"));
  OPENMLA_RETURN_IF_ERROR(
      check_optional_vector(attn_sink, s->h_q, DType::kFP32, dev, op, "attn_sink", "0 (h_q)"));

  OPENMLA_RETURN_IF_ERROR(check_tensor(out_fp8, 3, DType::kUInt8, dev, op, "out_fp8"));
  OPENMLA_RETURN_IF_ERROR(check_dim(out_fp8, 0, s->s_q, op, "out_fp8", "0 (s_q)"));
  OPENMLA_RETURN_IF_ERROR(check_dim(out_fp8, 1, s->n_wv_group, op, "out_fp8", "1 (n_wv_group)"));
  OPENMLA_RETURN_IF_ERROR(
      check_dim(out_fp8, 2, group_dims, op, "out_fp8", "2 (wv_group_size * d_v)"));
  OPENMLA_RETURN_IF_ERROR(check_last_dim_contiguous(out_fp8, op, "out_fp8"));

  FusedOutSfLayout layout;
  OPENMLA_RETURN_IF_ERROR(fused_out_sf_layout(s->s_q, s->n_wv_group, s->wv_group_size, d_v, &layout));
  OPENMLA_RETURN_IF_ERROR(check_tensor(out_sf, 3, DType::kInt32, dev, op, "out_sf"));
  OPENMLA_RETURN_IF_ERROR(check_dim(out_sf, 0, s->s_q, op, "out_sf", "0 (s_q)"));
  OPENMLA_RETURN_IF_ERROR(check_dim(out_sf, 1, s->n_wv_group, op, "out_sf", "1 (n_wv_group)"));
  OPENMLA_RETURN_IF_ERROR(
      check_dim(out_sf, 2, layout.shape[2], op, "out_sf", "2 (wv_group_size * d_v / 128)"));
  for (int d = 0; d < 3; ++d) {
    if (out_sf.shape[d] > 1 && out_sf.strides[d] != layout.strides[d]) {
      return invalid(op, "out_sf: expected the TMA-aligned column-major strides (",
                     layout.strides[0], ", ", layout.strides[1], ", ", layout.strides[2],
                     ") of fused_out_sf_layout, got stride ", out_sf.strides[d], " in dim ", d);
    }
  }
  OPENMLA_RETURN_IF_ERROR(check_tensor(lse, 2, DType::kFP32, dev, op, "lse"));
  OPENMLA_RETURN_IF_ERROR(check_dim(lse, 0, s->s_q, op, "lse", "0 (s_q)"));
  return check_dim(lse, 1, s->h_q, op, "lse", "1 (h_q)");
}

}  // namespace

Status validate_fused_prefill(const FusedPrefillArgs& a, FusedShape* s) {
  const char* op = "fused_norm_rope_attn_rope_cast_prefill";
  OPENMLA_RETURN_IF_ERROR(check_common(a.fused, a.q, a.topk_length, a.attn_sink, a.d_v,
                                       a.softmax_scale, a.out_fp8, a.out_sf, a.lse, op, s));
  const Device dev = s->device;
  OPENMLA_RETURN_IF_ERROR(check_tensor(a.kv, 3, DType::kBF16, dev, op, "kv"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.kv, 1, 1, op, "kv", "1 (h_kv)"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.kv, 2, s->d_qk, op, "kv", "2 (d_qk, as q)"));
  OPENMLA_RETURN_IF_ERROR(check_last_dim_contiguous(a.kv, op, "kv"));
  s->s_kv = a.kv.shape[0];
  OPENMLA_RETURN_IF_ERROR(check_tensor(a.indices, 3, DType::kInt32, dev, op, "indices"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.indices, 0, s->s_q, op, "indices", "0 (s_q)"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.indices, 1, 1, op, "indices", "1 (h_kv)"));
  s->topk = a.indices.shape[2];
  s->extra_topk = 0;
  OPENMLA_RETURN_IF_ERROR(check_tensor(a.max_logits, 2, DType::kFP32, dev, op, "max_logits"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.max_logits, 0, s->s_q, op, "max_logits", "0 (s_q)"));
  return check_dim(a.max_logits, 1, s->h_q, op, "max_logits", "1 (h_q)");
}

Status validate_fused_decode(const FusedDecodeArgs& a, FusedShape* s) {
  const char* op = "fused_norm_rope_attn_rope_cast_decode";
  OPENMLA_RETURN_IF_ERROR(check_common(a.fused, a.q, a.topk_length, a.attn_sink, a.d_v,
                                       a.softmax_scale, a.out_fp8, a.out_sf, a.lse, op, s));
  const Device dev = s->device;
  s->s_kv = 0;
  if (s->s_q < 1) return invalid(op, "q: expected s_q (dim 0) >= 1, got ", s->s_q);
  OPENMLA_RETURN_IF_ERROR(check_cache(a.k_cache, dev, op, "k_cache"));
  const KVFormat main = a.k_cache.layout.format;
  if (main != KVFormat::kFP8_Model1 && main != KVFormat::kFP8_MX) {
    return invalid(op, "k_cache: expected format fp8_model1 (V4, 584 B) or fp8_mx (V4.1, 528 B), "
                   "got ", kv_format_name(main));
  }
  if (kv_format_info(main).d_qk != s->d_qk) {
    return invalid(op, "k_cache: format ", kv_format_name(main), " holds d_qk ",
                   kv_format_info(main).d_qk, " but q has d_qk ", s->d_qk);
  }
  OPENMLA_RETURN_IF_ERROR(check_tensor(a.indices, 2, DType::kInt32, dev, op, "indices"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.indices, 0, s->s_q, op, "indices", "0 (s_q)"));
  s->topk = a.indices.shape[1];
  if (s->topk < 1) return invalid(op, "indices: expected topk (dim 1) >= 1, got ", s->topk);
  s->extra_topk = 0;
  if (a.extra_k_cache.defined()) {
    OPENMLA_RETURN_IF_ERROR(check_cache(a.extra_k_cache, dev, op, "extra_k_cache"));
    const KVFormat extra = a.extra_k_cache.layout.format;
    const bool paired = extra == main || (main == KVFormat::kFP8_MX && extra == KVFormat::kFP4);
    if (!paired) {
      return invalid(op, "extra_k_cache: expected the format of k_cache (", kv_format_name(main),
                     ")", main == KVFormat::kFP8_MX ? " or fp4" : "", ", got ",
                     kv_format_name(extra));
    }
    if (!a.extra_indices.defined()) return invalid(op, "extra_indices: required with extra_k_cache");
    OPENMLA_RETURN_IF_ERROR(check_tensor(a.extra_indices, 2, DType::kInt32, dev, op, "extra_indices"));
    OPENMLA_RETURN_IF_ERROR(check_dim(a.extra_indices, 0, s->s_q, op, "extra_indices", "0 (s_q)"));
    s->extra_topk = a.extra_indices.shape[1];
    OPENMLA_RETURN_IF_ERROR(check_optional_vector(a.extra_topk_length, s->s_q, DType::kInt32, dev,
                                                  op, "extra_topk_length", "0 (s_q)"));
  } else if (a.extra_indices.defined() || a.extra_topk_length.defined()) {
    return invalid(op, a.extra_indices.defined() ? "extra_indices" : "extra_topk_length",
                   ": given without extra_k_cache");
  }
  return Status::Ok();
}

}  // namespace openmla::core

namespace openmla {

Status fused_out_sf_layout(int64_t s_q, int64_t n_wv_group, int64_t wv_group_size, int64_t d_v,
                           FusedOutSfLayout* layout) {
  const char* op = "fused_out_sf_layout";
  if (layout == nullptr) return Status::InvalidArgument("fused_out_sf_layout: layout is null");
  if (s_q < 0) return core::invalid(op, "s_q: expected >= 0, got ", s_q);
  if (n_wv_group < 1) return core::invalid(op, "n_wv_group: expected >= 1, got ", n_wv_group);
  if (s_q > INT32_MAX || n_wv_group > INT32_MAX || wv_group_size > INT32_MAX || d_v > INT32_MAX) {
    return core::invalid(op, "expected every size < 2^31, got s_q ", s_q, ", n_wv_group ",
                         n_wv_group, ", wv_group_size ", wv_group_size, ", d_v ", d_v);
  }
  if (wv_group_size < 1 || d_v < 1 || (wv_group_size * d_v) % 128 != 0) {
    return core::invalid(op, "wv_group_size * d_v: expected a positive multiple of 128, got ",
                         wv_group_size, " * ", d_v);
  }
  const int64_t k = wv_group_size * d_v / 128;
  const int64_t aligned = (s_q + 3) / 4 * 4;
  int64_t all_groups = 0, storage = 0;
  if (__builtin_mul_overflow(k, n_wv_group, &all_groups) ||
      __builtin_mul_overflow(all_groups, aligned, &storage)) {
    return core::invalid(op, "the scale factors of s_q ", s_q, ", n_wv_group ", n_wv_group,
                         ", wv_group_size * d_v ", wv_group_size * d_v, " exceed 2^63 elements");
  }
  layout->shape[0] = s_q;
  layout->shape[1] = n_wv_group;
  layout->shape[2] = k;
  layout->strides[0] = 1;
  layout->strides[1] = k * aligned;
  layout->strides[2] = aligned;
  layout->aligned_s_q = aligned;
  layout->storage_ints = storage;
  return Status::Ok();
}

}  // namespace openmla
