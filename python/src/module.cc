// openmla._C: the nanobind extension. Each function translates its arrays into the C++ API's
// views (convert.h), fills the operation's arguments struct, releases the GIL, calls the
// operation on `stream` (an integer cudaStream_t, 0 = the default stream; ignored on the CPU) and
// raises the Status's exception. Outputs are passed in; the Python layer allocates them.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "convert.h"
#include "openmla/openmla.h"
#if __has_include("openmla/kv_convert.h")
#include "openmla/kv_convert.h"
#define OPENMLA_PYTHON_HAS_KV_CONVERT 1
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace openmla::python {

// Dense MHA prefill's functions (python/src/mha_prefill.cc).
void register_mha_prefill(nb::module_& m);

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

DecodeSchedule to_schedule(const OptArray& metadata, const OptArray& num_splits, const char* op) {
  DecodeSchedule schedule;
  schedule.metadata = to_optional_view(metadata, op, "schedule.metadata");
  schedule.num_splits = to_optional_view(num_splits, op, "schedule.num_splits");
  return schedule;
}

void dense_decode_py(const Array& q, const Array& k_cache, const Array& block_table,
                     const Array& cache_seqlens, const Array& out, const Array& lse, int d_v,
                     float softmax_scale, bool causal, const OptArray& sched_metadata,
                     const OptArray& sched_num_splits, const OptArray& workspace,
                     uintptr_t stream, bool as_kv_cache, const OptString& k_cache_format,
                     const std::string& k_cache_layout) {
  const char* op = "dense_decode";
  DenseDecodeArgs a;
  a.q = to_view(q, op, "q");
  if (as_kv_cache) {  // a paged cache of any format (DenseDecodeArgs::kv_cache)
    a.kv_cache = to_kv_cache(k_cache, k_cache_format, k_cache_layout, op, "k_cache");
  } else {
    a.k_cache = to_view(k_cache, op, "k_cache");
  }
  a.block_table = to_view(block_table, op, "block_table");
  a.cache_seqlens = to_view(cache_seqlens, op, "cache_seqlens");
  a.d_v = d_v;
  a.softmax_scale = softmax_scale;
  a.causal = causal;
  a.schedule = to_schedule(sched_metadata, sched_num_splits, op);
  a.out = to_view(out, op, "out");
  a.lse = to_view(lse, op, "lse");
  a.workspace = to_workspace(workspace, op);
  run([&] { return dense_decode(a, to_stream(stream)); });
}

void sparse_decode_py(const Array& q, const Array& k_cache, const Array& indices, const Array& out,
                      const Array& lse, const OptString& k_cache_format,
                      const std::string& k_cache_layout, const OptArray& topk_length,
                      const OptArray& extra_k_cache, const OptString& extra_k_cache_format,
                      const std::string& extra_k_cache_layout, const OptArray& extra_indices,
                      const OptArray& extra_topk_length, const OptArray& attn_sink, int d_v,
                      float softmax_scale, const OptArray& sched_metadata,
                      const OptArray& sched_num_splits, const OptArray& workspace,
                      uintptr_t stream, bool batch_invariant) {
  const char* op = "sparse_decode";
  SparseDecodeArgs a;
  a.batch_invariant = batch_invariant;
  a.q = to_view(q, op, "q");
  a.k_cache = to_kv_cache(k_cache, k_cache_format, k_cache_layout, op, "k_cache");
  a.indices = to_view(indices, op, "indices");
  a.topk_length = to_optional_view(topk_length, op, "topk_length");
  if (extra_k_cache) {
    a.extra_k_cache = to_kv_cache(*extra_k_cache, extra_k_cache_format, extra_k_cache_layout, op,
                                  "extra_k_cache");
  }
  a.extra_indices = to_optional_view(extra_indices, op, "extra_indices");
  a.extra_topk_length = to_optional_view(extra_topk_length, op, "extra_topk_length");
  a.attn_sink = to_optional_view(attn_sink, op, "attn_sink");
  a.d_v = d_v;
  a.softmax_scale = softmax_scale;
  a.schedule = to_schedule(sched_metadata, sched_num_splits, op);
  a.out = to_view(out, op, "out");
  a.lse = to_view(lse, op, "lse");
  a.workspace = to_workspace(workspace, op);
  run([&] { return sparse_decode(a, to_stream(stream)); });
}

// kv: bf16 rows [s_kv, h_kv, d_qk], or with as_kv_cache a paged cache of any format
// (SparsePrefillArgs::kv_cache; indices then name its slots; fp8_tensor_cores only then).
void sparse_prefill_py(const Array& q, const Array& kv, const Array& indices, const Array& out,
                       const Array& max_logits, const Array& lse, const OptArray& topk_length,
                       const OptArray& attn_sink, int d_v, float softmax_scale,
                       const OptArray& workspace, uintptr_t stream, bool as_kv_cache,
                       const OptString& k_cache_format, const std::string& k_cache_layout,
                       bool fp8_tensor_cores) {
  const char* op = "sparse_prefill";
  SparsePrefillArgs a;
  a.q = to_view(q, op, "q");
  if (as_kv_cache) {
    a.kv_cache = to_kv_cache(kv, k_cache_format, k_cache_layout, op, "k_cache");
  } else {
    a.kv = to_view(kv, op, "kv");
  }
  a.indices = to_view(indices, op, "indices");
  a.topk_length = to_optional_view(topk_length, op, "topk_length");
  a.attn_sink = to_optional_view(attn_sink, op, "attn_sink");
  a.d_v = d_v;
  a.softmax_scale = softmax_scale;
  a.fp8_tensor_cores = fp8_tensor_cores;
  a.out = to_view(out, op, "out");
  a.max_logits = to_view(max_logits, op, "max_logits");
  a.lse = to_view(lse, op, "lse");
  a.workspace = to_workspace(workspace, op);
  run([&] { return sparse_prefill(a, to_stream(stream)); });
}

void merge_attention_states_py(const Array& part_out, const Array& part_lse, const Array& out,
                               const OptArray& lse, uintptr_t stream) {
  const char* op = "merge_attention_states";
  MergeStatesArgs a;
  a.part_out = to_view(part_out, op, "part_out");
  a.part_lse = to_view(part_lse, op, "part_lse");
  a.out = to_view(out, op, "out");
  a.lse = to_optional_view(lse, op, "lse");
  run([&] { return merge_attention_states(a, to_stream(stream)); });
}

void kv_cache_write_py(const Array& kv, const Array& slot_mapping, const Array& cache,
                       const OptString& cache_format, const std::string& cache_layout,
                       uintptr_t stream) {
  const char* op = "kv_cache_write";
  KVCacheWriteArgs a;
  a.kv = to_view(kv, op, "kv");
  a.slot_mapping = to_view(slot_mapping, op, "slot_mapping");
  a.cache = to_kv_cache(cache, cache_format, cache_layout, op, "cache");
  run([&] { return kv_cache_write(a, to_stream(stream)); });
}

void kv_cache_gather_py(const Array& cache, const Array& slots, const Array& out,
                        const OptString& cache_format, const std::string& cache_layout,
                        uintptr_t stream) {
  const char* op = "kv_cache_gather";
  KVCacheGatherArgs a;
  a.cache = to_kv_cache(cache, cache_format, cache_layout, op, "cache");
  a.slots = to_view(slots, op, "slots");
  a.out = to_view(out, op, "out");
  run([&] { return kv_cache_gather(a, to_stream(stream)); });
}

void plan_decode_schedule_py(const Array& seqlens, const Array& metadata, const Array& num_splits,
                             int s_q, int h_q, int h_kv, int num_sm_parts, int block_tokens,
                             uintptr_t stream) {
  const char* op = "plan_decode_schedule";
  DecodeScheduleArgs a;
  a.seqlens = to_view(seqlens, op, "seqlens");
  a.metadata = to_view(metadata, op, "metadata");
  a.num_splits = to_view(num_splits, op, "num_splits");
  a.s_q = s_q;
  a.h_q = h_q;
  a.h_kv = h_kv;
  a.num_sm_parts = num_sm_parts;
  a.block_tokens = block_tokens;
  run([&] { return plan_decode_schedule(a, to_stream(stream)); });
}

#ifdef OPENMLA_PYTHON_HAS_KV_CONVERT
void kv_cache_convert_py(const Array& src, const Array& dst, const OptString& src_format,
                         const std::string& src_layout, const OptString& dst_format,
                         const std::string& dst_layout, const OptArray& src_blocks,
                         const OptArray& dst_blocks, uintptr_t stream) {
  const char* op = "kv_cache_convert";
  KVCacheConvertArgs a;
  a.src = to_kv_cache(src, src_format, src_layout, op, "src");
  a.dst = to_kv_cache(dst, dst_format, dst_layout, op, "dst");
  a.src_blocks = to_optional_view(src_blocks, op, "src_blocks");
  a.dst_blocks = to_optional_view(dst_blocks, op, "dst_blocks");
  run([&] { return kv_cache_convert(a, to_stream(stream)); });
}
#endif

int decode_num_sm_parts_py(const std::string& device_type, int device_index, int s_q, int h_q,
                           int h_kv) {
  const Device device = parse_device(device_type, device_index, "decode_num_sm_parts");
  int num_sm_parts = 0;
  throw_if_error(decode_num_sm_parts(device, s_q, h_q, h_kv, &num_sm_parts));
  return num_sm_parts;
}

void check_non_negative(std::initializer_list<std::pair<const char*, int>> sizes, const char* op) {
  for (const auto& [name, value] : sizes) {
    if (value < 0) {
      throw_value_error(std::string(op) + ": " + name + ": expected >= 0, got " +
                        std::to_string(value));
    }
  }
}

nb::dict format_info_dict(KVFormat format, int d_qk) {
  const KVFormatInfo info = kv_format_info(format, d_qk);
  nb::dict d;
  d["format"] = kv_format_name(info.format);
  d["d_qk"] = info.d_qk;
  d["quantized_dims"] = info.quantized_dims;
  d["rope_dims"] = info.rope_dims;
  d["group_size"] = info.group_size;
  d["num_scales"] = info.num_scales;
  d["data_bytes"] = info.data_bytes;
  d["scale_bytes"] = info.scale_bytes;
  d["rope_bytes"] = info.rope_bytes;
  d["bytes_per_token"] = info.bytes_per_token;
  d["quantized"] = info.quantized();
  return d;
}

nb::dict layout_dict(const KVLayout& layout) {
  nb::dict d;
  d["format"] = kv_format_name(layout.format);
  d["d_qk"] = layout.d_qk;
  d["page_size"] = layout.page_size;
  d["block_stride"] = layout.block_stride;
  d["data_offset"] = layout.data_offset;
  d["data_stride"] = layout.data_stride;
  d["scale_offset"] = layout.scale_offset;
  d["scale_stride"] = layout.scale_stride;
  d["rope_offset"] = layout.rope_offset;
  d["rope_stride"] = layout.rope_stride;
  d["footprint_bytes"] = kv_block_footprint_bytes(layout);
  return d;
}

int check_d_qk_arg(int d_qk, const char* op) {
  if (d_qk != 576 && d_qk != 512) {
    throw_value_error(std::string(op) + ": d_qk: expected 576 or 512, got " + std::to_string(d_qk));
  }
  return d_qk;
}

// Reinterprets an array's memory as another dtype of the same item size (numpy has no bf16:
// a uint16 view of an ml_dtypes.bfloat16 array becomes a DLPack bf16 array).
nb::ndarray<> reinterpret_py(nb::object owner, const std::string& dtype_name_arg) {
  Array array;
  if (!nb::try_cast<Array>(owner, array)) {
    throw_type_error("reinterpret: array: expected a DLPack or buffer-protocol array");
  }
  nb::dlpack::dtype dt;
  if (dtype_name_arg == "bf16") {
    dt = nb::dtype<uint16_t>(), dt.code = static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat);
  } else if (dtype_name_arg == "fp16") {
    dt = nb::dtype<uint16_t>(), dt.code = static_cast<uint8_t>(nb::dlpack::dtype_code::Float);
  } else if (dtype_name_arg == "uint8") {
    dt = nb::dtype<uint8_t>();
  } else {
    throw_value_error("reinterpret: dtype: expected 'bf16', 'fp16' or 'uint8', got '" +
                      dtype_name_arg + "'");
  }
  if (array.itemsize() != dt.bits / 8u) {
    throw_value_error("reinterpret: the array's items are " + std::to_string(array.itemsize()) +
                      " bytes, but " + dtype_name_arg + " items are " +
                      std::to_string(dt.bits / 8) + " bytes");
  }
  std::vector<size_t> shape(array.ndim());
  for (size_t i = 0; i < array.ndim(); ++i) shape[i] = array.shape(i);
  return nb::ndarray<>(const_cast<void*>(static_cast<const void*>(array.data())), array.ndim(),
                       shape.data(), owner, array.stride_ptr(), dt, array.device_type(),
                       array.device_id());
}

}  // namespace
// fused_module.cc: the fused norm-rope-attention-rope-cast operations.
void register_fused(nb::module_& m);

}  // namespace openmla::python

