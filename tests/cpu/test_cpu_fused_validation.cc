// The fused operations' argument checks (each error names its argument), their lonely-query and
// infinite-sink outputs, and fused_out_sf_layout.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "common/test_data.h"
#include "openmla/openmla.h"

namespace openmla::testing {
namespace {

// A valid prefill: s_q 3, h_q 4, d_qk = d_v = 128, one output group, s_kv 8, topk 4.
struct Prefill {
  HostTensor q{DType::kBF16, {3, 4, 128}};
  HostTensor kv{DType::kBF16, {8, 1, 128}};
  HostTensor indices{DType::kInt32, {3, 1, 4}};
  HostTensor positions{DType::kInt32, {3}};
  HostTensor cos_sin{DType::kFP32, {10, 64}};
  HostTensor topk_length{DType::kInt32, {3}};
  HostTensor sink{DType::kFP32, {4}};
  HostTensor out_fp8{DType::kUInt8, {3, 1, 512}};
  HostTensor out_sf;
  HostTensor lse{DType::kFP32, {3, 4}};
  HostTensor max_logits{DType::kFP32, {3, 4}};
  FusedPrefillArgs args;

  explicit Prefill(uint64_t seed) {
    Rng rng(seed);
    q.fill_normal(rng);
    kv.fill_normal(rng);
    for (int64_t s = 0; s < 3; ++s) {
      positions.set({s}, static_cast<double>(rng.randint(0, 9)));
      topk_length.set({s}, 4);
      for (int64_t e = 0; e < 4; ++e) indices.set({s, 0, e}, static_cast<double>(e + s));
    }
    for (int64_t p = 0; p < 10; ++p) {
      for (int i = 0; i < 32; ++i) {
        cos_sin.set({p, i}, std::cos(0.1 * p * (i + 1)));
        cos_sin.set({p, 32 + i}, std::sin(0.1 * p * (i + 1)));
      }
    }
    FusedOutSfLayout l;
    EXPECT_TRUE(fused_out_sf_layout(3, 1, 4, 128, &l).ok());
    out_sf = HostTensor(DType::kInt32, {3, 1, 4}, {l.strides[0], l.strides[1], l.strides[2]});
    args.fused.token_positions = positions.view();
    args.fused.cos_sin_cache = cos_sin.view();
    args.fused.n_wv_group = 1;
    args.q = q.view();
    args.kv = kv.view();
    args.indices = indices.view();
    args.d_v = 128;
    args.out_fp8 = out_fp8.view();
    args.out_sf = out_sf.view();
    args.lse = lse.view();
    args.max_logits = max_logits.view();
  }
  Status run() const { return fused_norm_rope_attn_rope_cast_prefill(args); }
};

void expect_invalid(const Status& st, const std::string& arg) {
  ASSERT_FALSE(st.ok()) << "expected an error naming " << arg;
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
  EXPECT_NE(st.message().find(arg), std::string::npos) << st.message();
}

TEST(CpuFusedValidation, ValidPrefillRuns) {
  Prefill p(1);
  const Status st = p.run();
  EXPECT_TRUE(st.ok()) << st.message();
}

TEST(CpuFusedValidation, PositionsOutsideTheCosSinCacheAreRefused) {
  for (double bad : {10.0, 11.0, -1.0}) {
    Prefill p(2);
    p.positions.set({1}, bad);
    expect_invalid(p.run(), "token_positions");
  }
  Prefill last(3);
  last.positions.set({2}, 9);  // the cache's last row
  EXPECT_TRUE(last.run().ok());
}

TEST(CpuFusedValidation, EachArgumentNamed) {
  {
    Prefill p(4);
    HostTensor q32(DType::kFP32, {3, 4, 128});
    p.args.q = q32.view();
    expect_invalid(p.run(), "q: expected dtype bf16");
  }
  {
    Prefill p(5);  // heads not contiguous within a token
    HostTensor wide(DType::kBF16, {3, 4, 128}, {4 * 256, 256, 1});
    p.args.q = wide.view();
    expect_invalid(p.run(), "q: each token's");
  }
  {
    Prefill p(6);
    HostTensor kv32(DType::kFP32, {8, 1, 128});
    p.args.kv = kv32.view();
    expect_invalid(p.run(), "kv");
  }
  {
    Prefill p(7);
    HostTensor pos64(DType::kInt64, {3});
    p.args.fused.token_positions = pos64.view();
    expect_invalid(p.run(), "token_positions");
  }
  {
    Prefill p(8);
    HostTensor cs(DType::kFP32, {10, 128});
    p.args.fused.cos_sin_cache = cs.view();
    expect_invalid(p.run(), "cos_sin_cache");
  }
  {
    Prefill p(9);
    p.args.fused.rope_dim = 128;
    expect_invalid(p.run(), "rope_dim");
  }
  {
    Prefill p(10);
    p.args.fused.is_rope_neox_style = true;
    expect_invalid(p.run(), "is_rope_neox_style");
  }
  {
    Prefill p(11);
    p.args.fused.num_per_channels = 128;
    expect_invalid(p.run(), "num_per_channels");
  }
  for (int flag = 0; flag < 3; ++flag) {
    Prefill p(12);
    bool* f[] = {&p.args.fused.use_tma_aligned_col_major_sf, &p.args.fused.round_sf,
                 &p.args.fused.use_packed_ue8m0};
    const char* names[] = {"use_tma_aligned_col_major_sf", "round_sf", "use_packed_ue8m0"};
    *f[flag] = false;
    expect_invalid(p.run(), names[flag]);
  }
  {
    Prefill p(13);
    p.args.fused.n_wv_group = 3;
    expect_invalid(p.run(), "n_wv_group");
  }
  {
    Prefill p(14);
    p.args.fused.rms_norm_eps = -1.f;
    expect_invalid(p.run(), "rms_norm_eps");
  }
  {
    Prefill p(15);  // row-major scale factors instead of the column-major layout
    HostTensor sf(DType::kInt32, {3, 1, 4});
    p.args.out_sf = sf.view();
    expect_invalid(p.run(), "out_sf");
  }
  {
    Prefill p(16);
    HostTensor o(DType::kUInt8, {3, 1, 256});
    p.args.out_fp8 = o.view();
    expect_invalid(p.run(), "out_fp8");
  }
  {
    Prefill p(17);
    HostTensor sink(DType::kFP32, {5});
    p.args.attn_sink = sink.view();
    expect_invalid(p.run(), "attn_sink");
  }
  {
    Prefill p(18);
    HostTensor len(DType::kInt32, {2});
    p.args.topk_length = len.view();
    expect_invalid(p.run(), "topk_length");
  }
  {
    Prefill p(19);
    p.args.d_v = 48;
    expect_invalid(p.run(), "d_v");
  }
  {
    Prefill p(23);  // a rank past kMaxTensorRank is refused before its shape is read
    p.args.out_sf.rank = 9;
    expect_invalid(p.run(), "out_sf: expected 0 to");
  }
}

TEST(CpuFusedValidation, DecodeCachesAndExtraArguments) {
  Prefill p(20);
  HostKVCache bf16(default_kv_layout(KVFormat::kBF16, 16, 512), 2);
  HostKVCache mx(default_kv_layout(KVFormat::kFP8_MX, 16, 512), 2);
  HostKVCache model1(default_kv_layout(KVFormat::kFP8_Model1, 16, 512), 2);
  HostKVCache fp4(default_kv_layout(KVFormat::kFP4, 16, 512), 2);
  HostTensor q(DType::kBF16, {3, 4, 512});
  HostTensor idx(DType::kInt32, {3, 4});
  HostTensor out_fp8(DType::kUInt8, {3, 1, 2048});
  FusedOutSfLayout l;
  ASSERT_TRUE(fused_out_sf_layout(3, 1, 4, 512, &l).ok());
  HostTensor out_sf(DType::kInt32, {3, 1, 16}, {l.strides[0], l.strides[1], l.strides[2]});
  FusedDecodeArgs a;
  a.fused = p.args.fused;
  a.q = q.view();
  a.k_cache = mx.cache;
  a.indices = idx.view();
  a.out_fp8 = out_fp8.view();
  a.out_sf = out_sf.view();
  a.lse = p.lse.view();
  EXPECT_TRUE(fused_norm_rope_attn_rope_cast_decode(a).ok());
  a.k_cache = bf16.cache;
  expect_invalid(fused_norm_rope_attn_rope_cast_decode(a), "k_cache");
  a.k_cache = fp4.cache;  // fp4 only as the extra cache
  expect_invalid(fused_norm_rope_attn_rope_cast_decode(a), "k_cache");
  a.k_cache = model1.cache;
  a.extra_k_cache = fp4.cache;  // fp4 pairs with V4.1's cache only
  a.extra_indices = idx.view();
  expect_invalid(fused_norm_rope_attn_rope_cast_decode(a), "extra_k_cache");
  a.k_cache = mx.cache;
  EXPECT_TRUE(fused_norm_rope_attn_rope_cast_decode(a).ok());
  a.extra_indices = TensorView{};
  expect_invalid(fused_norm_rope_attn_rope_cast_decode(a), "extra_indices");
  a.extra_k_cache = KVCache{};
  a.extra_topk_length = p.topk_length.view();
  expect_invalid(fused_norm_rope_attn_rope_cast_decode(a), "extra_topk_length");
}

#ifndef OPENMLA_WITH_CUDA
// Without a CUDA backend, CUDA tensors get a clear UnsupportedDevice, never a crash (the CUDA
// build runs them on the sparse kernel: tests/gpu/test_fused_attention.cu).
TEST(CpuFusedValidation, CudaTensorsWithoutCudaBackend) {
  Prefill p(21);
  FusedPrefillArgs a = p.args;
  for (TensorView* t : {&a.q, &a.kv, &a.indices, &a.fused.token_positions, &a.fused.cos_sin_cache,
                        &a.out_fp8, &a.out_sf, &a.lse, &a.max_logits}) {
    t->device = Device::cuda(0);
  }
  const Status st = fused_norm_rope_attn_rope_cast_prefill(a);
  EXPECT_EQ(st.code(), StatusCode::kUnsupportedDevice) << st.message();
  EXPECT_NE(st.message().find("no CUDA backend"), std::string::npos) << st.message();
  EXPECT_EQ(fused_norm_rope_attn_rope_cast_workspace_size(Device::cuda(0), 4, 64), 0u);
}
#endif

// topk_length 0 makes a lonely query: e4m3 zeros, every scale 2^-22 (amax clamped to 1e-4:
// ceil(log2(1e-4 / 448)) = -22, byte 105), lse +inf, max_logits -inf. A +inf sink zeroes the
// output the same way but keeps lse; a -inf sink changes nothing.
TEST(CpuFusedValidation, LonelyQueriesAndInfiniteSinks) {
  Prefill p(22);
  p.topk_length.set({0}, 0);
  p.args.topk_length = p.topk_length.view();
  const double inf = std::numeric_limits<double>::infinity();
  p.sink.set({0}, inf);
  p.sink.set({1}, -inf);
  p.sink.set({2}, 0.5);
  p.sink.set({3}, inf);
  p.args.attn_sink = p.sink.view();
  ASSERT_TRUE(p.run().ok());
  Prefill no_sink(22);  // same data, no sink
  no_sink.topk_length.set({0}, 0);
  no_sink.args.topk_length = no_sink.topk_length.view();
  ASSERT_TRUE(no_sink.run().ok());
  for (int64_t h = 0; h < 4; ++h) {
    EXPECT_EQ(p.lse.get({0, h}), inf);
    EXPECT_EQ(p.max_logits.get({0, h}), -inf);
  }
  auto chunk_zero = [&](int64_t s, int64_t h) {  // head h's 4 chunks (group of 4 heads)
    for (int64_t c = 0; c < 4; ++c) {
      const int64_t chunk = c * 4 + h;
      const auto word = static_cast<uint32_t>(static_cast<int32_t>(p.out_sf.get({s, 0, chunk / 4})));
      if (((word >> (8 * (chunk % 4))) & 0xFF) != 105) return false;
      for (int j = 0; j < 32; ++j) {
        if (p.out_fp8.get({s, 0, chunk * 32 + j}) != 0) return false;
      }
    }
    return true;
  };
  for (int64_t h = 0; h < 4; ++h) EXPECT_TRUE(chunk_zero(0, h)) << "lonely head " << h;
  for (int64_t s = 1; s < 3; ++s) {
    EXPECT_TRUE(chunk_zero(s, 0));
    EXPECT_TRUE(chunk_zero(s, 3));
    EXPECT_FALSE(chunk_zero(s, 1));
    EXPECT_TRUE(std::isfinite(p.lse.get({s, 0})));
    for (int64_t j = 0; j < 512; ++j) {  // head 1 (sink -inf) equals the run without a sink
      if (j / 32 % 4 == 1) {
        EXPECT_EQ(p.out_fp8.get({s, 0, j}), no_sink.out_fp8.get({s, 0, j}));
      }
    }
  }
}

TEST(CpuFusedValidation, OutSfLayout) {
  FusedOutSfLayout l;
  ASSERT_TRUE(fused_out_sf_layout(5, 8, 8, 512, &l).ok());  // V4: 64 heads, groups of 8
  EXPECT_EQ(l.aligned_s_q, 8);
  EXPECT_EQ(l.shape[2], 32);
  EXPECT_EQ(l.strides[0], 1);
  EXPECT_EQ(l.strides[1], 32 * 8);
  EXPECT_EQ(l.strides[2], 8);
  EXPECT_EQ(l.storage_ints, 8 * 32 * 8);
  EXPECT_FALSE(fused_out_sf_layout(5, 8, 1, 96, &l).ok());
  EXPECT_FALSE(fused_out_sf_layout(-1, 8, 8, 512, &l).ok());
  EXPECT_FALSE(fused_out_sf_layout(int64_t{1} << 30, int64_t{1} << 30, 8, 512, &l).ok());  // > 2^63
  EXPECT_FALSE(fused_out_sf_layout(4, 1, int64_t{1} << 40, 128, &l).ok());                // > 2^31
}

}  // namespace
}  // namespace openmla::testing
