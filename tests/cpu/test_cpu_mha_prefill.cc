// Dense MHA prefill on the CPU backend (through the public API) against the double-precision
// oracle of tests/cpu/mha_oracle.h, forward and backward, on fresh random data.
// Tolerances, about 3x what was measured (relative L2 error): out <= 6e-3 (bf16) / 8e-4 (fp16),
// lse within 1e-4 · max(1, |ref|); gradients in fp32 <= 5e-3 (bf16 inputs) / 6e-4 (fp16), in
// q's dtype <= 8e-3 / 1e-3 (dq and dk carry the rounding of `out` through D = dout · out).
// Lonely queries: out exactly 0, lse exactly -inf, dq exactly 0.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "common/mha_inputs.h"
#include "common/test_data.h"
#include "cpu/mha_oracle.h"
#include "openmla/openmla.h"

namespace openmla::testing {
namespace {

struct MhaCase {
  std::vector<int64_t> seqlens_q, seqlens_kv;
  int64_t h_q = 8, h_kv = 8, d_qk = 192;
  DType dtype = DType::kBF16;
  bool causal = false;
  float softmax_scale = 0.f;
  bool strided = false;  // q, k, v as slices of packed rows; gaps in every output
  DType grad_dtype = DType::kFP32;
  uint64_t seed = 1;
};

constexpr int64_t kDv = 128;

struct MhaProblem : MhaInputs {
  MhaCase c;
  HostTensor out, lse, dq, dk, dv;

  explicit MhaProblem(const MhaCase& cs)
      : MhaInputs(cs.seqlens_q, cs.seqlens_kv, cs.h_q, cs.h_kv, cs.d_qk, kDv, cs.dtype, cs.strided,
                  cs.seed),
        c(cs) {
    const int64_t d = c.d_qk;
    // Outputs: padded rows when strided, and lse in FlashMLA's layout (strides (1, total_q)).
    out = HostTensor(c.dtype, {total_q, c.h_q, kDv}, {c.h_q * (kDv + pad), kDv + pad, 1});
    lse = c.strided ? HostTensor(DType::kFP32, {total_q, c.h_q}, {1, total_q + 3})
                    : HostTensor(DType::kFP32, {total_q, c.h_q}, {1, total_q});
    dq = HostTensor(c.grad_dtype, {total_q, c.h_q, d}, {c.h_q * (d + pad), d + pad, 1});
    dk = HostTensor(c.grad_dtype, {total_kv, c.h_kv, d}, {c.h_kv * (d + pad), d + pad, 1});
    dv = HostTensor(c.grad_dtype, {total_kv, c.h_kv, kDv}, {c.h_kv * (kDv + pad), kDv + pad, 1});
    for (HostTensor* t : {&out, &lse, &dq, &dk, &dv}) t->poison();
  }

  MhaPrefillArgs forward_args() const {
    MhaPrefillArgs a;
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.cu_seqlens_q = cu_q_t.view();
    a.cu_seqlens_kv = cu_kv_t.view();
    a.max_seqlen_q = max_q;
    a.max_seqlen_kv = max_kv;
    a.causal = c.causal;
    a.softmax_scale = c.softmax_scale;
    a.out = out.view();
    a.lse = lse.view();
    return a;
  }

  MhaPrefillBackwardArgs backward_args() const {
    MhaPrefillBackwardArgs a;
    a.dout = dout.view();
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.out = out.view();
    a.lse = lse.view();
    a.cu_seqlens_q = cu_q_t.view();
    a.cu_seqlens_kv = cu_kv_t.view();
    a.max_seqlen_q = max_q;
    a.max_seqlen_kv = max_kv;
    a.causal = c.causal;
    a.softmax_scale = c.softmax_scale;
    a.dq = dq.view();
    a.dk = dk.view();
    a.dv = dv.view();
    return a;
  }

