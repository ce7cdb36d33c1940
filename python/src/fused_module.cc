// openmla._C's functions for the fused norm-rope-attention-rope-cast operations
// (include/openmla/fused_attention.h): fused_prefill, fused_decode, fused_out_sf_layout and
// fused_workspace_size. Registered by module.cc; outputs and the workspace (CUDA:
// fused_workspace_size bytes, uint8) are passed in, allocated by the Python layer.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

#include "convert.h"
#include "openmla/fused_attention.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace openmla::python {
namespace {

using OptArray = std::optional<Array>;
using OptString = std::optional<std::string>;

template <typename Call>
void run(Call&& call) {
  Status status;
  {
    nb::gil_scoped_release release;
    status = call();
  }
  throw_if_error(status);
}

FusedNormRopeCast settings(bool enable_q_norm, float rms_norm_eps, const Array& token_positions,
                           bool is_rope_neox_style, int rope_dim, const Array& cos_sin_cache,
                           int n_wv_group, int num_per_channels, bool use_tma_aligned_col_major_sf,
                           bool round_sf, bool use_packed_ue8m0, const char* op) {
  FusedNormRopeCast f;
  f.enable_q_norm = enable_q_norm;
  f.rms_norm_eps = rms_norm_eps;
  f.token_positions = to_view(token_positions, op, "token_positions");
  f.is_rope_neox_style = is_rope_neox_style;
  f.rope_dim = rope_dim;
  f.cos_sin_cache = to_view(cos_sin_cache, op, "cos_sin_cache");
  f.n_wv_group = n_wv_group;
  f.num_per_channels = num_per_channels;
  f.use_tma_aligned_col_major_sf = use_tma_aligned_col_major_sf;
  f.round_sf = round_sf;
  f.use_packed_ue8m0 = use_packed_ue8m0;
  return f;
}

void fused_prefill_py(const Array& q, const Array& kv, const Array& indices, const Array& out_fp8,
                      const Array& out_sf, const Array& max_logits, const Array& lse,
                      bool enable_q_norm, float rms_norm_eps, const Array& token_positions,
                      bool is_rope_neox_style, int rope_dim, const Array& cos_sin_cache,
                      int n_wv_group, int num_per_channels, bool use_tma_aligned_col_major_sf,
                      bool round_sf, bool use_packed_ue8m0, const OptArray& topk_length,
                      const OptArray& attn_sink, int d_v, float softmax_scale,
                      const OptArray& workspace, uintptr_t stream) {
  const char* op = "fused_norm_rope_attn_rope_cast.prefill";
  FusedPrefillArgs a;
  a.fused = settings(enable_q_norm, rms_norm_eps, token_positions, is_rope_neox_style, rope_dim,
                     cos_sin_cache, n_wv_group, num_per_channels, use_tma_aligned_col_major_sf,
                     round_sf, use_packed_ue8m0, op);
  a.q = to_view(q, op, "q");
  a.kv = to_view(kv, op, "kv");
  a.indices = to_view(indices, op, "indices");
  a.topk_length = to_optional_view(topk_length, op, "topk_length");
  a.attn_sink = to_optional_view(attn_sink, op, "attn_sink");
  a.d_v = d_v;
  a.softmax_scale = softmax_scale;
  a.out_fp8 = to_view(out_fp8, op, "out_fp8");
  a.out_sf = to_view(out_sf, op, "out_sf");
  a.max_logits = to_view(max_logits, op, "max_logits");
  a.lse = to_view(lse, op, "lse");
  a.workspace = to_workspace(workspace, op);
  run([&] { return fused_norm_rope_attn_rope_cast_prefill(a, to_stream(stream)); });
}

void fused_decode_py(const Array& q, const Array& k_cache, const Array& indices,
                     const Array& out_fp8, const Array& out_sf, const Array& lse,
                     bool enable_q_norm, float rms_norm_eps, const Array& token_positions,
                     bool is_rope_neox_style, int rope_dim, const Array& cos_sin_cache,
                     int n_wv_group, int num_per_channels, bool use_tma_aligned_col_major_sf,
                     bool round_sf, bool use_packed_ue8m0, const OptString& k_cache_format,
                     const std::string& k_cache_layout, const OptArray& topk_length,
                     const OptArray& extra_k_cache, const OptString& extra_k_cache_format,
                     const std::string& extra_k_cache_layout, const OptArray& extra_indices,
                     const OptArray& extra_topk_length, const OptArray& attn_sink, int d_v,
                     float softmax_scale, const OptArray& workspace, uintptr_t stream,
                     bool batch_invariant) {
  const char* op = "fused_norm_rope_attn_rope_cast.decode";
  FusedDecodeArgs a;
  a.batch_invariant = batch_invariant;
  a.fused = settings(enable_q_norm, rms_norm_eps, token_positions, is_rope_neox_style, rope_dim,
                     cos_sin_cache, n_wv_group, num_per_channels, use_tma_aligned_col_major_sf,
                     round_sf, use_packed_ue8m0, op);
  a.q = to_view(q, op, "q");
  a.k_cache = to_kv_cache(k_cache, k_cache_format, k_cache_layout, op, "k_cache");
  a.indices = to_view(indices, op, "indices_in_kvcache");
  a.topk_length = to_optional_view(topk_length, op, "topk_length");
  if (extra_k_cache) {
    a.extra_k_cache = to_kv_cache(*extra_k_cache, extra_k_cache_format, extra_k_cache_layout, op,
                                  "extra_k_cache");
  }
  a.extra_indices = to_optional_view(extra_indices, op, "extra_indices_in_kvcache");
  a.extra_topk_length = to_optional_view(extra_topk_length, op, "extra_topk_length");
  a.attn_sink = to_optional_view(attn_sink, op, "attn_sink");
  a.d_v = d_v;
  a.softmax_scale = softmax_scale;
  a.out_fp8 = to_view(out_fp8, op, "out_fp8");
  a.out_sf = to_view(out_sf, op, "out_sf");
  a.lse = to_view(lse, op, "lse");
  a.workspace = to_workspace(workspace, op);
  run([&] { return fused_norm_rope_attn_rope_cast_decode(a, to_stream(stream)); });
}

// ((shape), (strides in int32 elements), storage_ints) of out_sf.
std::tuple<std::tuple<int64_t, int64_t, int64_t>, std::tuple<int64_t, int64_t, int64_t>, int64_t>
fused_out_sf_layout_py(int64_t s_q, int64_t n_wv_group, int64_t wv_group_size, int64_t d_v) {
  FusedOutSfLayout l;
  throw_if_error(fused_out_sf_layout(s_q, n_wv_group, wv_group_size, d_v, &l));
  return {{l.shape[0], l.shape[1], l.shape[2]}, {l.strides[0], l.strides[1], l.strides[2]},
          l.storage_ints};
}

// Bytes of workspace either operation needs for s_q tokens of h_q heads on the device (0 on
// the CPU).
size_t fused_workspace_size_py(const std::string& device_type, int device_index, int64_t s_q,
                               int64_t h_q) {
  const char* op = "fused_workspace_size";
  const auto check = [op](const char* name, int64_t value) {
    if (value < 0) {
      throw_value_error(std::string(op) + ": " + name + ": expected >= 0, got " +
                        std::to_string(value));
    }
  };
  check("s_q", s_q);
  check("h_q", h_q);
  return fused_norm_rope_attn_rope_cast_workspace_size(parse_device(device_type, device_index, op),
                                                       s_q, h_q);
}

}  // namespace

