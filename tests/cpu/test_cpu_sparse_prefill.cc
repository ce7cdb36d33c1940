// Sparse prefill on the CPU backend (through the public API) against the double-precision oracle.
// Tolerances: ‖out − ref‖/‖ref‖ <= 1e-2 (bf16 output; ~2e-3 seen), lse and max_logits within
// 1e-4 · max(1, |ref|); lonely queries exactly out 0, lse +inf, max_logits -inf.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <vector>

#include "common/test_data.h"
#include "cpu/oracle.h"
#include "openmla/openmla.h"

namespace openmla::testing {
namespace {

struct PrefillCase {
  int64_t s_q = 8, s_kv = 200, h_q = 16, h_kv = 1, d_qk = 576, topk = 64;
  bool topk_length = false;
  int sink = 0;          // 0: none, 1: finite, 2: mixed finite / +inf / -inf
  bool strided = false;  // gaps in q, kv and every output
  float softmax_scale = 0.f;
  uint64_t seed = 1;
};

struct PrefillProblem {
  PrefillCase c;
  HostTensor q, kv, indices, topk_length_t, sink_t, out, max_logits, lse;
  std::vector<int32_t> topk_length;
  std::vector<float> sink;
  SparsePrefillArgs args;

  explicit PrefillProblem(const PrefillCase& cs) : c(cs) {
    Rng rng(c.seed);
    const int64_t d = c.d_qk, d_v = 512, pad = c.strided ? 8 : 0;
    q = HostTensor(DType::kBF16, {c.s_q, c.h_q, d}, {c.h_q * (d + pad), d + pad, 1});
    q.fill_normal(rng, rng.uniform(0.5, 2.0));
    kv = HostTensor(DType::kBF16, {c.s_kv, c.h_kv, d}, {c.h_kv * (d + pad) + pad, d + pad, 1});
    kv.fill_normal(rng);
    // Entries: valid keys (some repeated), -1, other negatives, keys past s_kv.
    indices = HostTensor(DType::kInt32, {c.s_q, c.h_kv, c.topk});
    for (int64_t s = 0; s < c.s_q; ++s) {
      for (int64_t g = 0; g < c.h_kv; ++g) {
        for (int64_t e = 0; e < c.topk; ++e) {
          const double u = rng.uniform(0, 1);
          int64_t v = rng.randint(0, c.s_kv - 1);
          if (u < 0.1)
            v = -1;
          else if (u < 0.15)
            v = -rng.randint(2, 1 << 30);
          else if (u < 0.2)
            v = c.s_kv + rng.randint(0, 100);
          else if (u < 0.3 && e > 0)
            v = static_cast<int64_t>(indices.get({s, g, rng.randint(0, e - 1)}));
          indices.set({s, g, e}, static_cast<double>(v));
        }
      }
    }
    args.q = q.view();
    args.kv = kv.view();
    args.indices = indices.view();
    if (c.topk_length) {
      topk_length_t = HostTensor(DType::kInt32, {c.s_q});
      for (int64_t s = 0; s < c.s_q; ++s) {
        topk_length.push_back(s == 0 ? 0 : static_cast<int32_t>(rng.randint(0, c.topk)));
        topk_length_t.set({s}, topk_length.back());
      }
      args.topk_length = topk_length_t.view();
    }
    if (c.sink) {
      const float inf = std::numeric_limits<float>::infinity();
      sink_t = HostTensor(DType::kFP32, {c.h_q});
      for (int64_t h = 0; h < c.h_q; ++h) {
        float v = static_cast<float>(rng.uniform(-2, 6));
        if (c.sink == 2 && h % 3 == 1) v = inf;
        if (c.sink == 2 && h % 3 == 2) v = -inf;
        sink.push_back(v);
        sink_t.set({h}, v);
      }
      args.attn_sink = sink_t.view();
    }
    if (c.strided) {
      out = HostTensor(DType::kBF16, {c.s_q, c.h_q, d_v}, {c.h_q * (d_v + 8), d_v + 8, 1});
      max_logits = HostTensor(DType::kFP32, {c.s_q, c.h_q}, {1, c.s_q + 1});
      lse = HostTensor(DType::kFP32, {c.s_q, c.h_q}, {2 * c.h_q, 2});
    } else {
      out = HostTensor(DType::kBF16, {c.s_q, c.h_q, d_v});
      max_logits = HostTensor(DType::kFP32, {c.s_q, c.h_q});
      lse = HostTensor(DType::kFP32, {c.s_q, c.h_q});
    }
    out.poison();
    max_logits.poison();
    lse.poison();
    args.softmax_scale = c.softmax_scale;
    args.out = out.view();
    args.max_logits = max_logits.view();
    args.lse = lse.view();
  }
};

void check_prefill(const PrefillCase& c) {
  SCOPED_TRACE(::testing::Message()
               << "s_q=" << c.s_q << " h_q=" << c.h_q << " h_kv=" << c.h_kv << " d_qk=" << c.d_qk
               << " topk=" << c.topk << " sink=" << c.sink << " seed=" << c.seed);
  PrefillProblem p(c);
  const Status st = sparse_prefill(p.args);
  ASSERT_TRUE(st.ok()) << st.message();
  const double scale = c.softmax_scale > 0.f ? c.softmax_scale : 1.0 / std::sqrt(double(c.d_qk));
  const OracleOutputs ref =
      oracle_sparse_prefill(p.q, p.kv, p.indices, p.topk_length, p.sink, scale, 512);
  const std::vector<double> out = p.out.values(), lse = p.lse.values();
  const std::vector<double> max_logits = p.max_logits.values();
  if (verbose()) {
    std::printf("prefill h_q=%ld h_kv=%ld: out rel %.2e, lse %.2e, max %.2e\n", long(c.h_q),
                long(c.h_kv), relative_l2_error(out, ref.out), max_lse_error(lse, ref.lse),
                max_lse_error(max_logits, ref.max_logits));
  }
  EXPECT_LE(relative_l2_error(out, ref.out), 1e-2);
  EXPECT_LE(max_lse_error(lse, ref.lse), 1e-4);
  EXPECT_LE(max_lse_error(max_logits, ref.max_logits), 1e-4);
  for (size_t k = 0; k < ref.out.size(); ++k) {
    if (ref.out[k] == 0.0) {
      ASSERT_EQ(out[k], 0.0) << "element " << k;
    }
  }
  EXPECT_EQ(count_written_gaps(p.out), 0);
  EXPECT_EQ(count_written_gaps(p.lse), 0);
  EXPECT_EQ(count_written_gaps(p.max_logits), 0);
}

TEST(CpuSparsePrefill, HeadGroupingsAndDims) {
  const int64_t shapes[][3] = {{1, 1, 576},  {16, 1, 576}, {128, 1, 512},
                               {16, 2, 576}, {64, 4, 512}, {6, 3, 576}};
  uint64_t seed = 100;
  for (const auto& s : shapes) {
    PrefillCase c;
    c.h_q = s[0];
    c.h_kv = s[1];
    c.d_qk = s[2];
    c.s_q = s[0] >= 64 ? 3 : 8;
    c.seed = seed++;
    check_prefill(c);
  }
}

TEST(CpuSparsePrefill, TopkLengthIncludingZero) {
  PrefillCase c;
  c.topk_length = true;
  c.topk = 130;  // more than two key tiles
  c.h_kv = 2;
  c.seed = 200;
  check_prefill(c);
}

TEST(CpuSparsePrefill, AttnSinkFiniteAndInfinite) {
  for (int sink : {1, 2}) {
    PrefillCase c;
    c.sink = sink;
    c.topk_length = true;
    c.seed = 300 + sink;
    check_prefill(c);
  }
}

TEST(CpuSparsePrefill, StridedTensorsAndScale) {
  PrefillCase c;
  c.strided = true;
  c.h_kv = 2;
  c.h_q = 8;
  c.softmax_scale = 0.07f;
  c.seed = 400;
  check_prefill(c);
}

TEST(CpuSparsePrefill, AllIndicesInvalidIsLonely) {
  PrefillCase c;
  c.seed = 500;
  PrefillProblem p(c);
  for (int64_t s = 0; s < c.s_q; ++s) {
    for (int64_t e = 0; e < c.topk; ++e) p.indices.set({s, 0, e}, e % 2 ? -1 : c.s_kv + e);
  }
  ASSERT_TRUE(sparse_prefill(p.args).ok());
  for (double x : p.lse.values()) EXPECT_EQ(x, kOracleInf);
  for (double x : p.max_logits.values()) EXPECT_EQ(x, -kOracleInf);
  for (double x : p.out.values()) ASSERT_EQ(x, 0.0);
}

// The CPU backend needs no workspace, whatever the arguments (the from-cache overload included:
// an undefined cache, negative sizes).
TEST(CpuSparsePrefill, WorkspaceSizesOnTheCpu) {
  std::vector<uint8_t> bytes(4 * 16 * 584);
  KVCache cache;
  cache.data = bytes.data();
  cache.layout = default_kv_layout(KVFormat::kFP8_Model1, 16);
  cache.num_blocks = 4;
  EXPECT_EQ(sparse_prefill_workspace_size(Device::cpu(), 64, 128, 512), 0u);
  EXPECT_EQ(sparse_prefill_workspace_size(Device::cpu(), 64, 128, 512, 2048, cache), 0u);
  EXPECT_EQ(sparse_prefill_workspace_size(Device::cpu(), -1, 128, 512, -5, KVCache{}), 0u);
}

}  // namespace
}  // namespace openmla::testing