  MhaOracleInput oracle_input() const {
    MhaOracleInput in;
    in.q = q.values();
    in.k = k.values();
    in.v = v.values();
    in.cu_q = cu_q;
    in.cu_kv = cu_kv;
    in.h_q = c.h_q;
    in.h_kv = c.h_kv;
    in.d_qk = c.d_qk;
    in.d_v = kDv;
    in.causal = c.causal;
    in.scale = c.softmax_scale > 0.f ? c.softmax_scale
                                     : 1.0 / std::sqrt(static_cast<double>(c.d_qk));
    return in;
  }
};

std::string describe(const MhaCase& c) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s d_qk=%lld h_q=%lld h_kv=%lld %s%s grads=%s",
                dtype_name(c.dtype), static_cast<long long>(c.d_qk),
                static_cast<long long>(c.h_q), static_cast<long long>(c.h_kv),
                c.causal ? "causal" : "non-causal", c.strided ? " strided" : "",
                dtype_name(c.grad_dtype));
  return buf;
}

// Runs forward and backward and checks both against the oracle.
void check_case(const MhaCase& c) {
  SCOPED_TRACE(describe(c));
  MhaProblem p(c);
  ASSERT_TRUE(mha_prefill(p.forward_args()).ok());
  const MhaOracleInput in = p.oracle_input();
  const MhaOracleForward ref = mha_oracle_forward(in);
  const bool bf16 = c.dtype == DType::kBF16;

  const std::vector<double> out = p.out.values(), lse = p.lse.values();
  const double out_err = relative_l2_error(out, ref.out);
  const double lse_err = max_lse_error(lse, ref.lse);
  EXPECT_LE(out_err, bf16 ? 6e-3 : 8e-4);  // ~1.7e-3 bf16, ~2.1e-4 fp16
  EXPECT_LE(lse_err, 1e-4);                // lonely rows: exactly -inf
  for (size_t row = 0; row < ref.lse.size(); ++row) {
    if (!std::isinf(ref.lse[row])) continue;
    for (int64_t d = 0; d < kDv; ++d) ASSERT_EQ(out[row * kDv + d], 0.0) << "lonely row " << row;
  }

  const MhaPrefillBackwardArgs bargs = p.backward_args();
  const Status st = mha_prefill_backward(bargs);
  ASSERT_TRUE(st.ok()) << st.message();
  const MhaOracleGrads grads = mha_oracle_backward(in, p.dout.values());
  const double tol = c.grad_dtype == DType::kFP32 ? (bf16 ? 5e-3 : 6e-4) : (bf16 ? 8e-3 : 1e-3);
  const double dq_err = relative_l2_error(p.dq.values(), grads.dq);
  const double dk_err = relative_l2_error(p.dk.values(), grads.dk);
  const double dv_err = relative_l2_error(p.dv.values(), grads.dv);
  // fp32 grads: dq, dk ~1.2e-3 (bf16) / 1.6e-4 (fp16), dv ~1e-7; in q's dtype ~2e-3 / 2.2e-4.
  EXPECT_LE(dq_err, tol);
  EXPECT_LE(dk_err, tol);
  EXPECT_LE(dv_err, tol);
  const std::vector<double> dq = p.dq.values();
  for (size_t row = 0; row < ref.lse.size(); ++row) {
    if (!std::isinf(ref.lse[row])) continue;
    for (int64_t d = 0; d < c.d_qk; ++d) ASSERT_EQ(dq[row * c.d_qk + d], 0.0) << "lonely row";
  }
  for (const HostTensor* t : {&p.out, &p.lse, &p.dq, &p.dk, &p.dv}) {
    EXPECT_EQ(count_written_gaps(*t), 0);
  }
  if (verbose()) {
    std::printf("[mha] %s: out %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n", describe(c).c_str(),
                out_err, lse_err, dq_err, dk_err, dv_err);
  }
}

// Sequences with s_q < s_kv, s_q > s_kv (causal: leading queries see no key), zero-length
// queries, zero-length keys, odd lengths, and one longer than a 64-row work chunk.
const std::vector<int64_t> kSeqQ = {5, 0, 70, 1, 17, 33};
const std::vector<int64_t> kSeqKv = {9, 4, 70, 0, 6, 40};

using Params = std::tuple<bool, int, DType, int>;  // causal, d_qk, dtype, h_q / h_kv

class MhaPrefillCpu : public ::testing::TestWithParam<Params> {};