void register_fused(nb::module_& m) {
  m.def("fused_prefill", &fused_prefill_py, "q"_a, "kv"_a, "indices"_a, "out_fp8"_a, "out_sf"_a,
        "max_logits"_a, "lse"_a, "enable_q_norm"_a, "rms_norm_eps"_a, "token_positions"_a,
        "is_rope_neox_style"_a, "rope_dim"_a, "cos_sin_cache"_a, "n_wv_group"_a,
        "num_per_channels"_a, "use_tma_aligned_col_major_sf"_a, "round_sf"_a,
        "use_packed_ue8m0"_a, "topk_length"_a = nb::none(), "attn_sink"_a = nb::none(),
        "d_v"_a = 512, "softmax_scale"_a = 0.f, "workspace"_a = nb::none(), "stream"_a = 0);
  m.def("fused_decode", &fused_decode_py, "q"_a, "k_cache"_a, "indices"_a, "out_fp8"_a,
        "out_sf"_a, "lse"_a, "enable_q_norm"_a, "rms_norm_eps"_a, "token_positions"_a,
        "is_rope_neox_style"_a, "rope_dim"_a, "cos_sin_cache"_a, "n_wv_group"_a,
        "num_per_channels"_a, "use_tma_aligned_col_major_sf"_a, "round_sf"_a,
        "use_packed_ue8m0"_a, "k_cache_format"_a = nb::none(), "k_cache_layout"_a = "default",
        "topk_length"_a = nb::none(), "extra_k_cache"_a = nb::none(),
        "extra_k_cache_format"_a = nb::none(), "extra_k_cache_layout"_a = "default",
        "extra_indices"_a = nb::none(), "extra_topk_length"_a = nb::none(),
        "attn_sink"_a = nb::none(), "d_v"_a = 512, "softmax_scale"_a = 0.f,
        "workspace"_a = nb::none(), "stream"_a = 0, "batch_invariant"_a = false);
  m.def("fused_out_sf_layout", &fused_out_sf_layout_py, "s_q"_a, "n_wv_group"_a,
        "wv_group_size"_a, "d_v"_a);
  m.def("fused_workspace_size", &fused_workspace_size_py, "device_type"_a, "device_index"_a,
        "s_q"_a, "h_q"_a);
}

}  // namespace openmla::python
