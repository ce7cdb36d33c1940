// Dense decode over a KVCache of any format (DenseDecodeArgs::kv_cache) on the CPU backend: the
// same call with the cache dequantised into a plain bf16 k_cache must give the same bits (every
// dequantised key is exact in bf16: e4m3 or e2m1 elements times power-of-two or e4m3 scales), and
// the plain path is itself checked against the oracle by test_cpu_dense_decode.cc. Slots no
// request reaches hold NaN bytes. Plus the argument errors of the new field.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/test_data.h"
#include "core/codec.h"
#include "openmla/openmla.h"

namespace openmla::testing {
namespace {

struct KVDenseCase {
  KVFormat format = KVFormat::kFP8_V32;
  int d_qk = 576;
  bool interleaved = false;
  int64_t b = 3, s_q = 1, h_q = 16, page = 16;
  bool causal = false;
  uint64_t seed = 1;
};

void check_kv_dense(const KVDenseCase& c) {
  SCOPED_TRACE(std::string(kv_format_name(c.format)) + (c.interleaved ? " interleaved" : "") +
               " s_q " + std::to_string(c.s_q) + (c.causal ? " causal" : "") + " seed " +
               std::to_string(c.seed));
  Rng rng(c.seed);
  const int d = kv_format_info(c.format, c.d_qk).d_qk;
  std::vector<int32_t> seqlens;
  int64_t used = 0, max_blocks = 1;
  for (int64_t i = 0; i < c.b; ++i) {
    seqlens.push_back(static_cast<int32_t>(i == 1 ? 0 : rng.randint(c.s_q, 90)));
    used += (seqlens.back() + c.page - 1) / c.page;
    max_blocks = std::max<int64_t>(max_blocks, (seqlens.back() + c.page - 1) / c.page);
  }
  const int64_t num_blocks = used + 2;
  HostKVCache cache(test_layout(c.format, static_cast<int>(c.page), c.d_qk, c.interleaved, 32),
                    num_blocks);
  const std::vector<int32_t> perm = random_permutation(num_blocks, rng);
  HostTensor table(DType::kInt32, {c.b, max_blocks}), lens(DType::kInt32, {c.b});
  std::vector<int64_t> live;
  int64_t next = 0;
  for (int64_t i = 0; i < c.b; ++i) {
    const int64_t blocks = (seqlens[i] + c.page - 1) / c.page;
    for (int64_t j = 0; j < max_blocks; ++j) {
      const int32_t id = j < blocks ? perm[next++] : -1;
      table.set({i, j}, id);
      if (id >= 0) {
        for (int64_t t = 0; t < c.page; ++t) live.push_back(id * c.page + t);
      }
    }
    lens.set({i}, seqlens[i]);
  }
  fill_random_cache(&cache, rng, live);
  // The same keys as a plain bf16 cache [num_blocks, page, 1, d]; other slots NaN.
  HostTensor plain(DType::kBF16, {num_blocks, c.page, 1, d});
  plain.poison();
  std::vector<float> row(d);
  for (int64_t slot : live) {
    codec::decode_slot(cache.cache, slot, row.data());
    for (int e = 0; e < d; ++e) plain.set({slot / c.page, slot % c.page, 0, e}, row[e]);
  }
  HostTensor q(DType::kBF16, {c.b, c.s_q, c.h_q, d});
  q.fill_normal(rng, 1.5);
  HostTensor out_a(DType::kBF16, {c.b, c.s_q, c.h_q, 512}), lse_a(DType::kFP32, {c.b, c.h_q, c.s_q});
  HostTensor out_b(DType::kBF16, {c.b, c.s_q, c.h_q, 512}), lse_b(DType::kFP32, {c.b, c.h_q, c.s_q});
  out_a.poison(), lse_a.poison(), out_b.poison(), lse_b.poison();

  DenseDecodeArgs a;
  a.q = q.view();
  a.kv_cache = cache.cache;
  a.block_table = table.view();
  a.cache_seqlens = lens.view();
  a.causal = c.causal;
  a.out = out_a.view();
  a.lse = lse_a.view();
  const Status st = dense_decode(a);
  ASSERT_TRUE(st.ok()) << st.message();
  DenseDecodeArgs b = a;
  b.kv_cache = KVCache{};
  b.k_cache = plain.view();
  b.out = out_b.view();
  b.lse = lse_b.view();
  const Status st_b = dense_decode(b);
  ASSERT_TRUE(st_b.ok()) << st_b.message();
  const std::vector<double> oa = out_a.values(), ob = out_b.values();
  for (size_t k = 0; k < oa.size(); ++k) ASSERT_EQ(oa[k], ob[k]) << "out element " << k;
  EXPECT_EQ(lse_a.values(), lse_b.values());
  for (double x : oa) ASSERT_FALSE(std::isnan(x));
}

TEST(CpuDenseDecodeKVCache, EveryFormatMatchesItsPlainBf16Copy) {
  uint64_t seed = 10;
  const std::pair<KVFormat, int> formats[] = {
      {KVFormat::kFP8_V32, 576}, {KVFormat::kFP8_Model1, 512}, {KVFormat::kFP8_MX, 512},
      {KVFormat::kFP4, 512},     {KVFormat::kBF16, 576},       {KVFormat::kBF16, 512}};
  for (const auto& [format, d_qk] : formats) {
    for (int variant = 0; variant < 3; ++variant) {
      KVDenseCase c;
      c.format = format;
      c.d_qk = d_qk;
      c.interleaved = variant == 2;
      c.s_q = variant == 0 ? 1 : 3;
      c.causal = variant != 0;
      c.h_q = variant == 1 ? 64 : 16;
      c.seed = seed++;
      check_kv_dense(c);
    }
  }
}

TEST(CpuDenseDecodeKVCache, ArgumentErrors) {
  HostKVCache cache(default_kv_layout(KVFormat::kFP8_V32, 16, 576), 2);
  HostTensor q(DType::kBF16, {1, 1, 16, 576}), table(DType::kInt32, {1, 2}),
      lens(DType::kInt32, {1}), out(DType::kBF16, {1, 1, 16, 512}), lse(DType::kFP32, {1, 16, 1}),
      plain(DType::kBF16, {2, 16, 1, 576});
  DenseDecodeArgs a;
  a.q = q.view();
  a.kv_cache = cache.cache;
  a.block_table = table.view();
  a.cache_seqlens = lens.view();
  a.out = out.view();
  a.lse = lse.view();
  a.k_cache = plain.view();  // both caches
  Status st = dense_decode(a);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("k_cache"), std::string::npos) << st.message();
  a.k_cache = TensorView{};
  HostTensor q512(DType::kBF16, {1, 1, 16, 512});
  a.q = q512.view();  // d_qk 512 against an fp8_v32 (d_qk 576) cache
  st = dense_decode(a);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("kv_cache"), std::string::npos) << st.message();
  HostTensor q16(DType::kFP16, {1, 1, 16, 576}), out16(DType::kFP16, {1, 1, 16, 512});
  a.q = q16.view();
  a.out = out16.view();  // fp16 q against a quantised cache
  st = dense_decode(a);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("q"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace openmla::testing