TEST_P(MhaPrefillCpu, MatchesOracle) {
  const auto [causal, d_qk, dtype, ratio] = GetParam();
  MhaCase c;
  c.seqlens_q = kSeqQ;
  c.seqlens_kv = kSeqKv;
  c.causal = causal;
  c.d_qk = d_qk;
  c.dtype = dtype;
  c.h_q = 8;
  c.h_kv = 8 / ratio;
  c.seed = 100 + d_qk + 7 * ratio + (causal ? 1 : 0) + (dtype == DType::kFP16 ? 3 : 0);
  check_case(c);
}

INSTANTIATE_TEST_SUITE_P(Grid, MhaPrefillCpu,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(192, 128),
                                            ::testing::Values(DType::kBF16, DType::kFP16),
                                            ::testing::Values(1, 2, 8)));

TEST(MhaPrefillCpuCases, StridedPackedRowsAndFlashMlaLse) {
  for (bool causal : {false, true}) {
    MhaCase c;
    c.seqlens_q = {3, 65, 0, 12};
    c.seqlens_kv = {8, 65, 5, 12};
    c.h_q = 4;
    c.h_kv = 2;
    c.causal = causal;
    c.strided = true;
    c.seed = 7;
    check_case(c);
  }
}

TEST(MhaPrefillCpuCases, GradientsInQsDtypeAndExplicitScale) {
  for (DType dt : {DType::kBF16, DType::kFP16}) {
    MhaCase c;
    c.seqlens_q = {21, 2};
    c.seqlens_kv = {30, 2};
    c.h_q = 4;
    c.h_kv = 1;
    c.d_qk = 128;
    c.dtype = dt;
    c.grad_dtype = dt;
    c.causal = true;
    c.softmax_scale = 0.05f;
    c.seed = 11;
    check_case(c);
  }
}

TEST(MhaPrefillCpuCases, EmptyBatchAndAllEmptySequences) {
  MhaCase c;  // b = 0: cu_seqlens = [0]
  check_case(c);
  c.seqlens_q = {0, 0};
  c.seqlens_kv = {0, 3};
  check_case(c);
}

// The mask exactly: with q = 0 every visible key has the same logit, and with v_u = e_u (one-hot)
// out[t] = (1/n, ..., 1/n, 0, ...) over the n keys query t sees (rounded once to bf16).
TEST(MhaPrefillCpuCases, CausalMaskIsBottomRightAligned) {
  struct Lens {
    int64_t s_q, s_kv;
  };
  for (Lens l : {Lens{3, 5}, Lens{5, 3}, Lens{4, 4}}) {
    for (bool causal : {false, true}) {
      MhaCase c;
      c.seqlens_q = {l.s_q};
      c.seqlens_kv = {l.s_kv};
      c.h_q = c.h_kv = 1;
      c.causal = causal;
      MhaProblem p(c);
      p.q.for_each_index([&](const std::vector<int64_t>& i) { p.q.set(i, 0.0); });
      p.v.for_each_index([&](const std::vector<int64_t>& i) { p.v.set(i, i[0] == i[2]); });
      ASSERT_TRUE(mha_prefill(p.forward_args()).ok());
      for (int64_t t = 0; t < l.s_q; ++t) {
        // Query t sees keys u <= t + s_kv - s_q.
        const int64_t n = causal ? std::clamp<int64_t>(t + l.s_kv - l.s_q + 1, 0, l.s_kv) : l.s_kv;
        for (int64_t d = 0; d < kDv; ++d) {
          const double want = d < n ? bf16_bits_to_double(double_to_bf16_bits(1.0 / n)) : 0.0;
          EXPECT_EQ(p.out.get({t, 0, d}), want) << "s_q=" << l.s_q << " s_kv=" << l.s_kv
                                                << " t=" << t << " d=" << d;
        }
        const double lse = p.lse.get({t, 0});
        if (n == 0) {
          EXPECT_EQ(lse, -std::numeric_limits<double>::infinity());
        } else {
          EXPECT_NEAR(lse, std::log(static_cast<double>(n)), 1e-6);
        }
      }
    }
  }
}

