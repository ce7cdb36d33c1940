// Dense decode on the CPU backend (through the public API) against the double-precision oracle.
// Tolerances: out within ‖out − ref‖/‖ref‖ <= 1e-2 for bf16 outputs (rounding to bf16 alone gives
// ~2e-3) and 2e-3 for fp16; lse within 1e-4 · max(1, |lse|); lonely queries exactly 0 / +inf.
// Unused cache slots and output gaps hold NaN, so a stray read or write shows.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common/test_data.h"
#include "cpu/attention_row.h"
#include "cpu/oracle.h"
#include "openmla/openmla.h"

namespace openmla::testing {
namespace {

struct DenseCase {
  int64_t b = 2, s_q = 1, h_q = 16, h_kv = 1, d_qk = 576, page = 64;
  DType dtype = DType::kBF16;
  bool causal = false;
  std::vector<int32_t> seqlens;  // one per request; empty: random in [0, 300]
  bool strided = false;          // gaps in k_cache (block, token, head), q, out and lse
  float softmax_scale = 0.f;
  uint64_t seed = 1;
};

// Everything a dense decode call needs, owned.
struct DenseProblem {
  DenseCase c;
  HostTensor q, k_cache, block_table, seqlens_t, out, lse;
  std::vector<std::vector<int32_t>> table;
  DenseDecodeArgs args;

  explicit DenseProblem(const DenseCase& cs) : c(cs) {
    Rng rng(c.seed);
    if (c.seqlens.empty()) {
      for (int64_t i = 0; i < c.b; ++i)
        c.seqlens.push_back(static_cast<int32_t>(rng.randint(0, 300)));
    }
    const int64_t d = c.d_qk, d_v = 512;
    int64_t used_blocks = 0, max_blocks = 1;
    for (int32_t len : c.seqlens) {
      used_blocks += (len + c.page - 1) / c.page;
      max_blocks = std::max<int64_t>(max_blocks, (len + c.page - 1) / c.page + rng.randint(0, 2));
    }
    const int64_t num_blocks = used_blocks + 3;
    const int64_t pad = c.strided ? 8 : 0;  // elements of gap per level
    const int64_t head_stride = d + pad, token_stride = c.h_kv * head_stride + pad;
    const int64_t block_stride = c.page * token_stride + (c.strided ? 3 * d : 0);
    k_cache = HostTensor(c.dtype, {num_blocks, c.page, c.h_kv, d},
                         {block_stride, token_stride, head_stride, 1});
    k_cache.poison();  // unused slots stay NaN

    // Each request gets its blocks from a random permutation; unused table entries are -1.
    const std::vector<int32_t> perm = random_permutation(num_blocks, rng);
    block_table = HostTensor(DType::kInt32, {c.b, max_blocks});
    table.assign(c.b, std::vector<int32_t>(max_blocks, -1));
    int64_t next = 0;
    for (int64_t i = 0; i < c.b; ++i) {
      const int64_t blocks = (c.seqlens[i] + c.page - 1) / c.page;
      for (int64_t j = 0; j < blocks; ++j) table[i][j] = perm[next++];
      for (int64_t j = 0; j < max_blocks; ++j) block_table.set({i, j}, table[i][j]);
      for (int64_t t = 0; t < c.seqlens[i]; ++t) {
        for (int64_t g = 0; g < c.h_kv; ++g) {
          for (int64_t e = 0; e < d; ++e) {
            k_cache.set({table[i][t / c.page], t % c.page, g, e}, rng.normal());
          }
        }
      }
    }
    seqlens_t = HostTensor(DType::kInt32, {c.b});
    for (int64_t i = 0; i < c.b; ++i) seqlens_t.set({i}, c.seqlens[i]);

    // Per-request query scale: sharper or flatter softmax.
    const int64_t q_head = d + pad;
    q = HostTensor(c.dtype, {c.b, c.s_q, c.h_q, d},
                   {c.s_q * c.h_q * q_head, c.h_q * q_head, q_head, 1});
    for (int64_t i = 0; i < c.b; ++i) {
      const double sigma = rng.uniform(0.3, 2.5);
      for (int64_t j = 0; j < c.s_q; ++j) {
        for (int64_t h = 0; h < c.h_q; ++h) {
          for (int64_t e = 0; e < d; ++e) q.set({i, j, h, e}, sigma * rng.normal());
        }
      }
    }
    if (c.strided) {
      const int64_t out_head = d_v + 16;
      out = HostTensor(c.dtype, {c.b, c.s_q, c.h_q, d_v},
                       {c.s_q * c.h_q * out_head + 32, c.h_q * out_head, out_head, 1});
      // lse [b, h_q, s_q] as a view of a [b, s_q, h_q + 1] buffer.
      lse = HostTensor(DType::kFP32, {c.b, c.h_q, c.s_q}, {c.s_q * (c.h_q + 1), 1, c.h_q + 1});
    } else {
      out = HostTensor(c.dtype, {c.b, c.s_q, c.h_q, d_v});
      lse = HostTensor(DType::kFP32, {c.b, c.h_q, c.s_q});
    }
    out.poison();
    lse.poison();

    args.q = q.view();
    args.k_cache = k_cache.view();
    args.block_table = block_table.view();
    args.cache_seqlens = seqlens_t.view();
    args.causal = c.causal;
    args.softmax_scale = c.softmax_scale;
    args.out = out.view();
    args.lse = lse.view();
  }

