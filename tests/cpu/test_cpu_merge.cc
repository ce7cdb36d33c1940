// Merge of partial attention states on the CPU backend (through the public API) against the
// double-precision oracle. Tolerances: ‖out − ref‖/‖ref‖ <= 1e-5 for fp32 outputs, 1e-2 for
// bf16 and 2e-3 for fp16 (the output rounding); lse within 1e-5 · max(1, |lse|); empty
// (token, head)s exactly out 0, lse +inf.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "common/test_data.h"
#include "cpu/oracle.h"
#include "openmla/openmla.h"

namespace openmla::testing {
namespace {

struct MergeCase {
  int64_t parts = 3, tokens = 4, heads = 5, d_v = 512;
  DType part_dtype = DType::kFP32, out_dtype = DType::kFP32;
  double empty_fraction = 0.0;  // parts with ±inf / NaN lse
  bool strided = false;         // part_lse a transposed view; gaps in part_out, out and lse
  bool with_lse = true;
  uint64_t seed = 1;
};

double tolerance(DType dtype) {
  return dtype == DType::kFP32 ? 1e-5 : dtype == DType::kBF16 ? 1e-2 : 2e-3;
}

void check_merge(const MergeCase& c) {
  SCOPED_TRACE(::testing::Message()
               << "parts=" << c.parts << " " << dtype_name(c.part_dtype) << " -> "
               << dtype_name(c.out_dtype) << " empty=" << c.empty_fraction << " seed=" << c.seed);
  Rng rng(c.seed);
  const int64_t n = c.parts, T = c.tokens, H = c.heads, D = c.d_v;
  HostTensor part_out, part_lse, out, lse;
  if (c.strided) {
    part_out = HostTensor(c.part_dtype, {n, T, H, D}, {T * H * (D + 4), H * (D + 4), D + 4, 1});
    // [n, tokens, heads] over a [n, heads, tokens] buffer, as a [n, b, h, s] decode lse is.
    part_lse = HostTensor(DType::kFP32, {n, T, H}, {T * H, 1, T});
    out = HostTensor(c.out_dtype, {T, H, D}, {H * (D + 8), D + 8, 1});
    lse = HostTensor(DType::kFP32, {T, H}, {1, T + 2});
  } else {
    part_out = HostTensor(c.part_dtype, {n, T, H, D});
    part_lse = HostTensor(DType::kFP32, {n, T, H});
    out = HostTensor(c.out_dtype, {T, H, D});
    lse = HostTensor(DType::kFP32, {T, H});
  }
  part_out.fill_normal(rng);
  const double special[] = {std::numeric_limits<double>::infinity(),
                            -std::numeric_limits<double>::infinity(),
                            std::numeric_limits<double>::quiet_NaN()};
  part_lse.for_each_index([&](const std::vector<int64_t>& i) {
    part_lse.set(i, rng.coin(c.empty_fraction) ? special[rng.randint(0, 2)] : rng.uniform(-6, 6));
  });
  out.poison();
  lse.poison();

  MergeStatesArgs args;
  args.part_out = part_out.view();
  args.part_lse = part_lse.view();
  args.out = out.view();
  if (c.with_lse) args.lse = lse.view();
  const Status st = merge_attention_states(args);
  ASSERT_TRUE(st.ok()) << st.message();

  const OracleOutputs ref = oracle_merge(part_out, part_lse);
  const std::vector<double> got = out.values();
  if (verbose()) {
    std::printf("merge %s->%s: out rel %.2e, lse %.2e\n", dtype_name(c.part_dtype),
                dtype_name(c.out_dtype), relative_l2_error(got, ref.out),
                c.with_lse ? max_lse_error(lse.values(), ref.lse) : 0.0);
  }
  EXPECT_LE(relative_l2_error(got, ref.out), tolerance(c.out_dtype));
  if (c.with_lse) {
    EXPECT_LE(max_lse_error(lse.values(), ref.lse), 1e-5);
    EXPECT_EQ(count_written_gaps(lse), 0);
  } else {
    for (int64_t o = 0; o < lse.storage_elements(); ++o)
      EXPECT_TRUE(std::isnan(lse.get_storage(o)));
  }
  for (size_t k = 0; k < ref.out.size(); ++k) {
    if (ref.lse[k / D] == kOracleInf) {
      ASSERT_EQ(got[k], 0.0) << "element " << k;
    }
  }
  EXPECT_EQ(count_written_gaps(out), 0);
}

TEST(CpuMerge, RandomPartsEveryDtype) {
  uint64_t seed = 100;
  for (DType part : {DType::kFP32, DType::kBF16, DType::kFP16}) {
    for (DType out : {DType::kFP32, DType::kBF16, DType::kFP16}) {
      MergeCase c;
      c.part_dtype = part;
      c.out_dtype = out;
      c.parts = 2 + seed % 4;
      c.seed = seed++;
      check_merge(c);
    }
  }
}

TEST(CpuMerge, EmptyPartsAreSkipped) {
  for (double empty : {0.3, 0.7}) {
    MergeCase c;
    c.parts = 4;
    c.tokens = 6;
    c.empty_fraction = empty;
    c.seed = 200 + static_cast<uint64_t>(empty * 10);
    check_merge(c);
  }
}

TEST(CpuMerge, AllPartsEmpty) {
  MergeCase c;
  c.empty_fraction = 1.0;
  c.seed = 300;
  check_merge(c);  // the oracle says out 0, lse +inf everywhere
}

TEST(CpuMerge, OnePartIsItself) {
  MergeCase c;
  c.parts = 1;
  c.seed = 400;
  check_merge(c);
  // Exactly: the weight of a single part is exp(0) = 1.
  Rng rng(401);
  HostTensor part_out(DType::kFP32, {1, 2, 3, 64}), part_lse(DType::kFP32, {1, 2, 3});
  HostTensor out(DType::kFP32, {2, 3, 64}), lse(DType::kFP32, {2, 3});
  part_out.fill_normal(rng);
  part_lse.fill_normal(rng, 3.0);
  MergeStatesArgs args;
  args.part_out = part_out.view();
  args.part_lse = part_lse.view();
  args.out = out.view();
  args.lse = lse.view();
  ASSERT_TRUE(merge_attention_states(args).ok());
  EXPECT_EQ(out.values(), part_out.values());
  EXPECT_EQ(lse.values(), part_lse.values());
}

TEST(CpuMerge, StridedViewsAndNoLse) {
  uint64_t seed = 500;
  for (bool with_lse : {true, false}) {
    MergeCase c;
    c.strided = true;
    c.empty_fraction = 0.2;
    c.part_dtype = DType::kBF16;
    c.out_dtype = DType::kBF16;
    c.with_lse = with_lse;
    c.seed = seed++;
    check_merge(c);
  }
}

}  // namespace
}  // namespace openmla::testing
