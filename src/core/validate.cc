#include "core/validate.h"

#include "core/str_cat.h"

#include <cmath>
#include <string>

namespace openmla::core {
namespace {

template <typename... Parts>
Status invalid(const char* op, const Parts&... parts) {
  return Status::InvalidArgument(str_cat(op, ": ", parts...));
}

float resolve_scale(float softmax_scale, int64_t d_qk) {
  return softmax_scale > 0.f ? softmax_scale : 1.f / std::sqrt(static_cast<float>(d_qk));
}

Status check_required(const TensorView& t, const char* op, const char* arg) {
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

Status check_dtype_one_of(const TensorView& t, std::initializer_list<DType> allowed, const char* op,
                          const char* arg) {
  for (DType d : allowed) {
    if (t.dtype == d) return Status::Ok();
  }
  std::string names;
  for (DType d : allowed) names += std::string(names.empty() ? "" : " or ") + dtype_name(d);
  return invalid(op, arg, ": expected dtype ", names, ", got ", dtype_name(t.dtype));
}

// A required tensor of known rank, dtype and device.
Status check_tensor(const TensorView& t, int rank, DType dtype, Device device, const char* op,
                    const char* arg) {
  OPENMLA_RETURN_IF_ERROR(check_required(t, op, arg));
  OPENMLA_RETURN_IF_ERROR(check_rank(t, rank, op, arg));
  OPENMLA_RETURN_IF_ERROR(check_dtype(t, dtype, op, arg));
  return check_device(t, device, op, arg);
}

Status check_cache(const KVCache& cache, Device device, const char* op, const char* arg) {
  if (!cache.defined()) return invalid(op, arg, ": required KV cache is missing (data is null)");
  if (cache.num_blocks < 0) return invalid(op, arg, ".num_blocks: expected >= 0, got ", cache.num_blocks);
  std::string layout_arg = std::string(op) + ": " + arg + ".layout";
  OPENMLA_RETURN_IF_ERROR(check_kv_layout(cache.layout, layout_arg.c_str()));
  if (cache.device != device) {
    return invalid(op, arg, ": expected device ", device_name(device), " (q's device), got ",
                   device_name(cache.device));
  }
  return Status::Ok();
}

// Optional [n] int32 per-request lengths (topk_length and friends).
Status check_optional_lengths(const TensorView& t, int64_t n, Device device, const char* op,
                              const char* arg) {
  if (!t.defined()) return Status::Ok();
  OPENMLA_RETURN_IF_ERROR(check_tensor(t, 1, DType::kInt32, device, op, arg));
  return check_dim(t, 0, n, op, arg, "0");
}

Status check_optional_sink(const TensorView& t, int64_t h_q, Device device, const char* op) {
  if (!t.defined()) return Status::Ok();
  OPENMLA_RETURN_IF_ERROR(check_tensor(t, 1, DType::kFP32, device, op, "attn_sink"));
  return check_dim(t, 0, h_q, op, "attn_sink", "0 (h_q)");
}

Status check_d_qk(int64_t d_qk, const char* op, const char* arg) {
  if (d_qk != 576 && d_qk != 512) return invalid(op, arg, ": expected head dim 576 or 512, got ", d_qk);
  return Status::Ok();
}

Status check_d_v(int d_v, const char* op) {
  if (d_v != 512) return invalid(op, "d_v: expected 512, got ", d_v);
  return Status::Ok();
}

Status check_schedule(const DecodeSchedule& s, int64_t batch, Device device, const char* op) {
  if (!s.metadata.defined() && !s.num_splits.defined()) return Status::Ok();
  OPENMLA_RETURN_IF_ERROR(check_tensor(s.metadata, 2, DType::kInt32, device, op, "schedule.metadata"));
  OPENMLA_RETURN_IF_ERROR(
      check_dim(s.metadata, 1, kScheduleMetadataInts, op, "schedule.metadata", "1"));
  OPENMLA_RETURN_IF_ERROR(
      check_tensor(s.num_splits, 1, DType::kInt32, device, op, "schedule.num_splits"));
  return check_dim(s.num_splits, 0, batch + 1, op, "schedule.num_splits", "0 (batch + 1)");
}

// Element (i, j) of a host-readable rank-2 int32 view.
int32_t at2(const TensorView& t, int64_t i, int64_t j) {
  return t.data_as<const int32_t>()[i * t.strides[0] + j * t.strides[1]];
}
int32_t at1(const TensorView& t, int64_t i) { return t.data_as<const int32_t>()[i * t.strides[0]]; }

}  // namespace

Status check_dtype(const TensorView& t, DType expected, const char* op, const char* arg) {
  if (t.dtype != expected) {
    return invalid(op, arg, ": expected dtype ", dtype_name(expected), ", got ", dtype_name(t.dtype));
  }
  return Status::Ok();
}

Status check_rank(const TensorView& t, int rank, const char* op, const char* arg) {
  if (t.rank != rank) {
    return invalid(op, arg, ": expected ", rank, " dimensions, got ", t.rank, " (shape ",
                   t.shape_string(), ")");
  }
  return Status::Ok();
}

Status check_dim(const TensorView& t, int dim, int64_t expected, const char* op, const char* arg,
                 const char* dim_name) {
  if (t.shape[dim] != expected) {
    return invalid(op, arg, ": expected size ", expected, " in dim ", dim_name, ", got ",
                   t.shape[dim], " (shape ", t.shape_string(), ")");
  }
  return Status::Ok();
}

Status check_last_dim_contiguous(const TensorView& t, const char* op, const char* arg) {
  if (t.rank > 0 && t.shape[t.rank - 1] > 1 && t.strides[t.rank - 1] != 1) {
    return invalid(op, arg, ": the last dimension must be contiguous (stride 1), got stride ",
                   t.strides[t.rank - 1]);
  }
  return Status::Ok();
}

Status check_device(const TensorView& t, Device expected, const char* op, const char* arg) {
  if (t.device != expected) {
    return invalid(op, arg, ": expected device ", device_name(expected), " (q's device), got ",
                   device_name(t.device));
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
Status validate_dense_decode(const DenseDecodeArgs& a, DenseDecodeShape* s) {
  const char* op = "dense_decode";
  OPENMLA_RETURN_IF_ERROR(check_required(a.q, op, "q"));
  OPENMLA_RETURN_IF_ERROR(check_rank(a.q, 4, op, "q"));
  OPENMLA_RETURN_IF_ERROR(check_dtype_one_of(a.q, {DType::kBF16, DType::kFP16}, op, "q"));
  OPENMLA_RETURN_IF_ERROR(check_last_dim_contiguous(a.q, op, "q"));
  const Device dev = a.q.device;
  s->device = dev;
  s->batch = a.q.shape[0];
  s->s_q = a.q.shape[1];
  s->h_q = a.q.shape[2];
  s->d_qk = a.q.shape[3];
  s->d_v = a.d_v;
  if (s->s_q < 1) return invalid(op, "q: expected s_q (dim 1) >= 1, got ", s->s_q);
  if (s->h_q < 1) return invalid(op, "q: expected h_q (dim 2) >= 1, got ", s->h_q);
  OPENMLA_RETURN_IF_ERROR(check_d_qk(s->d_qk, op, "q"));
  OPENMLA_RETURN_IF_ERROR(check_d_v(a.d_v, op));

  if (a.kv_cache.defined()) {
    if (a.k_cache.defined()) {
      return invalid(op, "k_cache: given together with kv_cache (pass one of them)");
    }
    OPENMLA_RETURN_IF_ERROR(check_cache(a.kv_cache, dev, op, "kv_cache"));
    const KVFormatInfo info = kv_format_info(a.kv_cache.layout.format, a.kv_cache.layout.d_qk);
    if (info.d_qk != s->d_qk) {
      return invalid(op, "kv_cache: format ", kv_format_name(info.format), " holds d_qk ",
                     info.d_qk, " but q has d_qk ", s->d_qk);
    }
    if (info.quantized() && a.q.dtype != DType::kBF16) {
      return invalid(op, "q: expected bf16 with a quantised kv_cache (", kv_format_name(info.format),
                     "), got ", dtype_name(a.q.dtype));
    }
    if (!info.quantized() &&
        (info.format == KVFormat::kFP16) != (a.q.dtype == DType::kFP16)) {
      return invalid(op, "kv_cache: format ", kv_format_name(info.format), " does not match q's ",
                     dtype_name(a.q.dtype));
    }
    s->num_blocks = a.kv_cache.num_blocks;
    s->page_size = a.kv_cache.layout.page_size;
    s->h_kv = 1;
  } else {
    OPENMLA_RETURN_IF_ERROR(check_tensor(a.k_cache, 4, a.q.dtype, dev, op, "k_cache"));
    OPENMLA_RETURN_IF_ERROR(check_last_dim_contiguous(a.k_cache, op, "k_cache"));
    OPENMLA_RETURN_IF_ERROR(check_dim(a.k_cache, 3, s->d_qk, op, "k_cache", "3 (d_qk, as q)"));
    s->num_blocks = a.k_cache.shape[0];
    s->page_size = a.k_cache.shape[1];
    s->h_kv = a.k_cache.shape[2];
  }
  if (s->page_size < 1) return invalid(op, "k_cache: expected page_size (dim 1) >= 1, got ", s->page_size);
  if (s->h_kv < 1 || s->h_q % s->h_kv != 0) {
    return invalid(op, "k_cache: expected h_kv (dim 2) >= 1 dividing h_q = ", s->h_q, ", got ",
                   s->h_kv);
  }

  OPENMLA_RETURN_IF_ERROR(check_tensor(a.block_table, 2, DType::kInt32, dev, op, "block_table"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.block_table, 0, s->batch, op, "block_table", "0 (batch)"));
  s->max_blocks = a.block_table.shape[1];
  OPENMLA_RETURN_IF_ERROR(check_tensor(a.cache_seqlens, 1, DType::kInt32, dev, op, "cache_seqlens"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.cache_seqlens, 0, s->batch, op, "cache_seqlens", "0 (batch)"));

  OPENMLA_RETURN_IF_ERROR(check_tensor(a.out, 4, a.q.dtype, dev, op, "out"));
  OPENMLA_RETURN_IF_ERROR(check_last_dim_contiguous(a.out, op, "out"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.out, 0, s->batch, op, "out", "0 (batch)"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.out, 1, s->s_q, op, "out", "1 (s_q)"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.out, 2, s->h_q, op, "out", "2 (h_q)"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.out, 3, a.d_v, op, "out", "3 (d_v)"));
  OPENMLA_RETURN_IF_ERROR(check_tensor(a.lse, 3, DType::kFP32, dev, op, "lse"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.lse, 0, s->batch, op, "lse", "0 (batch)"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.lse, 1, s->h_q, op, "lse", "1 (h_q)"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.lse, 2, s->s_q, op, "lse", "2 (s_q)"));
  OPENMLA_RETURN_IF_ERROR(check_schedule(a.schedule, s->batch, dev, op));
  s->softmax_scale = resolve_scale(a.softmax_scale, s->d_qk);

  // Host-resident metadata is cheap to check before anything runs (docs/errors.md).
  if (dev.type == DeviceType::kCPU) {
    const int64_t capacity = s->max_blocks * s->page_size;
    for (int64_t i = 0; i < s->batch; ++i) {
      const int32_t len = at1(a.cache_seqlens, i);
      if (len < 0 || len > capacity) {
        return invalid(op, "cache_seqlens[", i, "]: expected 0 <= length <= ", capacity,
                       " (block_table holds ", s->max_blocks, " blocks of ", s->page_size,
                       " tokens), got ", len);
      }
      const int64_t used_blocks = (len + s->page_size - 1) / s->page_size;
      for (int64_t j = 0; j < used_blocks; ++j) {
        const int32_t block = at2(a.block_table, i, j);
        if (block < 0 || block >= s->num_blocks) {
          return invalid(op, "block_table[", i, ", ", j, "]: expected a block in [0, ",
                         s->num_blocks, "), got ", block);
        }
      }
    }
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
Status validate_sparse_decode(const SparseDecodeArgs& a, SparseDecodeShape* s) {
  const char* op = "sparse_decode";
  OPENMLA_RETURN_IF_ERROR(check_required(a.q, op, "q"));
  OPENMLA_RETURN_IF_ERROR(check_rank(a.q, 4, op, "q"));
  OPENMLA_RETURN_IF_ERROR(check_dtype(a.q, DType::kBF16, op, "q"));
  OPENMLA_RETURN_IF_ERROR(check_last_dim_contiguous(a.q, op, "q"));
  const Device dev = a.q.device;
  s->device = dev;
  s->batch = a.q.shape[0];
  s->s_q = a.q.shape[1];
  s->h_q = a.q.shape[2];
  s->d_qk = a.q.shape[3];
  s->d_v = a.d_v;
  if (s->s_q < 1) return invalid(op, "q: expected s_q (dim 1) >= 1, got ", s->s_q);
  if (s->h_q < 1) return invalid(op, "q: expected h_q (dim 2) >= 1, got ", s->h_q);
  OPENMLA_RETURN_IF_ERROR(check_d_qk(s->d_qk, op, "q"));
  OPENMLA_RETURN_IF_ERROR(check_d_v(a.d_v, op));

  OPENMLA_RETURN_IF_ERROR(check_cache(a.k_cache, dev, op, "k_cache"));
  const KVFormatInfo info = kv_format_info(a.k_cache.layout.format, a.k_cache.layout.d_qk);
  if (info.d_qk != s->d_qk) {
    return invalid(op, "k_cache: format ", kv_format_name(info.format), " holds d_qk ", info.d_qk,
                   " but q has d_qk ", s->d_qk);
  }
  OPENMLA_RETURN_IF_ERROR(check_tensor(a.indices, 3, DType::kInt32, dev, op, "indices"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.indices, 0, s->batch, op, "indices", "0 (batch)"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.indices, 1, s->s_q, op, "indices", "1 (s_q)"));
  s->topk = a.indices.shape[2];
  OPENMLA_RETURN_IF_ERROR(check_optional_lengths(a.topk_length, s->batch, dev, op, "topk_length"));

  s->extra_topk = 0;
  if (a.extra_k_cache.defined()) {
    OPENMLA_RETURN_IF_ERROR(check_cache(a.extra_k_cache, dev, op, "extra_k_cache"));
    const KVFormatInfo extra = kv_format_info(a.extra_k_cache.layout.format, a.extra_k_cache.layout.d_qk);
    if (extra.d_qk != s->d_qk) {
      return invalid(op, "extra_k_cache: format ", kv_format_name(extra.format), " holds d_qk ",
                     extra.d_qk, " but q has d_qk ", s->d_qk);
    }
    if (!a.extra_indices.defined()) {
      return invalid(op, "extra_indices: required when extra_k_cache is given");
    }
    OPENMLA_RETURN_IF_ERROR(check_tensor(a.extra_indices, 3, DType::kInt32, dev, op, "extra_indices"));
    OPENMLA_RETURN_IF_ERROR(check_dim(a.extra_indices, 0, s->batch, op, "extra_indices", "0 (batch)"));
    OPENMLA_RETURN_IF_ERROR(check_dim(a.extra_indices, 1, s->s_q, op, "extra_indices", "1 (s_q)"));
    s->extra_topk = a.extra_indices.shape[2];
    OPENMLA_RETURN_IF_ERROR(
        check_optional_lengths(a.extra_topk_length, s->batch, dev, op, "extra_topk_length"));
  } else if (a.extra_indices.defined() || a.extra_topk_length.defined()) {
    return invalid(op, a.extra_indices.defined() ? "extra_indices" : "extra_topk_length",
                   ": given without extra_k_cache");
  }
  OPENMLA_RETURN_IF_ERROR(check_optional_sink(a.attn_sink, s->h_q, dev, op));

  OPENMLA_RETURN_IF_ERROR(check_tensor(a.out, 4, DType::kBF16, dev, op, "out"));
  OPENMLA_RETURN_IF_ERROR(check_last_dim_contiguous(a.out, op, "out"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.out, 0, s->batch, op, "out", "0 (batch)"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.out, 1, s->s_q, op, "out", "1 (s_q)"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.out, 2, s->h_q, op, "out", "2 (h_q)"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.out, 3, a.d_v, op, "out", "3 (d_v)"));
  OPENMLA_RETURN_IF_ERROR(check_tensor(a.lse, 3, DType::kFP32, dev, op, "lse"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.lse, 0, s->batch, op, "lse", "0 (batch)"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.lse, 1, s->h_q, op, "lse", "1 (h_q)"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.lse, 2, s->s_q, op, "lse", "2 (s_q)"));
  if (a.max_logits.defined()) {
    OPENMLA_RETURN_IF_ERROR(check_tensor(a.max_logits, 3, DType::kFP32, dev, op, "max_logits"));
    OPENMLA_RETURN_IF_ERROR(check_dim(a.max_logits, 0, s->batch, op, "max_logits", "0 (batch)"));
    OPENMLA_RETURN_IF_ERROR(check_dim(a.max_logits, 1, s->h_q, op, "max_logits", "1 (h_q)"));
    OPENMLA_RETURN_IF_ERROR(check_dim(a.max_logits, 2, s->s_q, op, "max_logits", "2 (s_q)"));
  }
  OPENMLA_RETURN_IF_ERROR(check_schedule(a.schedule, s->batch, dev, op));
  s->softmax_scale = resolve_scale(a.softmax_scale, s->d_qk);
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
Status validate_sparse_prefill(const SparsePrefillArgs& a, SparsePrefillShape* s) {
  const char* op = "sparse_prefill";
  OPENMLA_RETURN_IF_ERROR(check_required(a.q, op, "q"));
  OPENMLA_RETURN_IF_ERROR(check_rank(a.q, 3, op, "q"));
  OPENMLA_RETURN_IF_ERROR(check_dtype(a.q, DType::kBF16, op, "q"));
  OPENMLA_RETURN_IF_ERROR(check_last_dim_contiguous(a.q, op, "q"));
  const Device dev = a.q.device;
  s->device = dev;
  s->s_q = a.q.shape[0];
  s->h_q = a.q.shape[1];
  s->d_qk = a.q.shape[2];
  s->d_v = a.d_v;
  if (s->h_q < 1) return invalid(op, "q: expected h_q (dim 1) >= 1, got ", s->h_q);
  OPENMLA_RETURN_IF_ERROR(check_d_qk(s->d_qk, op, "q"));
  OPENMLA_RETURN_IF_ERROR(check_d_v(a.d_v, op));
  if (a.fp8_tensor_cores) {
    // The FP8 path's kernel reads its keys from a paged cache, and its tiles are built for
    // V = 512 dims and a 64-dim RoPE part (d_qk 576 or 512); spelt out here so that a
    // wider check_d_qk / check_d_v never lets another size through to it.
    if (!a.kv_cache.defined()) {
      return invalid(op, "fp8_tensor_cores: needs the keys in kv_cache (a paged cache), got ",
                     a.kv.defined() ? "kv rows" : "no kv_cache");
    }
    if (a.d_v != 512) return invalid(op, "d_v: expected 512 with fp8_tensor_cores, got ", a.d_v);
    if (s->d_qk != 576 && s->d_qk != 512) {
      return invalid(op, "q: expected head dim 576 or 512 with fp8_tensor_cores, got ", s->d_qk);
    }
  }

  if (a.kv_cache.defined()) {
    // Keys straight from a paged cache: one kv head, indices name cache slots.
    if (a.kv.defined()) return invalid(op, "kv: given together with kv_cache (pass one of them)");
    OPENMLA_RETURN_IF_ERROR(check_cache(a.kv_cache, dev, op, "kv_cache"));
    const KVFormatInfo info = kv_format_info(a.kv_cache.layout.format, a.kv_cache.layout.d_qk);
    if (info.d_qk != s->d_qk) {
      return invalid(op, "kv_cache: format ", kv_format_name(info.format), " holds d_qk ",
                     info.d_qk, " but q has d_qk ", s->d_qk);
    }
    if (a.fp8_tensor_cores && !info.quantized()) {
      return invalid(op, "fp8_tensor_cores: kv_cache holds ", kv_format_name(info.format),
                     " keys; the FP8 path reads quantised caches (fp8_v32, fp8_model1, fp8_mx, "
                     "fp4)");
    }
    s->s_kv = a.kv_cache.num_tokens();
    s->h_kv = 1;
  } else {
    OPENMLA_RETURN_IF_ERROR(check_tensor(a.kv, 3, DType::kBF16, dev, op, "kv"));
    OPENMLA_RETURN_IF_ERROR(check_last_dim_contiguous(a.kv, op, "kv"));
    OPENMLA_RETURN_IF_ERROR(check_dim(a.kv, 2, s->d_qk, op, "kv", "2 (d_qk, as q)"));
    s->s_kv = a.kv.shape[0];
    s->h_kv = a.kv.shape[1];
    if (s->h_kv < 1 || s->h_q % s->h_kv != 0) {
      return invalid(op, "kv: expected h_kv (dim 1) >= 1 dividing h_q = ", s->h_q, ", got ",
                     s->h_kv);
    }
  }
  OPENMLA_RETURN_IF_ERROR(check_tensor(a.indices, 3, DType::kInt32, dev, op, "indices"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.indices, 0, s->s_q, op, "indices", "0 (s_q)"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.indices, 1, s->h_kv, op, "indices", "1 (h_kv)"));
  s->topk = a.indices.shape[2];
  OPENMLA_RETURN_IF_ERROR(check_optional_lengths(a.topk_length, s->s_q, dev, op, "topk_length"));
  OPENMLA_RETURN_IF_ERROR(check_optional_sink(a.attn_sink, s->h_q, dev, op));

  OPENMLA_RETURN_IF_ERROR(check_tensor(a.out, 3, DType::kBF16, dev, op, "out"));
  OPENMLA_RETURN_IF_ERROR(check_last_dim_contiguous(a.out, op, "out"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.out, 0, s->s_q, op, "out", "0 (s_q)"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.out, 1, s->h_q, op, "out", "1 (h_q)"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.out, 2, a.d_v, op, "out", "2 (d_v)"));
  for (const char* name : {"max_logits", "lse"}) {
    const TensorView& t = name[0] == 'm' ? a.max_logits : a.lse;
    OPENMLA_RETURN_IF_ERROR(check_tensor(t, 2, DType::kFP32, dev, op, name));
    OPENMLA_RETURN_IF_ERROR(check_dim(t, 0, s->s_q, op, name, "0 (s_q)"));
    OPENMLA_RETURN_IF_ERROR(check_dim(t, 1, s->h_q, op, name, "1 (h_q)"));
  }
  s->softmax_scale = resolve_scale(a.softmax_scale, s->d_qk);
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
Status validate_merge_states(const MergeStatesArgs& a, MergeStatesShape* s) {
  const char* op = "merge_attention_states";
  OPENMLA_RETURN_IF_ERROR(check_required(a.part_out, op, "part_out"));
  OPENMLA_RETURN_IF_ERROR(check_rank(a.part_out, 4, op, "part_out"));
  OPENMLA_RETURN_IF_ERROR(check_dtype_one_of(a.part_out, {DType::kFP32, DType::kBF16, DType::kFP16},
                                             op, "part_out"));
  OPENMLA_RETURN_IF_ERROR(check_last_dim_contiguous(a.part_out, op, "part_out"));
  const Device dev = a.part_out.device;
  s->device = dev;
  s->num_parts = a.part_out.shape[0];
  s->tokens = a.part_out.shape[1];
  s->heads = a.part_out.shape[2];
  s->d_v = a.part_out.shape[3];
  if (s->num_parts < 1) return invalid(op, "part_out: expected at least 1 part (dim 0), got ", s->num_parts);
  OPENMLA_RETURN_IF_ERROR(check_tensor(a.part_lse, 3, DType::kFP32, dev, op, "part_lse"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.part_lse, 0, s->num_parts, op, "part_lse", "0 (parts)"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.part_lse, 1, s->tokens, op, "part_lse", "1 (tokens)"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.part_lse, 2, s->heads, op, "part_lse", "2 (heads)"));
  OPENMLA_RETURN_IF_ERROR(check_required(a.out, op, "out"));
  OPENMLA_RETURN_IF_ERROR(check_rank(a.out, 3, op, "out"));
  OPENMLA_RETURN_IF_ERROR(
      check_dtype_one_of(a.out, {DType::kFP32, DType::kBF16, DType::kFP16}, op, "out"));
  OPENMLA_RETURN_IF_ERROR(check_device(a.out, dev, op, "out"));
  OPENMLA_RETURN_IF_ERROR(check_last_dim_contiguous(a.out, op, "out"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.out, 0, s->tokens, op, "out", "0 (tokens)"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.out, 1, s->heads, op, "out", "1 (heads)"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.out, 2, s->d_v, op, "out", "2 (d_v)"));
  if (a.lse.defined()) {
    OPENMLA_RETURN_IF_ERROR(check_tensor(a.lse, 2, DType::kFP32, dev, op, "lse"));
    OPENMLA_RETURN_IF_ERROR(check_dim(a.lse, 0, s->tokens, op, "lse", "0 (tokens)"));
    OPENMLA_RETURN_IF_ERROR(check_dim(a.lse, 1, s->heads, op, "lse", "1 (heads)"));
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
namespace {
Status check_slots(const TensorView& t, int64_t n, Device dev, const char* op, const char* arg) {
  OPENMLA_RETURN_IF_ERROR(check_required(t, op, arg));
  OPENMLA_RETURN_IF_ERROR(check_rank(t, 1, op, arg));
  OPENMLA_RETURN_IF_ERROR(check_dtype_one_of(t, {DType::kInt32, DType::kInt64}, op, arg));
  OPENMLA_RETURN_IF_ERROR(check_device(t, dev, op, arg));
  return check_dim(t, 0, n, op, arg, "0 (tokens)");
}


// kv_cache_write and kv_cache_gather: a [n, d_qk] row tensor, a cache, and n slots.
Status validate_token_rows(const char* op, const TensorView& rows, const char* rows_arg,
                           std::initializer_list<DType> row_dtypes, const KVCache& cache,
                           const TensorView& slots, const char* slots_arg, KVCacheWriteShape* s) {
  OPENMLA_RETURN_IF_ERROR(check_required(rows, op, rows_arg));
  OPENMLA_RETURN_IF_ERROR(check_rank(rows, 2, op, rows_arg));
  OPENMLA_RETURN_IF_ERROR(check_dtype_one_of(rows, row_dtypes, op, rows_arg));
  OPENMLA_RETURN_IF_ERROR(check_last_dim_contiguous(rows, op, rows_arg));
  const Device dev = rows.device;
  s->device = dev;
  s->num_tokens = rows.shape[0];
  s->d_qk = rows.shape[1];
  OPENMLA_RETURN_IF_ERROR(check_cache(cache, dev, op, "cache"));
  const KVFormatInfo info = kv_format_info(cache.layout.format, cache.layout.d_qk);
  if (info.d_qk != s->d_qk) {
    return invalid(op, rows_arg, ": expected ", info.d_qk, " dims per token (cache format ",
                   kv_format_name(info.format), "), got ", s->d_qk);
  }
  return check_slots(slots, s->num_tokens, dev, op, slots_arg);
}
}  // namespace

Status validate_kv_cache_write(const KVCacheWriteArgs& a, KVCacheWriteShape* s) {
  return validate_token_rows("kv_cache_write", a.kv, "kv", {DType::kBF16, DType::kFP32}, a.cache,
                             a.slot_mapping, "slot_mapping", s);
}

Status validate_kv_cache_gather(const KVCacheGatherArgs& a, KVCacheWriteShape* s) {
  return validate_token_rows("kv_cache_gather", a.out, "out", {DType::kFP32, DType::kBF16},
                             a.cache, a.slots, "slots", s);
}

// ---------------------------------------------------------------------------------------------
Status validate_decode_schedule(const DecodeScheduleArgs& a, DecodeScheduleShape* s) {
  const char* op = "plan_decode_schedule";
  OPENMLA_RETURN_IF_ERROR(check_required(a.seqlens, op, "seqlens"));
  OPENMLA_RETURN_IF_ERROR(check_rank(a.seqlens, 1, op, "seqlens"));
  OPENMLA_RETURN_IF_ERROR(check_dtype(a.seqlens, DType::kInt32, op, "seqlens"));
  const Device dev = a.seqlens.device;
  s->device = dev;
  s->batch = a.seqlens.shape[0];
  if (a.s_q < 1) return invalid(op, "s_q: expected >= 1, got ", a.s_q);
  if (a.h_q < 1) return invalid(op, "h_q: expected >= 1, got ", a.h_q);
  if (a.h_kv < 1 || a.h_q % a.h_kv != 0) {
    return invalid(op, "h_kv: expected >= 1 dividing h_q = ", a.h_q, ", got ", a.h_kv);
  }
  if (a.block_tokens < 1) return invalid(op, "block_tokens: expected >= 1, got ", a.block_tokens);
  OPENMLA_RETURN_IF_ERROR(check_tensor(a.metadata, 2, DType::kInt32, dev, op, "metadata"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.metadata, 1, kScheduleMetadataInts, op, "metadata", "1"));
  s->num_sm_parts = a.metadata.shape[0];
  if (s->num_sm_parts < 1) return invalid(op, "metadata: expected at least 1 row (num_sm_parts)");
  if (a.num_sm_parts != 0 && a.num_sm_parts != s->num_sm_parts) {
    return invalid(op, "num_sm_parts: expected 0 or metadata's rows (", s->num_sm_parts, "), got ",
                   a.num_sm_parts);
  }
  if (!a.metadata.is_contiguous()) return invalid(op, "metadata: must be contiguous");
  OPENMLA_RETURN_IF_ERROR(check_tensor(a.num_splits, 1, DType::kInt32, dev, op, "num_splits"));
  OPENMLA_RETURN_IF_ERROR(check_dim(a.num_splits, 0, s->batch + 1, op, "num_splits", "0 (batch + 1)"));
  if (!a.num_splits.is_contiguous()) return invalid(op, "num_splits: must be contiguous");
  if (dev.type == DeviceType::kCPU) {
    for (int64_t i = 0; i < s->batch; ++i) {
      if (at1(a.seqlens, i) < 0) return invalid(op, "seqlens[", i, "]: expected >= 0, got ", at1(a.seqlens, i));
    }
  }
  return Status::Ok();
}

}  // namespace openmla::core
