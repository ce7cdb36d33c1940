// KV-cache formats (docs/formats.md) and the byte-layout descriptor of a paged cache.
//
// A cache is `num_blocks` page blocks of `page_size` tokens, one kv head. Where a token's bytes sit
// inside a block is a descriptor, not a constant: each token has up to three parts,
//   data  (the quantised or plain elements),
//   scale (the per-group scales of a quantised format),
//   rope  (an unquantised bf16 tail, for fp8_v32 and fp8_model1),
// each at `offset + token * stride` bytes from the start of the block. The defaults below are the
// layouts of docs/formats.md; `interleaved` puts every token's scales right after its data.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "openmla/status.h"
#include "openmla/tensor.h"

namespace openmla {

enum class KVFormat : int32_t {
  kBF16,       // 576 (or 512) × bf16
  kFP16,       // 576 (or 512) × fp16
  kFP8_V32,    // V3.2, 656 B: 512 e4m3 · 4 f32 scales (per 128) · 64 bf16 rope
  kFP8_Model1, // V4, 584 B: 448 e4m3 · 64 bf16 rope · 7 e8m0 scales (per 64) + 1 pad
  kFP8_MX,     // V4.1, 528 B: 512 e4m3 · 16 e8m0 scales (per 32)
  kFP4,        // V4.1 extra cache, 288 B: 256 B packed e2m1 · 32 e4m3 scales (per 16)
};

const char* kv_format_name(KVFormat format);
std::optional<KVFormat> kv_format_from_name(const std::string& name);

// Static facts of a format.
struct KVFormatInfo {
  KVFormat format;
  int d_qk;               // dims per token (576 for bf16/fp16/fp8_v32, 512 otherwise)
  int quantized_dims;     // dims stored in `data` (all for plain formats)
  int rope_dims;          // trailing dims stored unquantised as bf16 (0 if none)
  int group_size;         // dims per scale (0 for plain formats)
  int num_scales;         // scales per token
  int data_bytes;         // bytes of one token's data part
  int scale_bytes;        // bytes of one token's scales (including padding)
  int rope_bytes;         // bytes of one token's rope part
  int bytes_per_token;    // the format's nominal size: 1152, 656, 584, 528, 288
  bool quantized() const { return group_size > 0; }
};

// For kBF16/kFP16, d_qk may be 576 or 512; for the others it is fixed and `d_qk` is ignored.
KVFormatInfo kv_format_info(KVFormat format, int d_qk = 576);

// Infers a quantised format from the bytes per token of a uint8/int8 cache: 656, 584, 528, 288.
std::optional<KVFormat> kv_format_from_bytes_per_token(int64_t bytes_per_token);

// Where a token's parts lie inside one page block (all in bytes).
struct KVLayout {
  KVFormat format = KVFormat::kBF16;
  int d_qk = 576;
  int page_size = 64;
  int64_t block_stride = 0;  // bytes from one block to the next (may exceed the block's size)
  int64_t data_offset = 0, data_stride = 0;
  int64_t scale_offset = 0, scale_stride = 0;
  int64_t rope_offset = 0, rope_stride = 0;
};

// The docs/formats.md layout of a block of `page_size` tokens, blocks packed back to back
// (fp8_model1's block stride padded to a multiple of 576 B).
KVLayout default_kv_layout(KVFormat format, int page_size, int d_qk = 576);
// Each token's data, rope and scales adjacent (stride = bytes_per_token), blocks packed.
KVLayout interleaved_kv_layout(KVFormat format, int page_size, int d_qk = 576);
// Bytes one block occupies under `layout` (the smallest legal block_stride); INT64_MAX where an
// unchecked layout's offsets and strides overflow it.
int64_t kv_block_footprint_bytes(const KVLayout& layout);

// A paged KV cache of one kv head: a base pointer, a layout and a block count.
struct KVCache {
  void* data = nullptr;
  KVLayout layout;
  int64_t num_blocks = 0;
  Device device;

  bool defined() const { return data != nullptr; }
  int64_t num_tokens() const { return num_blocks * layout.page_size; }
};

// Validates a layout: parts inside the block, no overlap of any two tokens' parts, alignment of
// offsets and strides to the element type (bf16/fp16 data and rope 2 B, fp8_v32's f32 scales 4 B;
// the token-interleaved fp8_model1 stride, 584 B, rules out more). `arg` names the layout, e.g.
// "k_cache.layout" → "k_cache.layout.block_stride: expected >= ...". Fields of parts a format
// lacks are ignored.
Status check_kv_layout(const KVLayout& layout, const char* arg);

// --- a cache from the array that holds it (src/core/kv_cache_infer.cc) ------------------------
// What a binding (python/src/convert.cc) or a C++ caller holding a framework's tensor needs to
// make a KVCache: its format and layout worked out from the array's shape, strides and element
// type, with every check that array must pass.

// How the array stores its elements: raw bytes (uint8, int8 or any float8 dtype) or the plain
// 16-bit values of a bf16 / fp16 cache.
enum class CacheArrayElement { kBytes, kBF16, kFP16 };

// The array a cache lives in, as a framework describes it. Shape and strides count elements;
// strides of an empty array (numpy 2 gives all zeros) are ignored.
struct CacheArray {
  void* data = nullptr;
  Device device;
  CacheArrayElement element = CacheArrayElement::kBytes;
  int rank = 0;
  const int64_t* shape = nullptr;
  const int64_t* strides = nullptr;
};

enum class KVLayoutKind { kDefault, kInterleaved };  // default_kv_layout / interleaved_kv_layout

// The KVCache held by `array`, shaped [num_blocks, page_size, 1, bytes_per_token] (or without the
// kv-head dim):
// - format: a bf16 / fp16 array holds the plain format of its dtype (d_qk = its last dim;
//   `format`, if given, must name that one); a byte array holds `format` when given (its last dim
//   must be that format's bytes per token), else the format its bytes per token name;
// - layout: `layout`'s, with the array's block stride, and for a plain cache its token stride too
//   (a quantised cache's tokens must be packed inside a block).
// InvalidArgument "op: arg: ..." naming what was expected and what the array has.
Status infer_kv_cache(const CacheArray& array, std::optional<KVFormat> format, KVLayoutKind layout,
                      const char* op, const char* arg, KVCache* cache);

}  // namespace openmla
