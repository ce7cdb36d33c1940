// merge_attention_states on the GPU against the CPU backend (the same public call on host copies
// of the same tensors): random data with empty parts (lse -inf, +inf or NaN, their values NaN),
// rows with no part at all, every dtype pair, strided and transposed lse views, padded rows
// (scalar path) and outputs poisoned before the launch with gaps that must stay untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "common/test_data.h"
#include "gpu/gpu_test_util.h"
#include "openmla/ops.h"

namespace openmla::testing {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

struct MergeCase {
  int64_t num_parts = 3, tokens = 4, heads = 8, d_v = 512;
  DType in_dtype = DType::kBF16, out_dtype = DType::kBF16;
  int64_t in_row_pad = 0;   // extra elements after each part_out row (breaks 16 B alignment if odd)
  int64_t out_row_pad = 0;  // extra elements after each out row (gaps that must stay poisoned)
  bool lse_transposed = false;  // part_lse stored [n, heads, tokens], lse stored [heads, tokens]
  bool with_lse = true;
  double empty_fraction = 0.2;  // share of (part, row) pairs marked empty
  uint64_t seed = 1;
};

void run_case(const MergeCase& c) {
  Rng rng(c.seed);
  const int64_t n = c.num_parts, t = c.tokens, h = c.heads, d = c.d_v;
  const int64_t row = d + c.in_row_pad;
  HostTensor part_out(c.in_dtype, {n, t, h, d}, {t * h * row, h * row, row, 1});
  part_out.poison();  // gaps and empty parts' values stay NaN
  HostTensor part_lse = c.lse_transposed ? HostTensor(DType::kFP32, {n, t, h}, {h * t, 1, t})
                                         : HostTensor(DType::kFP32, {n, t, h});
  const double empty_values[] = {-kInf, kInf, kNaN};
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t tok = 0; tok < t; ++tok) {
      for (int64_t hd = 0; hd < h; ++hd) {
        // Row 0 of head 0 has no part at all: out 0, lse +inf.
        const bool empty = (tok == 0 && hd == 0) || rng.coin(c.empty_fraction);
        if (empty) {
          part_lse.set({i, tok, hd}, empty_values[rng.randint(0, 2)]);
          continue;
        }
        part_lse.set({i, tok, hd}, 3.0 * rng.normal() + 5.0);
        for (int64_t e = 0; e < d; ++e) part_out.set({i, tok, hd, e}, rng.normal());
      }
    }
  }

  const int64_t out_row = d + c.out_row_pad;
  const std::vector<int64_t> out_strides = {h * out_row, out_row, 1};
  const std::vector<int64_t> lse_strides =
      c.lse_transposed ? std::vector<int64_t>{1, t} : std::vector<int64_t>{h, 1};
  HostTensor ref_out(c.out_dtype, {t, h, d}, out_strides),
      got_out(c.out_dtype, {t, h, d}, out_strides);
  HostTensor ref_lse(DType::kFP32, {t, h}, lse_strides), got_lse(DType::kFP32, {t, h}, lse_strides);
  ref_out.poison();
  ref_lse.poison();

  MergeStatesArgs cpu_args;
  cpu_args.part_out = part_out.view();
  cpu_args.part_lse = part_lse.view();
  cpu_args.out = ref_out.view();
  if (c.with_lse) cpu_args.lse = ref_lse.view();
  const Status cpu_st = merge_attention_states(cpu_args);
  ASSERT_TRUE(cpu_st.ok()) << cpu_st.message();

  DeviceTensor d_part_out = to_device(part_out), d_part_lse = to_device(part_lse);
  DeviceTensor d_out = poisoned_like(got_out), d_lse = poisoned_like(got_lse);
  MergeStatesArgs gpu_args;
  gpu_args.part_out = d_part_out.view;
  gpu_args.part_lse = d_part_lse.view;
  gpu_args.out = d_out.view;
  if (c.with_lse) gpu_args.lse = d_lse.view;
  const Status gpu_st = merge_attention_states(gpu_args, nullptr);
  ASSERT_TRUE(gpu_st.ok()) << gpu_st.message();
  synchronize();
  copy_to_host(d_out, &got_out);
  copy_to_host(d_lse, &got_lse);

  // Weights sum to 1, so |out| <= max |part value|; fp32 sums over n parts err by ~n ulp of that.
  double max_abs_in = 0.0;
  for (double v : part_out.values()) {
    if (std::isfinite(v)) max_abs_in = std::max(max_abs_in, std::fabs(v));
  }
  const double abs_tol = 1e-6 * static_cast<double>(n + 8) * max_abs_in;
  // A 16-bit output may round to the neighbouring value when the two fp32 results straddle a
  // rounding boundary: one ulp (2^-7 relative at the bottom of a binade for bf16).
  const double rel_tol = c.out_dtype == DType::kBF16   ? 0x1p-7
                         : c.out_dtype == DType::kFP16 ? 0x1p-10
                                                       : 0.0;
  int64_t bad = 0;
  ref_out.for_each_index([&](const std::vector<int64_t>& i) {
    const double r = ref_out.get(i), g = got_out.get(i);
    if (!(std::fabs(g - r) <= abs_tol + rel_tol * std::fabs(r)) && bad++ < 8) {
      ADD_FAILURE() << "out[" << i[0] << ", " << i[1] << ", " << i[2] << "] = " << g
                    << ", CPU backend " << r;
    }
  });
  EXPECT_EQ(bad, 0) << "out elements out of tolerance";
  EXPECT_LT(relative_l2_error(got_out.values(), ref_out.values()), 1e-2);
  for (int64_t hd = 0; hd < h; ++hd) EXPECT_EQ(got_out.get({0, 0, hd}), 0.0) << "empty row";
  EXPECT_EQ(count_written_gaps(got_out), 0) << "out written outside its view";
  if (c.with_lse) {
    EXPECT_LE(max_lse_error(got_lse.values(), ref_lse.values()), 1e-5);
    EXPECT_EQ(got_lse.get({0, 0}), kInf) << "row without parts";
    EXPECT_EQ(count_written_gaps(got_lse), 0) << "lse written outside its view";
  }
}

