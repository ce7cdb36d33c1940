#include "core/validate_mha.h"

#include <cmath>
#include <cstdint>

#include "core/str_cat.h"
#include "core/validate.h"

namespace openmla::core {
namespace {

template <typename... Parts>
Status invalid(const char* op, const Parts&... parts) {
  return Status::InvalidArgument(str_cat(op, ": ", parts...));
}

// A required tensor: present, rank `rank`, sane sizes, on `device`.
Status check_present(const TensorView& t, int rank, Device device, const char* op,
                     const char* arg) {
  if (!t.defined()) return invalid(op, arg, ": required tensor is missing");
  OPENMLA_RETURN_IF_ERROR(check_rank(t, rank, op, arg));
  for (int d = 0; d < t.rank; ++d) {
    if (t.shape[d] < 0) return invalid(op, arg, ": negative size in shape ", t.shape_string());
  }
  if (t.data == nullptr && t.numel() > 0) return invalid(op, arg, ": data pointer is null");
  return check_device(t, device, op, arg);
}

// A [n, heads, dim] token tensor of `dtype` with a contiguous last dim.
Status check_tokens(const TensorView& t, DType dtype, int64_t n, int64_t heads, int64_t dim,
                    Device device, const char* op, const char* arg, const char* n_name,
                    const char* heads_name, const char* dim_name) {
  OPENMLA_RETURN_IF_ERROR(check_present(t, 3, device, op, arg));
  OPENMLA_RETURN_IF_ERROR(check_dtype(t, dtype, op, arg));
  OPENMLA_RETURN_IF_ERROR(check_dim(t, 0, n, op, arg, n_name));
  OPENMLA_RETURN_IF_ERROR(check_dim(t, 1, heads, op, arg, heads_name));
  OPENMLA_RETURN_IF_ERROR(check_dim(t, 2, dim, op, arg, dim_name));
  return check_last_dim_contiguous(t, op, arg);
}

// A gradient: like check_tokens, of q's dtype or fp32.
Status check_grad(const TensorView& t, DType q_dtype, int64_t n, int64_t heads, int64_t dim,
                  Device device, const char* op, const char* arg, const char* n_name,
                  const char* heads_name, const char* dim_name) {
  if (t.defined() && t.dtype != q_dtype && t.dtype != DType::kFP32) {
    return invalid(op, arg, ": expected dtype ", dtype_name(q_dtype), " (q's dtype) or fp32, got ",
                   dtype_name(t.dtype));
  }
  return check_tokens(t, t.defined() ? t.dtype : q_dtype, n, heads, dim, device, op, arg, n_name,
                      heads_name, dim_name);
}

Status check_lse(const TensorView& t, int64_t total_q, int64_t h_q, Device device, const char* op) {
  OPENMLA_RETURN_IF_ERROR(check_present(t, 2, device, op, "lse"));
  OPENMLA_RETURN_IF_ERROR(check_dtype(t, DType::kFP32, op, "lse"));
  OPENMLA_RETURN_IF_ERROR(check_dim(t, 0, total_q, op, "lse", "0 (total_q)"));
  return check_dim(t, 1, h_q, op, "lse", "1 (h_q)");
}

// cu_seqlens [b + 1] int32 (shape), and on the CPU its values: 0 first, non-decreasing, the
// last equal to `total`, each length at most `max_seqlen`.
Status check_cu_seqlens(const TensorView& t, int64_t entries, int64_t total, int64_t max_seqlen,
                        Device device, const char* op, const char* arg, const char* total_name,
                        const char* max_name) {
  OPENMLA_RETURN_IF_ERROR(check_present(t, 1, device, op, arg));
  OPENMLA_RETURN_IF_ERROR(check_dtype(t, DType::kInt32, op, arg));
  if (t.shape[0] != entries) {
    return invalid(op, arg, ": expected ", entries, " entries (b + 1, as cu_seqlens_q), got ",
                   t.shape[0]);
  }
  if (device.type != DeviceType::kCPU) return Status::Ok();
  const int32_t* v = t.data_as<const int32_t>();
  const int64_t stride = t.strides[0];
  if (v[0] != 0) return invalid(op, arg, "[0]: expected 0, got ", v[0]);
  for (int64_t i = 0; i + 1 < entries; ++i) {
    const int64_t lo = v[i * stride], hi = v[(i + 1) * stride];
    if (hi < lo) {
      return invalid(op, arg, ": expected non-decreasing values, got ", arg, "[", i, "] = ", lo,
                     " > ", arg, "[", i + 1, "] = ", hi);
    }
    if (hi - lo > max_seqlen) {
      return invalid(op, arg, ": sequence ", i, " has length ", hi - lo, " (", arg, "[", i + 1,
                     "] - ", arg, "[", i, "]), above ", max_name, " = ", max_seqlen);
    }
  }
  const int64_t last = v[(entries - 1) * stride];
  if (last != total) {
    return invalid(op, arg, "[", entries - 1, "]: expected ", total, " (", total_name,
                   ", the tokens in the tensors), got ", last);
  }
  return Status::Ok();
}

// The arguments forward and backward share: q, k, v, cu_seqlens, the max lengths and the scale.
Status check_inputs(const char* op, const TensorView& q, const TensorView& k, const TensorView& v,
                    const TensorView& cu_q, const TensorView& cu_kv, int64_t max_q, int64_t max_kv,
                    float softmax_scale, MhaPrefillShape* s) {
  OPENMLA_RETURN_IF_ERROR(
      check_present(q, 3, q.defined() ? q.device : Device::cpu(), op, "q"));
  if (q.dtype != DType::kBF16 && q.dtype != DType::kFP16) {
    return invalid(op, "q: expected dtype bf16 or fp16, got ", dtype_name(q.dtype));
  }
  OPENMLA_RETURN_IF_ERROR(check_last_dim_contiguous(q, op, "q"));
  const Device dev = q.device;
  s->device = dev;
  s->total_q = q.shape[0];
  s->h_q = q.shape[1];
  s->d_qk = q.shape[2];
  if (s->h_q < 1) return invalid(op, "q: expected h_q (dim 1) >= 1, got ", s->h_q);
  if (s->d_qk != 192 && s->d_qk != 128) {
    return invalid(op, "q: expected head dim d_qk (dim 2) 192 or 128, got ", s->d_qk);
  }

  OPENMLA_RETURN_IF_ERROR(check_present(k, 3, dev, op, "k"));
  OPENMLA_RETURN_IF_ERROR(check_dtype(k, q.dtype, op, "k"));
  s->total_kv = k.shape[0];
  s->h_kv = k.shape[1];
  if (s->h_kv < 1 || s->h_q % s->h_kv != 0) {
    return invalid(op, "k: expected h_kv (dim 1) >= 1 dividing h_q = ", s->h_q, ", got ",
                   s->h_kv);
  }
  OPENMLA_RETURN_IF_ERROR(check_dim(k, 2, s->d_qk, op, "k", "2 (d_qk, as q)"));
  OPENMLA_RETURN_IF_ERROR(check_last_dim_contiguous(k, op, "k"));

  OPENMLA_RETURN_IF_ERROR(check_present(v, 3, dev, op, "v"));
  OPENMLA_RETURN_IF_ERROR(check_dtype(v, q.dtype, op, "v"));
  OPENMLA_RETURN_IF_ERROR(check_dim(v, 0, s->total_kv, op, "v", "0 (total_kv, as k)"));
  OPENMLA_RETURN_IF_ERROR(check_dim(v, 1, s->h_kv, op, "v", "1 (h_kv, as k)"));
  s->d_v = v.shape[2];
  if (s->d_v != 128) return invalid(op, "v: expected head dim d_v (dim 2) 128, got ", s->d_v);
  OPENMLA_RETURN_IF_ERROR(check_last_dim_contiguous(v, op, "v"));

  if (max_q < 0) return invalid(op, "max_seqlen_q: expected >= 0, got ", max_q);
  if (max_kv < 0) return invalid(op, "max_seqlen_kv: expected >= 0, got ", max_kv);
  s->max_seqlen_q = max_q;
  s->max_seqlen_kv = max_kv;
  OPENMLA_RETURN_IF_ERROR(check_present(cu_q, 1, dev, op, "cu_seqlens_q"));
  if (cu_q.shape[0] < 1) {
    return invalid(op, "cu_seqlens_q: expected b + 1 >= 1 entries, got ", cu_q.shape[0]);
  }
  s->batch = cu_q.shape[0] - 1;
  OPENMLA_RETURN_IF_ERROR(check_cu_seqlens(cu_q, s->batch + 1, s->total_q, max_q, dev, op,
                                           "cu_seqlens_q", "total_q", "max_seqlen_q"));
  OPENMLA_RETURN_IF_ERROR(check_cu_seqlens(cu_kv, s->batch + 1, s->total_kv, max_kv, dev, op,
                                           "cu_seqlens_kv", "total_kv", "max_seqlen_kv"));

  if (!(softmax_scale <= 0.f) && !std::isfinite(softmax_scale)) {  // NaN or +inf
    return invalid(op, "softmax_scale: expected a finite value (<= 0: 1/sqrt(d_qk)), got ",
                   softmax_scale);
  }
  s->softmax_scale =
      softmax_scale > 0.f ? softmax_scale : 1.f / std::sqrt(static_cast<float>(s->d_qk));
  return Status::Ok();
}

}  // namespace

Status validate_mha_prefill(const MhaPrefillArgs& a, MhaPrefillShape* s) {
  const char* op = "mha_prefill";
  OPENMLA_RETURN_IF_ERROR(check_inputs(op, a.q, a.k, a.v, a.cu_seqlens_q, a.cu_seqlens_kv,
                                       a.max_seqlen_q, a.max_seqlen_kv, a.softmax_scale, s));
  OPENMLA_RETURN_IF_ERROR(check_tokens(a.out, a.q.dtype, s->total_q, s->h_q, s->d_v, s->device, op,
                                       "out", "0 (total_q)", "1 (h_q)", "2 (d_v)"));
  return check_lse(a.lse, s->total_q, s->h_q, s->device, op);
}

Status validate_mha_prefill_backward(const MhaPrefillBackwardArgs& a, MhaPrefillShape* s) {
  const char* op = "mha_prefill_backward";
  OPENMLA_RETURN_IF_ERROR(check_inputs(op, a.q, a.k, a.v, a.cu_seqlens_q, a.cu_seqlens_kv,
                                       a.max_seqlen_q, a.max_seqlen_kv, a.softmax_scale, s));
  const DType dt = a.q.dtype;
  const Device dev = s->device;
  OPENMLA_RETURN_IF_ERROR(check_tokens(a.dout, dt, s->total_q, s->h_q, s->d_v, dev, op, "dout",
                                       "0 (total_q)", "1 (h_q)", "2 (d_v)"));
  OPENMLA_RETURN_IF_ERROR(check_tokens(a.out, dt, s->total_q, s->h_q, s->d_v, dev, op, "out",
                                       "0 (total_q)", "1 (h_q)", "2 (d_v)"));
  OPENMLA_RETURN_IF_ERROR(check_lse(a.lse, s->total_q, s->h_q, dev, op));
  OPENMLA_RETURN_IF_ERROR(check_grad(a.dq, dt, s->total_q, s->h_q, s->d_qk, dev, op, "dq",
                                     "0 (total_q)", "1 (h_q)", "2 (d_qk)"));
  OPENMLA_RETURN_IF_ERROR(check_grad(a.dk, dt, s->total_kv, s->h_kv, s->d_qk, dev, op, "dk",
                                     "0 (total_kv)", "1 (h_kv)", "2 (d_qk)"));
  return check_grad(a.dv, dt, s->total_kv, s->h_kv, s->d_v, dev, op, "dv", "0 (total_kv)",
                    "1 (h_kv)", "2 (d_v)");
}

}  // namespace openmla::core
