// KV-cache format facts and layout descriptors (docs/formats.md).
#include "openmla/kv_format.h"

#include <algorithm>
#include <array>
#include <string>

namespace openmla {

namespace {

constexpr std::array<KVFormat, 6> kAllFormats = {KVFormat::kBF16,    KVFormat::kFP16,
                                                 KVFormat::kFP8_V32, KVFormat::kFP8_Model1,
                                                 KVFormat::kFP8_MX,  KVFormat::kFP4};

// Sanity caps that keep every offset + token * stride product far from int64 overflow.
constexpr int kMaxPageSize = 1 << 20;
constexpr int64_t kMaxOffsetBytes = int64_t{1} << 40;

bool is_plain(KVFormat format) { return format == KVFormat::kBF16 || format == KVFormat::kFP16; }

bool is_known(KVFormat format) {
  return std::find(kAllFormats.begin(), kAllFormats.end(), format) != kAllFormats.end();
}

int64_t round_up(int64_t x, int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

// One of a token's (up to) three parts: token t's bytes are [offset + t*stride, ... + bytes).
struct Part {
  const char* name;  // "data", "scale", "rope"
  int64_t offset, stride, bytes;
  int64_t begin(int64_t token) const { return offset + token * stride; }
  int64_t end(int64_t token) const { return begin(token) + bytes; }
};

// The parts `layout`'s format uses (those with bytes > 0), in a fixed order.
int layout_parts(const KVLayout& layout, Part parts[3]) {
  const KVFormatInfo info = kv_format_info(layout.format, layout.d_qk);
  int n = 0;
  parts[n++] = {"data", layout.data_offset, layout.data_stride, info.data_bytes};
  if (info.scale_bytes > 0) {
    parts[n++] = {"scale", layout.scale_offset, layout.scale_stride, info.scale_bytes};
  }
  if (info.rope_bytes > 0) {
    parts[n++] = {"rope", layout.rope_offset, layout.rope_stride, info.rope_bytes};
  }
  return n;
}

// `arg` names the layout itself ("sparse_decode: k_cache.layout").
std::string field(const char* arg, const char* name) { return std::string(arg) + "." + name; }

std::string interval(int64_t begin, int64_t end) {
  // Appending (not "[" + std::string) sidesteps a GCC 12 -Wrestrict false positive.
  std::string s = "[";
  s += std::to_string(begin);
  s += ", ";
  s += std::to_string(end);
  s += ")";
  return s;
}

// Finds a token of `b` whose bytes overlap token `t` of `a`, or returns -1. b's intervals are
// disjoint and increasing in the token, so the only candidate is the last one starting before
// a's end: it has the largest end of all that do.
int64_t overlapping_token(const Part& a, int64_t t, const Part& b, int64_t page_size) {
  const int64_t a_begin = a.begin(t), a_end = a.end(t);
  if (a_end <= b.offset) return -1;
  // b.stride >= b.bytes > 0, checked before.
  const int64_t u = std::min((a_end - 1 - b.offset) / b.stride, page_size - 1);
  return b.end(u) > a_begin ? u : -1;
}

Status check_part(const Part& part, const KVLayout& layout, int alignment, const char* why,
                  const char* arg) {
  const std::string offset_name = std::string(part.name) + "_offset";
  const std::string stride_name = std::string(part.name) + "_stride";
  if (part.offset < 0 || part.offset >= kMaxOffsetBytes) {
    return Status::InvalidArgument(field(arg, offset_name.c_str()) +
                                   ": expected in [0, 2^40), got " + std::to_string(part.offset));
  }
  if (part.stride < part.bytes || part.stride >= kMaxOffsetBytes) {
    return Status::InvalidArgument(
        field(arg, stride_name.c_str()) + ": expected >= " + std::to_string(part.bytes) +
        " bytes (one token's " + part.name + " part of " + kv_format_name(layout.format) +
        ") and < 2^40, got " + std::to_string(part.stride));
  }
  if (part.offset % alignment != 0 || part.stride % alignment != 0) {
    const bool offset_bad = part.offset % alignment != 0;
    return Status::InvalidArgument(field(arg, (offset_bad ? offset_name : stride_name).c_str()) +
                                   ": expected a multiple of " + std::to_string(alignment) +
                                   " bytes (" + why + "), got " +
                                   std::to_string(offset_bad ? part.offset : part.stride));
  }
  return Status::Ok();
}

}  // namespace

const char* kv_format_name(KVFormat format) {
  switch (format) {
    case KVFormat::kBF16: return "bf16";
    case KVFormat::kFP16: return "fp16";
    case KVFormat::kFP8_V32: return "fp8_v32";
    case KVFormat::kFP8_Model1: return "fp8_model1";
    case KVFormat::kFP8_MX: return "fp8_mx";
    case KVFormat::kFP4: return "fp4";
  }
  return "unknown";
}

std::optional<KVFormat> kv_format_from_name(const std::string& name) {
  for (KVFormat format : kAllFormats) {
    if (name == kv_format_name(format)) return format;
  }
  return std::nullopt;
}

KVFormatInfo kv_format_info(KVFormat format, int d_qk) {
  switch (format) {
    case KVFormat::kBF16:
    case KVFormat::kFP16: return {format, d_qk, d_qk, 0, 0, 0, 2 * d_qk, 0, 0, 2 * d_qk};
    case KVFormat::kFP8_V32: return {format, 576, 512, 64, 128, 4, 512, 16, 128, 656};
    case KVFormat::kFP8_Model1:
      // 7 e8m0 scales + 1 pad byte.
      return {format, 512, 448, 64, 64, 7, 448, 8, 128, 584};
    case KVFormat::kFP8_MX: return {format, 512, 512, 0, 32, 16, 512, 16, 0, 528};
    case KVFormat::kFP4:
      // Two e2m1 per byte; e4m3 scales.
      return {format, 512, 512, 0, 16, 32, 256, 32, 0, 288};
  }
  return {format, 0, 0, 0, 0, 0, 0, 0, 0, 0};
}

std::optional<KVFormat> kv_format_from_bytes_per_token(int64_t bytes_per_token) {
  for (KVFormat format : kAllFormats) {
    if (is_plain(format)) continue;  // a uint8 cache is never a plain bf16/fp16 one
    if (kv_format_info(format).bytes_per_token == bytes_per_token) return format;
  }
  return std::nullopt;
}

KVLayout default_kv_layout(KVFormat format, int page_size, int d_qk) {
  const KVFormatInfo info = kv_format_info(format, d_qk);
  const int64_t page = page_size;
  KVLayout layout;
  layout.format = format;
  layout.d_qk = info.d_qk;
  layout.page_size = page_size;
  switch (format) {
    case KVFormat::kBF16:
    case KVFormat::kFP16:
    case KVFormat::kFP8_V32:  // already token-interleaved
      return interleaved_kv_layout(format, page_size, d_qk);
    case KVFormat::kFP8_Model1:
      // Tokens' 576 B (data + rope) first, then all tokens' 8 B of scales.
      layout.data_stride = layout.rope_stride = info.data_bytes + info.rope_bytes;
      layout.rope_offset = info.data_bytes;
      layout.scale_offset = page * layout.data_stride;
      layout.scale_stride = info.scale_bytes;
      layout.block_stride = round_up(page * info.bytes_per_token, layout.data_stride);
      return layout;
    case KVFormat::kFP8_MX:
    case KVFormat::kFP4:
      layout.data_stride = info.data_bytes;
      layout.scale_offset = page * info.data_bytes;
      layout.scale_stride = info.scale_bytes;
      layout.block_stride = page * info.bytes_per_token;
      return layout;
  }
  return layout;
}

KVLayout interleaved_kv_layout(KVFormat format, int page_size, int d_qk) {
  const KVFormatInfo info = kv_format_info(format, d_qk);
  KVLayout layout;
  layout.format = format;
  layout.d_qk = info.d_qk;
  layout.page_size = page_size;
  layout.data_stride = info.bytes_per_token;
  layout.block_stride = int64_t{page_size} * info.bytes_per_token;
  if (info.scale_bytes > 0) layout.scale_stride = info.bytes_per_token;
  if (info.rope_bytes > 0) layout.rope_stride = info.bytes_per_token;
  switch (format) {
    case KVFormat::kFP8_V32:  // data · scales · rope
      layout.scale_offset = info.data_bytes;
      layout.rope_offset = info.data_bytes + info.scale_bytes;
      break;
    case KVFormat::kFP8_Model1:  // data · rope · scales (the default's token order)
      layout.rope_offset = info.data_bytes;
      layout.scale_offset = info.data_bytes + info.rope_bytes;
      break;
    case KVFormat::kFP8_MX:
    case KVFormat::kFP4: layout.scale_offset = info.data_bytes; break;
    default: break;
  }
  return layout;
}

int64_t kv_block_footprint_bytes(const KVLayout& layout) {
  Part parts[3];
  const int num_parts = layout_parts(layout, parts);
  int64_t footprint = 0;
  for (int i = 0; i < num_parts; ++i) {
    // Saturates: an unchecked layout may hold any offsets and strides (check_kv_layout caps them).
    int64_t end = 0;
    if (__builtin_mul_overflow(int64_t{layout.page_size} - 1, parts[i].stride, &end) ||
        __builtin_add_overflow(end, parts[i].offset, &end) ||
        __builtin_add_overflow(end, parts[i].bytes, &end)) {
      return INT64_MAX;
    }
    footprint = std::max(footprint, end);
  }
  return footprint;
}

Status check_kv_layout(const KVLayout& layout, const char* arg) {
  if (!is_known(layout.format)) {
    return Status::InvalidArgument(field(arg, "format") + ": unknown KV format " +
                                   std::to_string(static_cast<int>(layout.format)));
  }
  const char* name = kv_format_name(layout.format);
  if (is_plain(layout.format)) {
    if (layout.d_qk != 576 && layout.d_qk != 512) {
      return Status::InvalidArgument(field(arg, "d_qk") + ": expected 576 or 512 for " + name +
                                     ", got " + std::to_string(layout.d_qk));
    }
  } else if (layout.d_qk != kv_format_info(layout.format).d_qk) {
    return Status::InvalidArgument(field(arg, "d_qk") + ": expected " +
                                   std::to_string(kv_format_info(layout.format).d_qk) + " for " +
                                   name + ", got " + std::to_string(layout.d_qk));
  }
  if (layout.page_size < 1 || layout.page_size > kMaxPageSize) {
    return Status::InvalidArgument(field(arg, "page_size") + ": expected in [1, " +
                                   std::to_string(kMaxPageSize) + "], got " +
                                   std::to_string(layout.page_size));
  }

  // Alignment of each part's element type: bf16/fp16 2 B, float32 scales 4 B.
  Part parts[3];
  const int num_parts = layout_parts(layout, parts);
  int block_alignment = 1;
  for (int i = 0; i < num_parts; ++i) {
    const std::string part = parts[i].name;
    int alignment = 1;
    const char* why = "";
    if (part == "data" && is_plain(layout.format)) {
      alignment = 2, why = "16-bit elements";
    } else if (part == "rope") {
      alignment = 2, why = "bf16 elements";
    } else if (part == "scale" && layout.format == KVFormat::kFP8_V32) {
      alignment = 4, why = "float32 scales";
    }
    OPENMLA_RETURN_IF_ERROR(check_part(parts[i], layout, alignment, why, arg));
    block_alignment = std::max(block_alignment, alignment);
  }

  // Two tokens' parts of one kind cannot overlap (stride >= bytes, checked above); parts of
  // different kinds are checked token by token unless their spans are disjoint.
  const int64_t last = layout.page_size - 1;
  for (int i = 0; i < num_parts; ++i) {
    for (int j = i + 1; j < num_parts; ++j) {
      const Part& a = parts[i];
      const Part& b = parts[j];
      if (a.end(last) <= b.begin(0) || b.end(last) <= a.begin(0)) continue;
      for (int64_t t = 0; t <= last; ++t) {
        const int64_t u = overlapping_token(a, t, b, layout.page_size);
        if (u < 0) continue;
        return Status::InvalidArgument(std::string(arg) + ": token " + std::to_string(t) + "'s " +
                                       a.name + " bytes " + interval(a.begin(t), a.end(t)) +
                                       " overlap token " + std::to_string(u) + "'s " + b.name +
                                       " bytes " + interval(b.begin(u), b.end(u)));
      }
    }
  }

  const int64_t footprint = kv_block_footprint_bytes(layout);
  if (layout.block_stride < footprint) {
    return Status::InvalidArgument(
        field(arg, "block_stride") + ": expected >= " + std::to_string(footprint) +
        " bytes (the block's footprint), got " + std::to_string(layout.block_stride));
  }
  if (layout.block_stride % block_alignment != 0) {
    return Status::InvalidArgument(
        field(arg, "block_stride") + ": expected a multiple of " + std::to_string(block_alignment) +
        " bytes (the alignment of its parts), got " + std::to_string(layout.block_stride));
  }
  return Status::Ok();
}

}  // namespace openmla