NB_MODULE(_C, m) {
  using namespace openmla;
  using namespace openmla::python;
  m.doc() = "OpenMLA's C++ API over DLPack arrays (outputs are passed in; see openmla._api).";
  m.attr("__version__") = OPENMLA_VERSION_STRING;
  m.attr("SCHEDULE_METADATA_INTS") = kScheduleMetadataInts;

  m.def("dense_decode", &dense_decode_py, "q"_a, "k_cache"_a, "block_table"_a, "cache_seqlens"_a,
        "out"_a, "lse"_a, "d_v"_a = 512, "softmax_scale"_a = 0.f, "causal"_a = false,
        "sched_metadata"_a = nb::none(), "sched_num_splits"_a = nb::none(),
        "workspace"_a = nb::none(), "stream"_a = 0, "as_kv_cache"_a = false,
        "k_cache_format"_a = nb::none(), "k_cache_layout"_a = "default");
  m.def("sparse_decode", &sparse_decode_py, "q"_a, "k_cache"_a, "indices"_a, "out"_a, "lse"_a,
        "k_cache_format"_a = nb::none(), "k_cache_layout"_a = "default",
        "topk_length"_a = nb::none(), "extra_k_cache"_a = nb::none(),
        "extra_k_cache_format"_a = nb::none(), "extra_k_cache_layout"_a = "default",
        "extra_indices"_a = nb::none(), "extra_topk_length"_a = nb::none(),
        "attn_sink"_a = nb::none(), "d_v"_a = 512, "softmax_scale"_a = 0.f,
        "sched_metadata"_a = nb::none(), "sched_num_splits"_a = nb::none(),
        "workspace"_a = nb::none(), "stream"_a = 0, "batch_invariant"_a = false);
  m.def("sparse_prefill", &sparse_prefill_py, "q"_a, "kv"_a, "indices"_a, "out"_a, "max_logits"_a,
        "lse"_a, "topk_length"_a = nb::none(), "attn_sink"_a = nb::none(), "d_v"_a = 512,
        "softmax_scale"_a = 0.f, "workspace"_a = nb::none(), "stream"_a = 0, "as_kv_cache"_a = false,
        "k_cache_format"_a = nb::none(), "k_cache_layout"_a = "default",
        "fp8_tensor_cores"_a = false);
  register_mha_prefill(m);
  m.def("merge_attention_states", &merge_attention_states_py, "part_out"_a, "part_lse"_a, "out"_a,
        "lse"_a = nb::none(), "stream"_a = 0);
  m.def("kv_cache_write", &kv_cache_write_py, "kv"_a, "slot_mapping"_a, "cache"_a,
        "cache_format"_a = nb::none(), "cache_layout"_a = "default", "stream"_a = 0);
  m.def("kv_cache_gather", &kv_cache_gather_py, "cache"_a, "slots"_a, "out"_a,
        "cache_format"_a = nb::none(), "cache_layout"_a = "default", "stream"_a = 0);
#ifdef OPENMLA_PYTHON_HAS_KV_CONVERT
  m.def("kv_cache_convert", &kv_cache_convert_py, "src"_a, "dst"_a, "src_format"_a = nb::none(),
        "src_layout"_a = "default", "dst_format"_a = nb::none(), "dst_layout"_a = "default",
        "src_blocks"_a = nb::none(), "dst_blocks"_a = nb::none(), "stream"_a = 0);
#endif
  m.def("plan_decode_schedule", &plan_decode_schedule_py, "seqlens"_a, "metadata"_a, "num_splits"_a,
        "s_q"_a, "h_q"_a, "h_kv"_a = 1, "num_sm_parts"_a = 0, "block_tokens"_a = 64,
        "stream"_a = 0);
  m.def("decode_num_sm_parts", &decode_num_sm_parts_py, "device_type"_a, "device_index"_a, "s_q"_a,
        "h_q"_a, "h_kv"_a = 1);

  m.def(
      "dense_decode_workspace_size",
      [](const std::string& device_type, int device_index, int batch, int s_q, int h_q, int h_kv,
         int d_v) {
        const char* op = "dense_decode_workspace_size";
        check_non_negative(
            {{"batch", batch}, {"s_q", s_q}, {"h_q", h_q}, {"h_kv", h_kv}, {"d_v", d_v}}, op);
        return dense_decode_workspace_size(parse_device(device_type, device_index, op), batch, s_q,
                                           h_q, h_kv, d_v);
      },
      "device_type"_a, "device_index"_a, "batch"_a, "s_q"_a, "h_q"_a, "h_kv"_a = 1, "d_v"_a = 512);
  m.def(
      "sparse_decode_workspace_size",
      [](const std::string& device_type, int device_index, int batch, int s_q, int h_q, int d_v) {
        const char* op = "sparse_decode_workspace_size";
        check_non_negative({{"batch", batch}, {"s_q", s_q}, {"h_q", h_q}, {"d_v", d_v}}, op);
        return sparse_decode_workspace_size(parse_device(device_type, device_index, op), batch, s_q,
                                            h_q, d_v);
      },
      "device_type"_a, "device_index"_a, "batch"_a, "s_q"_a, "h_q"_a, "d_v"_a = 512);
  m.def(
      "sparse_prefill_workspace_size",
      [](const std::string& device_type, int device_index, int s_q, int h_q, int d_v) {
        const char* op = "sparse_prefill_workspace_size";
        check_non_negative({{"s_q", s_q}, {"h_q", h_q}, {"d_v", d_v}}, op);
        return sparse_prefill_workspace_size(parse_device(device_type, device_index, op), s_q, h_q,
                                             d_v);
      },
      "device_type"_a, "device_index"_a, "s_q"_a, "h_q"_a, "d_v"_a = 512);
  m.def(
      "sparse_prefill_cache_workspace_size",
      [](const Array& k_cache, int s_q, int h_q, int64_t topk, const OptString& k_cache_format,
         const std::string& k_cache_layout, int d_v) {
        const char* op = "sparse_prefill_workspace_size";
        check_non_negative({{"s_q", s_q}, {"h_q", h_q}, {"d_v", d_v}}, op);
        if (topk < 0) {
          throw_value_error(std::string(op) + ": topk: expected >= 0, got " + std::to_string(topk));
        }
        const KVCache cache = to_kv_cache(k_cache, k_cache_format, k_cache_layout, op, "k_cache");
        return sparse_prefill_workspace_size(cache.device, s_q, h_q, d_v, topk, cache);
      },
      "k_cache"_a, "s_q"_a, "h_q"_a, "topk"_a, "k_cache_format"_a = nb::none(),
      "k_cache_layout"_a = "default", "d_v"_a = 512);

  m.def(
      "kv_format_info",
      [](const std::string& format, int d_qk) {
        const char* op = "kv_format_info";
        return format_info_dict(parse_format(format, op, "format"), check_d_qk_arg(d_qk, op));
      },
      "format"_a, "d_qk"_a = 576, "The static facts of a KV format (a dict).");
  m.def(
      "kv_format_from_bytes_per_token",
      [](int64_t bytes_per_token) -> OptString {
        const std::optional<KVFormat> f = kv_format_from_bytes_per_token(bytes_per_token);
        if (!f) return std::nullopt;
        return std::string(kv_format_name(*f));
      },
      "bytes_per_token"_a);
  m.def(
      "kv_layout",
      [](const std::string& format, int page_size, const std::string& layout, int d_qk) {
        const char* op = "kv_layout";
        if (page_size < 1) throw_value_error("kv_layout: page_size: expected >= 1");
        const KVLayout l = make_layout(parse_format(format, op, "format"), page_size,
                                       check_d_qk_arg(d_qk, op), layout, op, "layout");
        throw_if_error(check_kv_layout(l, "kv_layout"));
        return layout_dict(l);
      },
      "format"_a, "page_size"_a, "layout"_a = "default", "d_qk"_a = 576,
      "The byte layout of one page block (a dict of offsets and strides).");
  m.def(
      "describe_kv_cache",
      [](const Array& cache, const OptString& format, const std::string& layout) {
        const char* op = "describe_kv_cache";
        const KVCache c = to_kv_cache(cache, format, layout, op, "cache");
        throw_if_error(check_kv_layout(c.layout, "describe_kv_cache: cache"));
        nb::dict d = layout_dict(c.layout);
        d["num_blocks"] = c.num_blocks;
        d["device"] = device_name(c.device);
        return d;
      },
      "cache"_a, "format"_a = nb::none(), "layout"_a = "default",
      "The KVCache the extension builds from `cache` (a dict), after the layout checks.");
  m.def("reinterpret", &reinterpret_py, "array"_a, "dtype"_a,
        "A view of `array`'s memory as another dtype of the same item size (it keeps `array` "
        "alive).");
  register_fused(m);
  m.def("cuda_backend_available", &cuda_backend_available);
  m.def(
      "cuda_device_arch",
      [](int device_index) {
        int arch = 0;
        throw_if_error(cuda_device_arch(device_index, &arch));
        return arch;
      },
      "device_index"_a = 0);
  m.def("kv_format_names", [] {
    nb::list names;
    for (KVFormat f : {KVFormat::kBF16, KVFormat::kFP16, KVFormat::kFP8_V32, KVFormat::kFP8_Model1,
                       KVFormat::kFP8_MX, KVFormat::kFP4}) {
      names.append(kv_format_name(f));
    }
    return names;
  });
}