// The oracle's gradients against central finite differences of its own forward (in double).
TEST(MhaPrefillCpuCases, OracleGradientsMatchFiniteDifferences) {
  Rng rng(5);
  MhaOracleInput in;
  in.cu_q = {0, 3, 7};
  in.cu_kv = {0, 5, 9};
  in.h_q = 2;
  in.h_kv = 1;
  in.d_qk = 128;
  in.d_v = 128;
  in.causal = true;
  in.scale = 0.1;
  auto randn = [&](size_t n) {
    std::vector<double> x(n);
    for (double& e : x) e = rng.normal();
    return x;
  };
  in.q = randn(7 * 2 * 128);
  in.k = randn(9 * 1 * 128);
  in.v = randn(9 * 1 * 128);
  const std::vector<double> dout = randn(7 * 2 * 128);
  const MhaOracleGrads g = mha_oracle_backward(in, dout);
  auto loss = [&](const MhaOracleInput& x) {
    const MhaOracleForward f = mha_oracle_forward(x);
    double l = 0.0;
    for (size_t i = 0; i < dout.size(); ++i) l += dout[i] * f.out[i];
    return l;
  };
  const double eps = 1e-5;
  for (int which = 0; which < 3; ++which) {
    std::vector<double>& x = which == 0 ? in.q : which == 1 ? in.k : in.v;
    const std::vector<double>& grad = which == 0 ? g.dq : which == 1 ? g.dk : g.dv;
    for (int trial = 0; trial < 12; ++trial) {
      const size_t i = static_cast<size_t>(rng.randint(0, static_cast<int64_t>(x.size()) - 1));
      const double x0 = x[i];
      x[i] = x0 + eps;
      const double up = loss(in);
      x[i] = x0 - eps;
      const double down = loss(in);
      x[i] = x0;
      const double fd = (up - down) / (2 * eps);
      EXPECT_NEAR(grad[i], fd, 1e-6 * std::max(1.0, std::fabs(fd)))
          << "tensor " << which << " element " << i;
    }
  }
}

// CUDA tensors (the validator reads no CUDA values, so these views never touch memory). In a
// build without the CUDA backend both directions are refused with UnsupportedDevice naming the
// operation. In a CUDA build the forward runs the SM90 kernel (tests/gpu/test_mha_prefill.cu), so
// it is not called on these host pointers; the backward without its workspace is refused before
// any device query (InvalidArgument naming it), on any machine.
TEST(MhaPrefillCpuCases, CudaTensorsWithoutKernel) {
  MhaCase c;
  c.seqlens_q = {4};
  c.seqlens_kv = {4};
  MhaProblem p(c);
  MhaPrefillBackwardArgs b = p.backward_args();
  for (TensorView* t : {&b.dout, &b.q, &b.k, &b.v, &b.out, &b.lse, &b.cu_seqlens_q,
                        &b.cu_seqlens_kv, &b.dq, &b.dk, &b.dv}) {
    t->device = Device::cuda(0);
  }
#ifndef OPENMLA_WITH_CUDA
  MhaPrefillArgs a = p.forward_args();
  for (TensorView* t : {&a.q, &a.k, &a.v, &a.cu_seqlens_q, &a.cu_seqlens_kv, &a.out, &a.lse}) {
    t->device = Device::cuda(0);
  }
  const Status fs = mha_prefill(a);
  EXPECT_EQ(fs.code(), StatusCode::kUnsupportedDevice) << fs.message();
  EXPECT_NE(fs.message().find("mha_prefill: "), std::string::npos) << fs.message();
#endif
  const Status bs = mha_prefill_backward(b);
  EXPECT_NE(bs.message().find("mha_prefill_backward: "), std::string::npos) << bs.message();
#ifdef OPENMLA_WITH_CUDA
  EXPECT_EQ(bs.code(), StatusCode::kInvalidArgument) << bs.message();
  EXPECT_NE(bs.message().find("workspace"), std::string::npos) << bs.message();
#else
  EXPECT_EQ(bs.code(), StatusCode::kUnsupportedDevice) << bs.message();
#endif
}

}  // namespace
}  // namespace openmla::testing
