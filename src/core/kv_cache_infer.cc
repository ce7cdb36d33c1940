// A KV cache's format and layout from the array that holds it (include/openmla/kv_format.h).
#include "openmla/kv_format.h"

#include "core/str_cat.h"

namespace openmla {
namespace {

template <typename... Parts>
Status invalid(const char* op, const char* arg, const Parts&... parts) {
  return Status::InvalidArgument(core::str_cat(op, ": ", arg, ": ", parts...));
}

const char* layout_name(KVLayoutKind kind) {
  return kind == KVLayoutKind::kInterleaved ? "interleaved" : "default";
}

}  // namespace

Status infer_kv_cache(const CacheArray& array, std::optional<KVFormat> format, KVLayoutKind layout_kind,
                      const char* op, const char* arg, KVCache* cache) {
  const int rank = array.rank;
  const int64_t* shape = array.shape;
  if (rank != 3 && rank != 4) {
    return invalid(op, arg,
                   "expected shape [num_blocks, page_size, 1, bytes_per_token] (or "
                   "[num_blocks, page_size, bytes_per_token]), got ",
                   rank, " dimensions");
  }
  if (rank == 4 && shape[2] != 1) {
    return invalid(op, arg, "expected one kv head (size 1 in dim 2), got ", shape[2]);
  }
  const int64_t num_blocks = shape[0], page_size = shape[1], last = shape[rank - 1];
  if (page_size < 1) return invalid(op, arg, "expected page_size (dim 1) >= 1, got 0");
  // An empty cache (no blocks) gets the strides of a packed one: numpy 2 reports all zeros.
  int64_t strides[4];
  for (int d = rank - 1; d >= 0; --d) {
    const int64_t packed = d == rank - 1 ? 1 : strides[d + 1] * shape[d + 1];
    strides[d] = num_blocks > 0 ? array.strides[d] : packed;
  }
  for (int d = 0; d < rank; ++d) {
    if (strides[d] < 0) return invalid(op, arg, "negative strides are not supported");
  }
  const bool plain = array.element != CacheArrayElement::kBytes;
  const int64_t itemsize = plain ? 2 : 1;
  if (last > 1 && strides[rank - 1] != 1) {
    return invalid(op, arg, "the last dimension must be contiguous (stride 1), got stride ",
                   strides[rank - 1]);
  }

  KVFormat fmt;
  int d_qk = 576;
  if (plain) {
    const DType dtype = array.element == CacheArrayElement::kBF16 ? DType::kBF16 : DType::kFP16;
    fmt = dtype == DType::kBF16 ? KVFormat::kBF16 : KVFormat::kFP16;
    d_qk = static_cast<int>(last);
    if (format && *format != fmt) {
      return invalid(op, arg, "format '", kv_format_name(*format), "' given for a ",
                     dtype_name(dtype), " array (", dtype_name(dtype), " arrays hold the plain ",
                     kv_format_name(fmt), " format)");
    }
  } else if (format) {
    fmt = *format;
    if (fmt == KVFormat::kBF16 || fmt == KVFormat::kFP16) d_qk = static_cast<int>(last / 2);
    const int64_t expected = kv_format_info(fmt, d_qk).bytes_per_token;
    if (last != expected) {
      return invalid(op, arg, "format ", kv_format_name(fmt), " has ", expected,
                     " bytes per token, but the last dimension is ", last);
    }
  } else {
    const std::optional<KVFormat> inferred = kv_format_from_bytes_per_token(last);
    if (!inferred) {
      return invalid(op, arg, "cannot infer the KV format from ", last,
                     " bytes per token (known: 656 fp8_v32, 584 fp8_model1, 528 fp8_mx, "
                     "288 fp4; pass a bf16/fp16 array for a plain cache, or name the format)");
    }
    fmt = *inferred;
  }
  if (page_size > (int64_t{1} << 30)) return invalid(op, arg, "page_size too large");

  KVLayout layout = layout_kind == KVLayoutKind::kInterleaved
                        ? interleaved_kv_layout(fmt, static_cast<int>(page_size), d_qk)
                        : default_kv_layout(fmt, static_cast<int>(page_size), d_qk);
  const int64_t token_bytes = last * itemsize;  // the bytes one token row holds in the array
  const int64_t token_stride_bytes = (page_size > 1 ? strides[1] : last) * itemsize;
  if (fmt == KVFormat::kBF16 || fmt == KVFormat::kFP16) {
    // A plain cache may be a strided view: honour its token stride.
    layout.data_stride = token_stride_bytes;
    layout.block_stride = page_size * token_stride_bytes;
  } else if (token_stride_bytes != token_bytes) {
    return invalid(op, arg,
                   "a quantised cache's tokens must be packed inside a block (stride of dim 1 = ",
                   last, "), got stride ", strides[1]);
  }
  const int64_t footprint = kv_block_footprint_bytes(layout);
  const int64_t block_extent = (page_size - 1) * token_stride_bytes + token_bytes;
  if (footprint > block_extent) {
    return invalid(op, arg, "the ", layout_name(layout_kind), " layout of ", kv_format_name(fmt),
                   " needs ", footprint, " bytes per block, but a block of the array spans ",
                   block_extent);
  }
  if (num_blocks > 1) layout.block_stride = strides[0] * itemsize;

  cache->data = array.data;
  cache->layout = layout;
  cache->num_blocks = num_blocks;
  cache->device = array.device;
  return Status::Ok();
}

}  // namespace openmla