  double scale() const {
    return c.softmax_scale > 0.f ? c.softmax_scale : 1.0 / std::sqrt(static_cast<double>(c.d_qk));
  }
};

void check_dense(const DenseCase& c) {
  SCOPED_TRACE(::testing::Message()
               << "b=" << c.b << " s_q=" << c.s_q << " h_q=" << c.h_q << " h_kv=" << c.h_kv
               << " d_qk=" << c.d_qk << " page=" << c.page << " " << dtype_name(c.dtype)
               << (c.causal ? " causal" : "") << (c.strided ? " strided" : "")
               << " seed=" << c.seed);
  DenseProblem p(c);
  const Status st = dense_decode(p.args);
  ASSERT_TRUE(st.ok()) << st.message();
  const OracleOutputs ref =
      oracle_dense_decode(p.q, p.k_cache, p.table, p.c.seqlens, c.causal, p.scale(), 512);
  const std::vector<double> out = p.out.values(), lse = p.lse.values();
  const double tol = c.dtype == DType::kBF16 ? 1e-2 : 2e-3;
  if (verbose()) {
    std::printf("dense h_q=%ld h_kv=%ld page=%ld %s: out rel %.2e, lse %.2e\n", long(c.h_q),
                long(c.h_kv), long(c.page), dtype_name(c.dtype), relative_l2_error(out, ref.out),
                max_lse_error(lse, ref.lse));
  }
  EXPECT_LE(relative_l2_error(out, ref.out), tol);
  EXPECT_LE(max_lse_error(lse, ref.lse), 1e-4);
  // Lonely queries: exactly zero output (the lse check above already matched +inf exactly).
  for (size_t row = 0; row < ref.lse.size(); ++row) {
    if (ref.lse[row] != kOracleInf) continue;
    const int64_t i = row / (c.h_q * c.s_q), h = row / c.s_q % c.h_q, j = row % c.s_q;
    for (int64_t e = 0; e < 512; ++e) ASSERT_EQ(p.out.get({i, j, h, e}), 0.0);
  }
  EXPECT_EQ(count_written_gaps(p.out), 0);
  EXPECT_EQ(count_written_gaps(p.lse), 0);
}

TEST(CpuDenseDecode, HeadGroupings) {
  // (h_q, h_kv): MQA with 1..128 heads, and grouped kv heads where h_kv divides h_q.
  const int64_t groupings[][2] = {{1, 1}, {3, 1},  {16, 1}, {128, 1},
                                  {2, 2}, {16, 2}, {8, 4},  {64, 4}};
  uint64_t seed = 100;
  for (const auto& hg : groupings) {
    DenseCase c;
    c.h_q = hg[0];
    c.h_kv = hg[1];
    c.b = hg[0] >= 64 ? 1 : 2;
    c.seed = seed++;
    check_dense(c);
  }
}

TEST(CpuDenseDecode, PageSizesWithPermutedBlocks) {
  uint64_t seed = 200;
  for (int64_t page : {1, 16, 64, 256}) {
    DenseCase c;
    c.page = page;
    c.b = 3;
    c.h_q = 8;
    // Lengths around page boundaries, plus an odd one.
    c.seqlens = {static_cast<int32_t>(page), static_cast<int32_t>(page + 1),
                 static_cast<int32_t>(std::max<int64_t>(1, 3 * page - 1) % 400 + 5)};
    c.seed = seed++;
    check_dense(c);
  }
}

TEST(CpuDenseDecode, HeadDim512AndFp16) {
  uint64_t seed = 300;
  for (DType dtype : {DType::kBF16, DType::kFP16}) {
    for (int64_t d_qk : {576, 512}) {
      DenseCase c;
      c.dtype = dtype;
      c.d_qk = d_qk;
      c.h_q = 32;
      c.seed = seed++;
      check_dense(c);
    }
  }
}

TEST(CpuDenseDecode, MultiTokenQueriesWithAndWithoutCausal) {
  uint64_t seed = 400;
  for (int64_t s_q = 1; s_q <= 4; ++s_q) {
    for (bool causal : {false, true}) {
      DenseCase c;
      c.s_q = s_q;
      c.causal = causal;
      c.h_q = 16;
      c.b = 3;
      c.page = 16;
      // A length shorter than s_q leaves the first causal queries lonely.
      c.seqlens = {static_cast<int32_t>(s_q - 1), 37, 130};
      c.seed = seed++;
      check_dense(c);
    }
  }
}

TEST(CpuDenseDecode, EmptySequencesAreLonely) {
  DenseCase c;
  c.b = 3;
  c.s_q = 2;
  c.causal = true;
  c.seqlens = {0, 0, 0};
  c.seed = 500;
  check_dense(c);
  DenseProblem p(c);
  ASSERT_TRUE(dense_decode(p.args).ok());
  for (double x : p.lse.values()) EXPECT_EQ(x, kOracleInf);
  for (double x : p.out.values()) ASSERT_EQ(x, 0.0);
}

TEST(CpuDenseDecode, StridedCacheQueryAndOutputs) {
  uint64_t seed = 600;
  for (DType dtype : {DType::kBF16, DType::kFP16}) {
    DenseCase c;
    c.dtype = dtype;
    c.strided = true;
    c.h_q = 16;
    c.h_kv = 2;
    c.s_q = 2;
    c.causal = true;
    c.page = 16;
    c.seed = seed++;
    check_dense(c);
  }
}

TEST(CpuDenseDecode, ExplicitSoftmaxScale) {
  DenseCase c;
  c.softmax_scale = 0.11f;
  c.h_q = 8;
  c.seed = 700;
  check_dense(c);
}

TEST(CpuDenseDecode, RandomShapes) {
  Rng rng(800);
  for (int trial = 0; trial < 6; ++trial) {
    DenseCase c;
    c.h_kv = rng.coin(0.7) ? 1 : 2;
    c.h_q = c.h_kv * rng.randint(1, 24);
    c.b = rng.randint(1, 3);
    c.s_q = rng.randint(1, 3);
    c.causal = rng.coin();
    c.page = std::vector<int64_t>{1, 16, 64}[rng.randint(0, 2)];
    c.d_qk = rng.coin() ? 576 : 512;
    c.dtype = rng.coin(0.7) ? DType::kBF16 : DType::kFP16;
    c.strided = rng.coin();
    c.seed = 900 + trial;
    check_dense(c);
  }
}

// The result is bit-identical run to run and whatever the thread count.
TEST(CpuDenseDecode, DeterministicAcrossThreadCounts) {
  DenseCase c;
  c.b = 2;
  c.h_q = 64;
  c.s_q = 2;
  c.causal = true;
  c.seqlens = {333, 200};
  c.seed = 1000;
  DenseProblem p(c);
  ASSERT_TRUE(dense_decode(p.args).ok());
  const std::vector<double> out = p.out.values(), lse = p.lse.values();
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  DenseProblem p1(c);
  const Status st = dense_decode(p1.args);
  omp_set_num_threads(threads);
  ASSERT_TRUE(st.ok());
  const std::vector<double> out1 = p1.out.values(), lse1 = p1.lse.values();
  EXPECT_EQ(std::memcmp(out.data(), out1.data(), out.size() * sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(lse.data(), lse1.data(), lse.size() * sizeof(double)), 0);
}

}  // namespace
}  // namespace openmla::testing

namespace openmla::testing {
namespace {

// The backend's key/query conversions against the bit-level definitions, for every code.
TEST(CpuDenseDecode, HalfConversionsAreExactForEveryCode) {
  std::vector<uint16_t> codes(1 << 16);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint16_t>(i);
  std::vector<float> fp16(codes.size()), bf16(codes.size());
  cpu::fp16_to_float(codes.data(), 1, static_cast<int>(codes.size()), fp16.data());
  cpu::bf16_to_float(codes.data(), 1, static_cast<int>(codes.size()), bf16.data());
  for (size_t i = 0; i < codes.size(); ++i) {
    const double want16 = fp16_bits_to_double(codes[i]), wantb = bf16_bits_to_double(codes[i]);
    if (std::isnan(want16)) {
      EXPECT_TRUE(std::isnan(fp16[i])) << "fp16 code " << i;
    } else {
      ASSERT_EQ(fp16[i], want16) << "fp16 code " << i;
      ASSERT_EQ(std::signbit(fp16[i]), std::signbit(want16)) << "fp16 code " << i;
    }
    if (std::isnan(wantb)) {
      EXPECT_TRUE(std::isnan(bf16[i])) << "bf16 code " << i;
    } else {
      ASSERT_EQ(bf16[i], wantb) << "bf16 code " << i;
    }
  }
}

}  // namespace
}  // namespace openmla::testing