TEST(MergeStatesGpu, SmallBf16) { run_case({}); }

TEST(MergeStatesGpu, SmallFp32StridedLse) {
  MergeCase c;
  c.in_dtype = c.out_dtype = DType::kFP32;
  c.lse_transposed = true;
  c.in_row_pad = 4;  // 16 B-aligned padding: still the vector path
  c.out_row_pad = 8;
  c.seed = 2;
  run_case(c);
}

TEST(MergeStatesGpu, SmallEveryDtypePair) {
  const DType dtypes[] = {DType::kFP32, DType::kBF16, DType::kFP16};
  uint64_t seed = 10;
  for (DType in : dtypes) {
    for (DType out : dtypes) {
      SCOPED_TRACE(std::string(dtype_name(in)) + " -> " + dtype_name(out));
      MergeCase c;
      c.in_dtype = in;
      c.out_dtype = out;
      c.seed = seed++;
      run_case(c);
    }
  }
}

TEST(MergeStatesGpu, SmallUnalignedRowsTakeScalarPath) {
  MergeCase c;
  c.in_row_pad = 1;  // rows no longer start on 16 B
  c.out_row_pad = 3;
  c.seed = 3;
  run_case(c);
  c.in_row_pad = 0;
  c.d_v = 100;  // not a multiple of the 8-element vector
  c.seed = 4;
  run_case(c);
}

TEST(MergeStatesGpu, SmallSinglePartAndNoLse) {
  MergeCase c;
  c.num_parts = 1;
  c.with_lse = false;
  c.seed = 5;
  run_case(c);
}

TEST(MergeStatesGpu, SmallAllPartsEmpty) {
  MergeCase c;
  c.empty_fraction = 1.0;
  c.in_dtype = DType::kFP32;
  c.seed = 6;
  run_case(c);
}

// Split-KV-sized: one long request's 132 partials over 128 heads (FlashMLA's combine shape).
TEST(MergeStatesGpu, ManySplitsOneLongRequest) {
  MergeCase c;
  c.num_parts = 132;
  c.tokens = 2;
  c.heads = 128;
  c.in_dtype = DType::kFP32;
  c.empty_fraction = 0.05;
  c.seed = 7;
  run_case(c);
}

// Context-parallel-sized: 8 GPUs' partials of a 64-token decode batch.
TEST(MergeStatesGpu, ContextParallelEightParts) {
  MergeCase c;
  c.num_parts = 8;
  c.tokens = 64;
  c.heads = 128;
  c.in_dtype = DType::kBF16;
  c.out_dtype = DType::kBF16;
  c.lse_transposed = true;
  c.empty_fraction = 0.02;
  c.seed = 8;
  run_case(c);
}

// An operation launched on a stream runs on that stream (the result is there after syncing it).
TEST(MergeStatesGpu, SmallRunsOnTheGivenStream) {
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  HostTensor part_out(DType::kFP32, {2, 1, 1, 8}), part_lse(DType::kFP32, {2, 1, 1});
  for (int e = 0; e < 8; ++e) part_out.set({0, 0, 0, e}, 1.0), part_out.set({1, 0, 0, e}, 3.0);
  part_lse.set({0, 0, 0}, std::log(1.0));
  part_lse.set({1, 0, 0}, std::log(3.0));  // weights 1/4, 3/4: out = 2.5, lse = log 4
  HostTensor out(DType::kFP32, {1, 1, 8}), lse(DType::kFP32, {1, 1});
  DeviceTensor d_part_out = to_device(part_out), d_part_lse = to_device(part_lse);
  DeviceTensor d_out = poisoned_like(out), d_lse = poisoned_like(lse);
  MergeStatesArgs args;
  args.part_out = d_part_out.view;
  args.part_lse = d_part_lse.view;
  args.out = d_out.view;
  args.lse = d_lse.view;
  const Status st = merge_attention_states(args, stream);
  ASSERT_TRUE(st.ok()) << st.message();
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  copy_to_host(d_out, &out);
  copy_to_host(d_lse, &lse);
  check_cuda(cudaStreamDestroy(stream), "cudaStreamDestroy");
  for (int e = 0; e < 8; ++e) EXPECT_FLOAT_EQ(out.get({0, 0, e}), 2.5);
  EXPECT_NEAR(lse.get({0, 0}), std::log(4.0), 1e-6);
}

}  // namespace
}  // namespace openmla::testing
