// kv_cache_convert on the CPU backend (through the public API) against decode + encode done here
// with the host codec, slot by slot: after a conversion the whole dst buffer must equal, byte for
// byte, a copy with the same sentinel fill in which every converted slot was written with
// codec::encode_slot(codec::decode_slot(src)) — so untouched blocks, gaps and padding are
// compared too. Sources hold random tokens, sentinel bytes (0xFF/0xA5: NaN scales, NaN
// elements) and blocks of random bytes. Every pair of formats with one d_qk, default and
// interleaved layouts both ways, padded block strides, block lists that move blocks (within one
// cache too), and the argument errors, each naming its argument.
#include <gtest/gtest.h>

#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "common/kv_test_tokens.h"
#include "common/test_data.h"
#include "core/codec.h"
#include "openmla/openmla.h"

namespace openmla::testing {
namespace {

// A source cache: random tokens in most slots, the 0xA5 fill in some, random bytes in block 1.
HostKVCache make_source(const KVLayout& layout, int64_t num_blocks, Rng& rng) {
  HostKVCache src(layout, num_blocks, 0xA5);
  if (num_blocks > 1) {
    uint8_t* block = codec::block_ptr(src.cache.data, layout, 1);
    for (int64_t i = 0; i < kv_block_footprint_bytes(layout); ++i) {
      block[i] = static_cast<uint8_t>(rng.randint(0, 255));
    }
  }
  std::vector<int64_t> live;
  for (int64_t slot = 0; slot < src.cache.num_tokens(); ++slot) {
    if (slot / layout.page_size != 1 && slot % 5 != 3) live.push_back(slot);
  }
  fill_random_cache(&src, rng, live);
  return src;
}

// Reference: dst block dst_ids[i] = decode + encode of src block src_ids[i] (-1 skips).
void convert_on_host(const KVCache& src, const KVCache& dst, const std::vector<int64_t>& src_ids,
                     const std::vector<int64_t>& dst_ids) {
  const int d = kv_format_info(src.layout.format, src.layout.d_qk).d_qk;
  std::vector<float> row(d);
  for (size_t i = 0; i < src_ids.size(); ++i) {
    if (src_ids[i] < 0 || dst_ids[i] < 0) continue;
    for (int t = 0; t < src.layout.page_size; ++t) {
      codec::decode_slot(src, src_ids[i] * src.layout.page_size + t, row.data());
      codec::encode_slot(dst, dst_ids[i] * dst.layout.page_size + t, row.data());
    }
  }
}

std::vector<int64_t> iota_ids(int64_t n) {
  std::vector<int64_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = i;
  return ids;
}

HostTensor ids_tensor(const std::vector<int64_t>& ids, DType dtype) {
  HostTensor t(dtype, {static_cast<int64_t>(ids.size())});
  for (size_t i = 0; i < ids.size(); ++i)
    t.set({static_cast<int64_t>(i)}, static_cast<double>(ids[i]));
  return t;
}

TEST(KVConvert, EveryFormatPairMatchesDecodeThenEncode) {
  uint64_t seed = 1;
  int conversions = 0;
  for (const Target& from : kTargets) {
    for (const Target& to : kTargets) {
      if (from.d_qk != to.d_qk) continue;
      for (int combo = 0; combo < 4; ++combo) {
        const bool src_interleaved = combo & 1, dst_interleaved = combo & 2;
        SCOPED_TRACE(target_name(from) + (src_interleaved ? " interleaved" : " default") + " -> " +
                     target_name(to) + (dst_interleaved ? " interleaved" : " default"));
        Rng rng(seed++);
        const int page = combo == 3 ? 1 : 16;
        const int64_t num_blocks = combo == 3 ? 7 : 3;
        const KVLayout src_layout =
            test_layout(from.format, page, from.d_qk, src_interleaved, combo * 24);
        const KVLayout dst_layout =
            test_layout(to.format, page, to.d_qk, dst_interleaved, 40 - combo * 8);
        HostKVCache src = make_source(src_layout, num_blocks, rng);
        HostKVCache dst(dst_layout, num_blocks, 0x3C), expected(dst_layout, num_blocks, 0x3C);

        KVCacheConvertArgs args;
        args.src = src.cache;
        args.dst = dst.cache;
        const Status st = kv_cache_convert(args);
        ASSERT_TRUE(st.ok()) << st.message();
        convert_on_host(src.cache, expected.cache, iota_ids(num_blocks), iota_ids(num_blocks));
        ASSERT_EQ(std::memcmp(dst.buffer.data(), expected.buffer.data(), dst.buffer.bytes()), 0);
        ++conversions;
      }
    }
  }
  EXPECT_EQ(conversions, (9 + 25) * 4);
}

TEST(KVConvert, BlockListsMoveBlocksAndSkipMinusOne) {
  uint64_t seed = 100;
  for (DType id_dtype : {DType::kInt32, DType::kInt64}) {
    for (const auto& [from, to] :
         {std::pair<Target, Target>{{KVFormat::kFP8_V32, 576}, {KVFormat::kBF16, 576}},
          {{KVFormat::kBF16, 512}, {KVFormat::kFP8_MX, 512}},
          {{KVFormat::kBF16, 512}, {KVFormat::kFP4, 512}},
          {{KVFormat::kFP8_Model1, 512}, {KVFormat::kFP8_Model1, 512}}}) {
      SCOPED_TRACE(target_name(from) + " -> " + target_name(to) + " " + dtype_name(id_dtype));
      Rng rng(seed++);
      const KVLayout src_layout = test_layout(from.format, 16, from.d_qk, false, 0);
      const KVLayout dst_layout = test_layout(to.format, 16, to.d_qk, true, 16);
      HostKVCache src = make_source(src_layout, 6, rng);
      HostKVCache dst(dst_layout, 5, 0x3C), expected(dst_layout, 5, 0x3C);
      const std::vector<int64_t> src_ids = {4, 0, -1, 2, 5, 1};
      const std::vector<int64_t> dst_ids = {0, 3, 1, -1, 4, 2};
      HostTensor src_t = ids_tensor(src_ids, id_dtype), dst_t = ids_tensor(dst_ids, id_dtype);

      KVCacheConvertArgs args;
      args.src = src.cache;
      args.dst = dst.cache;
      args.src_blocks = src_t.view();
      args.dst_blocks = dst_t.view();
      const Status st = kv_cache_convert(args);
      ASSERT_TRUE(st.ok()) << st.message();
      convert_on_host(src.cache, expected.cache, src_ids, dst_ids);
      ASSERT_EQ(std::memcmp(dst.buffer.data(), expected.buffer.data(), dst.buffer.bytes()), 0);
    }
  }
}

// One cache as both src and dst: compaction moves blocks 5 -> 0 and 3 -> 1 (disjoint sets).
TEST(KVConvert, CompactsBlocksWithinOneCache) {
  Rng rng(7);
  const KVLayout layout = test_layout(KVFormat::kFP8_MX, 8, 512, false, 32);
  HostKVCache cache = make_source(layout, 6, rng);
  HostKVCache expected(layout, 6, 0);
  std::memcpy(expected.buffer.data(), cache.buffer.data(), cache.buffer.bytes());
  const std::vector<int64_t> src_ids = {5, 3}, dst_ids = {0, 1};
  HostTensor src_t = ids_tensor(src_ids, DType::kInt32), dst_t = ids_tensor(dst_ids, DType::kInt32);
  KVCacheConvertArgs args;
  args.src = cache.cache;
  args.dst = cache.cache;
  args.src_blocks = src_t.view();
  args.dst_blocks = dst_t.view();
  const Status st = kv_cache_convert(args);
  ASSERT_TRUE(st.ok()) << st.message();
  convert_on_host(expected.cache, expected.cache, src_ids, dst_ids);
  EXPECT_EQ(std::memcmp(cache.buffer.data(), expected.buffer.data(), cache.buffer.bytes()), 0);
}

TEST(KVConvert, EmptyConversionsAreNoOps) {
  const KVLayout layout = default_kv_layout(KVFormat::kBF16, 16, 512);
  HostKVCache src(layout, 0, 0x11), dst(layout, 0, 0x22);
  KVCacheConvertArgs args;
  args.src = src.cache;
  args.dst = dst.cache;
  EXPECT_TRUE(kv_cache_convert(args).ok());
  HostKVCache src2(layout, 2, 0x11), dst2(layout, 2, 0x22);
  HostTensor empty(DType::kInt32, {0});
  args.src = src2.cache;
  args.dst = dst2.cache;
  args.src_blocks = empty.view();
  args.dst_blocks = empty.view();
  EXPECT_TRUE(kv_cache_convert(args).ok()) << kv_cache_convert(args).message();
  for (size_t i = 0; i < dst2.buffer.bytes(); ++i) ASSERT_EQ(dst2.buffer.data()[i], 0x22);
}

void expect_invalid(const Status& st, std::initializer_list<const char*> needles) {
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
  for (const char* n : needles) {
    EXPECT_NE(st.message().find(n), std::string::npos)
        << "missing '" << n << "' in: " << st.message();
  }
}

TEST(KVConvert, RejectsEachBadArgumentNamingIt) {
  const KVLayout src_layout = default_kv_layout(KVFormat::kFP8_V32, 16, 576);
  const KVLayout dst_layout = default_kv_layout(KVFormat::kBF16, 16, 576);
  HostKVCache src(src_layout, 3), dst(dst_layout, 3), small(dst_layout, 2);
  HostTensor ids = ids_tensor({0, 1, 2}, DType::kInt32),
             short_ids = ids_tensor({0, 1}, DType::kInt32);
  HostTensor bad_ids = ids_tensor({0, 7, 1}, DType::kInt64), floats(DType::kFP32, {3});
  HostTensor matrix(DType::kInt32, {3, 1});
  const auto base = [&] {
    KVCacheConvertArgs a;
    a.src = src.cache;
    a.dst = dst.cache;
    return a;
  };
  KVCacheConvertArgs a = base();
  ASSERT_TRUE(kv_cache_convert(a).ok());

  a = base(), a.src.data = nullptr;
  expect_invalid(kv_cache_convert(a), {"kv_cache_convert", "src: required KV cache"});
  a = base(), a.dst.num_blocks = -1;
  expect_invalid(kv_cache_convert(a), {"dst.num_blocks: expected >= 0"});
  a = base(), a.dst.layout.block_stride = 8;
  expect_invalid(kv_cache_convert(a), {"dst.layout.block_stride"});
  a = base(), a.dst.layout = default_kv_layout(KVFormat::kBF16, 8, 576);
  expect_invalid(kv_cache_convert(a), {"dst.layout.page_size: expected 16", "got 8"});
  a = base(), a.dst.layout = default_kv_layout(KVFormat::kFP4, 16);
  expect_invalid(kv_cache_convert(a), {"dst.layout: expected a format of 576 dims", "fp4"});
  a = base(), a.dst.device = Device::cuda(0);
  expect_invalid(kv_cache_convert(a), {"dst: expected device cpu", "cuda:0"});
  a = base(), a.dst = small.cache;
  expect_invalid(kv_cache_convert(a), {"dst.num_blocks: expected 3", "got 2"});
  a = base(), a.dst = src.cache, a.dst.layout = default_kv_layout(KVFormat::kFP8_V32, 16, 576);
  expect_invalid(kv_cache_convert(a), {"dst: its memory overlaps src"});
  a = base(), a.src_blocks = ids.view();
  expect_invalid(kv_cache_convert(a), {"dst_blocks: required together with src_blocks"});
  a = base(), a.dst_blocks = ids.view();
  expect_invalid(kv_cache_convert(a), {"src_blocks: required together with dst_blocks"});
  a = base(), a.src_blocks = floats.view(), a.dst_blocks = ids.view();
  expect_invalid(kv_cache_convert(a), {"src_blocks: expected dtype int32 or int64", "fp32"});
  a = base(), a.src_blocks = ids.view(), a.dst_blocks = matrix.view();
  expect_invalid(kv_cache_convert(a), {"dst_blocks: expected 1 dimensions"});
  a = base(), a.src_blocks = ids.view(), a.dst_blocks = short_ids.view();
  expect_invalid(kv_cache_convert(a), {"dst_blocks: expected 3 entries", "got 2"});
  a = base(), a.src_blocks = bad_ids.view(), a.dst_blocks = ids.view();
  expect_invalid(kv_cache_convert(a),
                 {"src_blocks[1]: expected -1 (skip) or a block in [0, 3)", "got 7"});
  a = base(), a.src_blocks = ids.view(), a.dst_blocks = ids.view(), a.dst = small.cache;
  expect_invalid(kv_cache_convert(a),
                 {"dst_blocks[2]: expected -1 (skip) or a block in [0, 2)", "got 2"});
  TensorView on_gpu = ids.view();
  on_gpu.device = Device::cuda(0);
  a = base(), a.src_blocks = ids.view(), a.dst_blocks = on_gpu;
  expect_invalid(kv_cache_convert(a),
                 {"dst_blocks: expected device cpu (the caches' device)", "cuda:0"});
}

#ifndef OPENMLA_WITH_CUDA
TEST(KVConvert, CudaCachesWithoutCudaBackend) {
  const KVLayout layout = default_kv_layout(KVFormat::kBF16, 16, 576);
  HostKVCache src(layout, 1), dst(layout, 1);
  KVCacheConvertArgs a;
  a.src = src.cache;
  a.dst = dst.cache;
  a.src.device = a.dst.device = Device::cuda(0);
  const Status st = kv_cache_convert(a);
  EXPECT_EQ(st.code(), StatusCode::kUnsupportedDevice);
  EXPECT_NE(st.message().find("no CUDA backend"), std::string::npos) << st.message();
}
#endif

}  // namespace
}  // namespace openmla::testing
