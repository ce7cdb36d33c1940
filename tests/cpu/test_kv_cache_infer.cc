// A cache's format and layout from the array that holds it (infer_kv_cache,
// include/openmla/kv_format.h; the Python binding's to_kv_cache calls it).
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "openmla/kv_format.h"

namespace openmla {
namespace {

bool has(const Status& status, const std::string& text) {
  return status.message().find(text) != std::string::npos;
}

// An array of `shape`, packed unless `strides` (elements) are given.
struct Array {
  std::vector<int64_t> shape, strides;
  CacheArrayElement element = CacheArrayElement::kBytes;
  Array(std::vector<int64_t> shape_, CacheArrayElement element_,
        std::vector<int64_t> strides_ = {})
      : shape(std::move(shape_)), strides(std::move(strides_)), element(element_) {
    if (strides.empty()) {
      strides.assign(shape.size(), 1);
      for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) {
        strides[d] = strides[d + 1] * shape[d + 1];
      }
    }
  }
  CacheArray view() const {
    CacheArray a;
    a.data = reinterpret_cast<void*>(uintptr_t{0x10000});
    a.device = Device::cpu();
    a.element = element;
    a.rank = static_cast<int>(shape.size());
    a.shape = shape.data();
    a.strides = strides.data();
    return a;
  }
};

Status infer(const Array& array, KVCache* cache, std::optional<KVFormat> format = std::nullopt,
             KVLayoutKind layout = KVLayoutKind::kDefault) {
  return infer_kv_cache(array.view(), format, layout, "op", "k_cache", cache);
}

TEST(InferKVCache, PlainBf16Packed) {
  KVCache cache;
  ASSERT_TRUE(infer(Array({4, 64, 1, 576}, CacheArrayElement::kBF16), &cache).ok());
  EXPECT_EQ(cache.layout.format, KVFormat::kBF16);
  EXPECT_EQ(cache.layout.d_qk, 576);
  EXPECT_EQ(cache.layout.page_size, 64);
  EXPECT_EQ(cache.layout.data_stride, 1152);
  EXPECT_EQ(cache.layout.block_stride, 64 * 1152);
  EXPECT_EQ(cache.num_blocks, 4);
  EXPECT_EQ(cache.data, reinterpret_cast<void*>(uintptr_t{0x10000}));
  EXPECT_TRUE(check_kv_layout(cache.layout, "k_cache.layout").ok());
}

TEST(InferKVCache, PlainFp16D512Rank3) {
  KVCache cache;
  ASSERT_TRUE(infer(Array({2, 16, 512}, CacheArrayElement::kFP16), &cache).ok());
  EXPECT_EQ(cache.layout.format, KVFormat::kFP16);
  EXPECT_EQ(cache.layout.d_qk, 512);
  EXPECT_EQ(cache.layout.block_stride, 16 * 1024);
}

// A plain cache may be a strided view: its token and block strides are kept.
TEST(InferKVCache, PlainStridedView) {
  KVCache cache;
  const Array a({3, 16, 1, 576}, CacheArrayElement::kBF16, {16 * 640 + 64, 640, 640, 1});
  ASSERT_TRUE(infer(a, &cache).ok());
  EXPECT_EQ(cache.layout.data_stride, 1280);
  EXPECT_EQ(cache.layout.block_stride, (16 * 640 + 64) * 2);
}

TEST(InferKVCache, BytesFormatFromBytesPerToken) {
  const std::pair<int64_t, KVFormat> known[] = {{656, KVFormat::kFP8_V32},
                                                {528, KVFormat::kFP8_MX},
                                                {288, KVFormat::kFP4}};
  for (const auto& [bytes, format] : known) {
    KVCache cache;
    const Status st = infer(Array({2, 64, 1, bytes}, CacheArrayElement::kBytes), &cache);
    ASSERT_TRUE(st.ok()) << bytes << ": " << st.message();
    EXPECT_EQ(cache.layout.format, format) << bytes;
    EXPECT_EQ(cache.layout.block_stride, 64 * bytes);
  }
  KVCache cache;
  const Status st = infer(Array({2, 64, 1, 600}, CacheArrayElement::kBytes), &cache);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(has(st, "op: k_cache: cannot infer the KV format from 600 bytes per token"))
      << st.message();
}

TEST(InferKVCache, NamedFormat) {
  KVCache cache;
  EXPECT_TRUE(infer(Array({2, 64, 1, 288}, CacheArrayElement::kBytes), &cache, KVFormat::kFP4).ok());
  EXPECT_EQ(cache.layout.format, KVFormat::kFP4);
  // bf16 bytes: d_qk is half the byte count.
  ASSERT_TRUE(
      infer(Array({2, 64, 1, 1024}, CacheArrayElement::kBytes), &cache, KVFormat::kBF16).ok());
  EXPECT_EQ(cache.layout.d_qk, 512);
  Status st = infer(Array({2, 64, 1, 656}, CacheArrayElement::kBytes), &cache, KVFormat::kFP4);
  EXPECT_TRUE(has(st, "format fp4 has 288 bytes per token, but the last dimension is 656"))
      << st.message();
  st = infer(Array({2, 64, 1, 576}, CacheArrayElement::kBF16), &cache, KVFormat::kFP8_V32);
  EXPECT_TRUE(has(st, "format 'fp8_v32' given for a bf16 array")) << st.message();
  EXPECT_TRUE(infer(Array({2, 64, 1, 576}, CacheArrayElement::kBF16), &cache, KVFormat::kBF16).ok());
}

TEST(InferKVCache, Interleaved) {
  KVCache cache;
  ASSERT_TRUE(infer(Array({2, 64, 1, 656}, CacheArrayElement::kBytes), &cache, std::nullopt,
                    KVLayoutKind::kInterleaved)
                  .ok());
  const KVLayout expected = interleaved_kv_layout(KVFormat::kFP8_V32, 64);
  EXPECT_EQ(cache.layout.data_stride, expected.data_stride);
  EXPECT_EQ(cache.layout.scale_offset, expected.scale_offset);
  EXPECT_EQ(cache.layout.rope_offset, expected.rope_offset);
  EXPECT_TRUE(check_kv_layout(cache.layout, "k_cache.layout").ok());
}

TEST(InferKVCache, ShapeAndStrideErrors) {
  KVCache cache;
  Status st = infer(Array({64, 656}, CacheArrayElement::kBytes), &cache);
  EXPECT_TRUE(has(st, "expected shape [num_blocks, page_size, 1, bytes_per_token]")) << st.message();
  st = infer(Array({2, 64, 2, 656}, CacheArrayElement::kBytes), &cache);
  EXPECT_TRUE(has(st, "expected one kv head (size 1 in dim 2), got 2")) << st.message();
  st = infer(Array({2, 0, 1, 656}, CacheArrayElement::kBytes), &cache);
  EXPECT_TRUE(has(st, "expected page_size (dim 1) >= 1")) << st.message();
  st = infer(Array({2, 64, 1, 576}, CacheArrayElement::kBF16, {64 * 1152, 1152, 1152, 2}), &cache);
  EXPECT_TRUE(has(st, "the last dimension must be contiguous (stride 1), got stride 2"))
      << st.message();
  st = infer(Array({2, 64, 1, 576}, CacheArrayElement::kBF16, {-64 * 576, 576, 576, 1}), &cache);
  EXPECT_TRUE(has(st, "negative strides are not supported")) << st.message();
  // A quantised cache's tokens are packed inside a block.
  st = infer(Array({2, 64, 1, 656}, CacheArrayElement::kBytes, {64 * 704, 704, 704, 1}), &cache);
  EXPECT_TRUE(has(st, "a quantised cache's tokens must be packed inside a block")) << st.message();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
}

// An empty cache (numpy 2 gives it all-zero strides) is packed.
TEST(InferKVCache, EmptyCacheIgnoresStrides) {
  KVCache cache;
  ASSERT_TRUE(infer(Array({0, 64, 1, 656}, CacheArrayElement::kBytes, {0, 0, 0, 0}), &cache).ok());
  EXPECT_EQ(cache.num_blocks, 0);
  EXPECT_EQ(cache.layout.block_stride, 64 * 656);
}

}  // namespace
}  // namespace openmla
