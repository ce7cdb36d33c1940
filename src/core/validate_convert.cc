// Validation of kv_cache_convert: both caches well formed, one device, one page size, one d_qk;
// the block lists (if any) a matching pair of [n] int32|int64 vectors.
#include "core/validate_convert.h"

#include <cstdint>
#include <string>

#include "core/str_cat.h"
#include "core/validate.h"

namespace openmla::core {
namespace {

constexpr const char* kOp = "kv_cache_convert";

template <typename... Parts>
Status invalid(const Parts&... parts) {
  return Status::InvalidArgument(str_cat(kOp, ": ", parts...));
}

Status check_cache(const KVCache& cache, const char* arg) {
  if (!cache.defined()) return invalid(arg, ": required KV cache is missing (data is null)");
  if (cache.num_blocks < 0)
    return invalid(arg, ".num_blocks: expected >= 0, got ", cache.num_blocks);
  const std::string layout_arg = std::string(kOp) + ": " + arg + ".layout";
  return check_kv_layout(cache.layout, layout_arg.c_str());
}

// The bytes [begin, end) a cache's blocks can touch.
void cache_span(const KVCache& cache, uintptr_t* begin, uintptr_t* end) {
  *begin = reinterpret_cast<uintptr_t>(cache.data);
  *end = *begin;
  if (cache.num_blocks > 0) {
    *end += static_cast<uintptr_t>((cache.num_blocks - 1) * cache.layout.block_stride +
                                   kv_block_footprint_bytes(cache.layout));
  }
}

Status check_block_list(const TensorView& t, Device device, const char* arg) {
  if (t.data == nullptr && t.numel() > 0) return invalid(arg, ": data pointer is null");
  OPENMLA_RETURN_IF_ERROR(check_rank(t, 1, kOp, arg));
  if (t.dtype != DType::kInt32 && t.dtype != DType::kInt64) {
    return invalid(arg, ": expected dtype int32 or int64, got ", dtype_name(t.dtype));
  }
  if (t.shape[0] < 0) return invalid(arg, ": negative size in shape ", t.shape_string());
  if (t.device != device) {
    return invalid(arg, ": expected device ", device_name(device), " (the caches' device), got ",
                   device_name(t.device));
  }
  return Status::Ok();
}

int64_t block_at(const TensorView& t, int64_t i) {
  const int64_t offset = i * t.strides[0];
  return t.dtype == DType::kInt64 ? t.data_as<const int64_t>()[offset]
                                  : t.data_as<const int32_t>()[offset];
}

Status check_block_ids(const TensorView& t, int64_t num_blocks, const char* arg) {
  for (int64_t i = 0; i < t.shape[0]; ++i) {
    const int64_t id = block_at(t, i);
    if (id != -1 && (id < 0 || id >= num_blocks)) {
      return invalid(arg, "[", i, "]: expected -1 (skip) or a block in [0, ", num_blocks, "), got ",
                     id);
    }
  }
  return Status::Ok();
}

}  // namespace

Status validate_kv_cache_convert(const KVCacheConvertArgs& a, KVCacheConvertShape* s) {
  OPENMLA_RETURN_IF_ERROR(check_cache(a.src, "src"));
  OPENMLA_RETURN_IF_ERROR(check_cache(a.dst, "dst"));
  const Device device = a.src.device;
  if (a.dst.device != device) {
    return invalid("dst: expected device ", device_name(device), " (src's device), got ",
                   device_name(a.dst.device));
  }
  const KVFormatInfo src_info = kv_format_info(a.src.layout.format, a.src.layout.d_qk);
  const KVFormatInfo dst_info = kv_format_info(a.dst.layout.format, a.dst.layout.d_qk);
  if (a.dst.layout.page_size != a.src.layout.page_size) {
    return invalid("dst.layout.page_size: expected ", a.src.layout.page_size,
                   " (src's page size), got ", a.dst.layout.page_size);
  }
  if (dst_info.d_qk != src_info.d_qk) {
    return invalid("dst.layout: expected a format of ", src_info.d_qk, " dims per token (src is ",
                   kv_format_name(src_info.format), " with ", src_info.d_qk, "), got ",
                   kv_format_name(dst_info.format), " with ", dst_info.d_qk);
  }
  s->page_size = a.src.layout.page_size;
  s->d_qk = src_info.d_qk;
  s->device = device;

  const bool has_src = a.src_blocks.defined(), has_dst = a.dst_blocks.defined();
  s->block_lists = has_src || has_dst;
  if (!s->block_lists) {
    if (a.dst.num_blocks != a.src.num_blocks) {
      return invalid(
          "dst.num_blocks: expected ", a.src.num_blocks,
          " (src.num_blocks: without src_blocks/dst_blocks every block is converted), got ",
          a.dst.num_blocks);
    }
    uintptr_t src_begin, src_end, dst_begin, dst_end;
    cache_span(a.src, &src_begin, &src_end);
    cache_span(a.dst, &dst_begin, &dst_end);
    if (src_begin < dst_end && dst_begin < src_end) {
      return invalid(
          "dst: its memory overlaps src's (a whole-cache conversion cannot run in place; "
          "pass src_blocks/dst_blocks naming disjoint blocks)");
    }
    s->num_blocks = a.src.num_blocks;
    return Status::Ok();
  }
  if (!has_src) return invalid("src_blocks: required together with dst_blocks");
  if (!has_dst) return invalid("dst_blocks: required together with src_blocks");
  OPENMLA_RETURN_IF_ERROR(check_block_list(a.src_blocks, device, "src_blocks"));
  OPENMLA_RETURN_IF_ERROR(check_block_list(a.dst_blocks, device, "dst_blocks"));
  if (a.dst_blocks.shape[0] != a.src_blocks.shape[0]) {
    return invalid("dst_blocks: expected ", a.src_blocks.shape[0],
                   " entries (src_blocks' length), got ", a.dst_blocks.shape[0]);
  }
  s->num_blocks = a.src_blocks.shape[0];
  if (device.type == DeviceType::kCPU) {
    OPENMLA_RETURN_IF_ERROR(check_block_ids(a.src_blocks, a.src.num_blocks, "src_blocks"));
    OPENMLA_RETURN_IF_ERROR(check_block_ids(a.dst_blocks, a.dst.num_blocks, "dst_blocks"));
  }
  return Status::Ok();
}

}  // namespace openmla::core
