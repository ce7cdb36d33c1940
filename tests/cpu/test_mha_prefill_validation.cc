// Bad input to mha_prefill and mha_prefill_backward gets InvalidArgument naming the argument,
// and nothing is written. Each test starts from a valid argument set and breaks one thing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "openmla/openmla.h"

namespace openmla {
namespace {

void expect_invalid(const Status& st, std::initializer_list<const char*> needles) {
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
  for (const char* n : needles) {
    EXPECT_NE(st.message().find(n), std::string::npos)
        << "missing '" << n << "' in: " << st.message();
  }
}

// Two sequences: q lengths {3, 2}, kv lengths {4, 2}; h_q 4, h_kv 2, d_qk 192, d_v 128, bf16.
struct MhaFixture {
  int64_t total_q = 5, total_kv = 6, h_q = 4, h_kv = 2, d = 192, dv = 128;
  std::vector<uint16_t> q, k, v, out, dout, dq, dk, dvv;
  std::vector<int32_t> cu_q{0, 3, 5}, cu_kv{0, 4, 6};
  std::vector<float> lse;
  MhaPrefillArgs fwd;
  MhaPrefillBackwardArgs bwd;

  MhaFixture() {
    q.assign(total_q * h_q * d, 0x3F80);  // 1.0
    k.assign(total_kv * h_kv * d, 0x3F80);
    v.assign(total_kv * h_kv * dv, 0x3F80);
    out.assign(total_q * h_q * dv, 0x7FC0);  // NaN: a written element shows
    dout.assign(total_q * h_q * dv, 0x3F80);
    dq.assign(total_q * h_q * d, 0x7FC0);
    dk.assign(total_kv * h_kv * d, 0x7FC0);
    dvv.assign(total_kv * h_kv * dv, 0x7FC0);
    lse.assign(total_q * h_q, std::numeric_limits<float>::quiet_NaN());
    fwd.q = TensorView::contiguous(q.data(), DType::kBF16, {total_q, h_q, d});
    fwd.k = TensorView::contiguous(k.data(), DType::kBF16, {total_kv, h_kv, d});
    fwd.v = TensorView::contiguous(v.data(), DType::kBF16, {total_kv, h_kv, dv});
    fwd.cu_seqlens_q = TensorView::contiguous(cu_q.data(), DType::kInt32, {3});
    fwd.cu_seqlens_kv = TensorView::contiguous(cu_kv.data(), DType::kInt32, {3});
    fwd.max_seqlen_q = 3;
    fwd.max_seqlen_kv = 4;
    fwd.causal = true;
    fwd.out = TensorView::contiguous(out.data(), DType::kBF16, {total_q, h_q, dv});
    fwd.lse = TensorView::strided(lse.data(), DType::kFP32, {total_q, h_q}, {1, total_q});
    bwd.dout = TensorView::contiguous(dout.data(), DType::kBF16, {total_q, h_q, dv});
    bwd.q = fwd.q;
    bwd.k = fwd.k;
    bwd.v = fwd.v;
    bwd.out = TensorView::contiguous(dout.data(), DType::kBF16, {total_q, h_q, dv});
    bwd.lse = fwd.lse;
    bwd.cu_seqlens_q = fwd.cu_seqlens_q;
    bwd.cu_seqlens_kv = fwd.cu_seqlens_kv;
    bwd.max_seqlen_q = 3;
    bwd.max_seqlen_kv = 4;
    bwd.causal = true;
    bwd.dq = TensorView::contiguous(dq.data(), DType::kBF16, {total_q, h_q, d});
    bwd.dk = TensorView::contiguous(dk.data(), DType::kBF16, {total_kv, h_kv, d});
    bwd.dv = TensorView::contiguous(dvv.data(), DType::kBF16, {total_kv, h_kv, dv});
  }

  bool outputs_untouched() const {
    for (uint16_t x : out) {
      if (x != 0x7FC0) return false;
    }
    for (uint16_t x : dq) {
      if (x != 0x7FC0) return false;
    }
    for (float x : lse) {
      if (!std::isnan(x)) return false;
    }
    return true;
  }
};

TEST(MhaPrefillValidation, BaselineIsValid) {
  MhaFixture f;
  ASSERT_TRUE(mha_prefill(f.fwd).ok());
  for (float x : f.lse) EXPECT_TRUE(std::isfinite(x));
  MhaFixture g;
  ASSERT_TRUE(mha_prefill_backward(g.bwd).ok());
}

// Breaks the fixture's arguments with `edit`, expects InvalidArgument with `needles` from both
// operations (where the argument exists in both), and no output written.
void expect_both(const std::function<void(MhaFixture&, bool backward)>& edit,
                 std::initializer_list<const char*> needles) {
  MhaFixture f;
  edit(f, false);
  expect_invalid(mha_prefill(f.fwd), needles);
  EXPECT_TRUE(f.outputs_untouched());
  MhaFixture g;
  edit(g, true);
  expect_invalid(mha_prefill_backward(g.bwd), needles);
  EXPECT_TRUE(g.outputs_untouched());
}

// The argument named `which` of the forward or backward set.
TensorView& arg(MhaFixture& f, bool backward, const std::string& which) {
  if (which == "q") return backward ? f.bwd.q : f.fwd.q;
  if (which == "k") return backward ? f.bwd.k : f.fwd.k;
  if (which == "v") return backward ? f.bwd.v : f.fwd.v;
  if (which == "cu_q") return backward ? f.bwd.cu_seqlens_q : f.fwd.cu_seqlens_q;
  if (which == "cu_kv") return backward ? f.bwd.cu_seqlens_kv : f.fwd.cu_seqlens_kv;
  if (which == "lse") return backward ? f.bwd.lse : f.fwd.lse;
  return backward ? f.bwd.out : f.fwd.out;
}

TEST(MhaPrefillValidation, CuSeqlensValues) {
  // Not increasing.
  expect_both([](MhaFixture& f, bool) { f.cu_q = {0, 3, 2}; },
              {"cu_seqlens_q", "non-decreasing", "[1] = 3", "[2] = 2"});
  expect_both([](MhaFixture& f, bool) { f.cu_kv = {0, 4, 3}; },
              {"cu_seqlens_kv", "non-decreasing"});
  // Not starting at 0.
  expect_both([](MhaFixture& f, bool) { f.cu_q[0] = 1; }, {"cu_seqlens_q[0]", "expected 0"});
  // A length beyond the max.
  expect_both([](MhaFixture& f, bool b) { (b ? f.bwd.max_seqlen_q : f.fwd.max_seqlen_q) = 2; },
              {"cu_seqlens_q", "length 3", "max_seqlen_q = 2"});
  expect_both([](MhaFixture& f, bool b) { (b ? f.bwd.max_seqlen_kv : f.fwd.max_seqlen_kv) = 3; },
              {"cu_seqlens_kv", "length 4", "max_seqlen_kv = 3"});
  expect_both([](MhaFixture& f, bool b) { (b ? f.bwd.max_seqlen_kv : f.fwd.max_seqlen_kv) = -1; },
              {"max_seqlen_kv", ">= 0"});
  // Last entry not the token count.
  expect_both([](MhaFixture& f, bool) { f.cu_q[2] = 4; }, {"cu_seqlens_q[2]", "expected 5"});
  expect_both([](MhaFixture& f, bool) { f.cu_kv[2] = 7; }, {"cu_seqlens_kv[2]", "total_kv"});
  // Shapes and dtypes.
  expect_both([](MhaFixture& f, bool b) { arg(f, b, "cu_kv").shape[0] = 2; },
              {"cu_seqlens_kv", "expected 3 entries"});
  expect_both([](MhaFixture& f, bool b) { arg(f, b, "cu_q").dtype = DType::kInt64; },
              {"cu_seqlens_q", "int32"});
  expect_both([](MhaFixture& f, bool b) { arg(f, b, "cu_q").shape[0] = 0; },
              {"cu_seqlens_q", "b + 1 >= 1"});
}

TEST(MhaPrefillValidation, HeadDimsAndHeads) {
  expect_both([](MhaFixture& f, bool b) { arg(f, b, "q").shape[2] = 64; },
              {"q:", "192 or 128", "got 64"});
  expect_both([](MhaFixture& f, bool b) { arg(f, b, "k").shape[2] = 128; }, {"k:", "d_qk"});
  expect_both([](MhaFixture& f, bool b) { arg(f, b, "v").shape[2] = 64; },
              {"v:", "d_v", "128", "got 64"});
  expect_both([](MhaFixture& f, bool b) { arg(f, b, "k").shape[1] = 3; },
              {"k:", "h_kv", "dividing h_q = 4", "got 3"});
  expect_both([](MhaFixture& f, bool b) { arg(f, b, "v").shape[1] = 1; }, {"v:", "h_kv"});
  expect_both([](MhaFixture& f, bool b) { arg(f, b, "v").shape[0] = 5; }, {"v:", "total_kv"});
}

TEST(MhaPrefillValidation, DtypesDevicesStrides) {
  expect_both([](MhaFixture& f, bool b) { arg(f, b, "q").dtype = DType::kFP32; },
              {"q:", "bf16 or fp16", "got fp32"});
  expect_both([](MhaFixture& f, bool b) { arg(f, b, "k").dtype = DType::kFP16; },
              {"k:", "bf16", "got fp16"});
  expect_both([](MhaFixture& f, bool b) { arg(f, b, "v").dtype = DType::kFP16; }, {"v:"});
  expect_both([](MhaFixture& f, bool b) { arg(f, b, "out").dtype = DType::kFP32; }, {"out:"});
  expect_both([](MhaFixture& f, bool b) { arg(f, b, "lse").dtype = DType::kBF16; },
              {"lse:", "fp32"});
  expect_both([](MhaFixture& f, bool b) { arg(f, b, "lse").shape[1] = 2; }, {"lse:", "h_q"});
  expect_both([](MhaFixture& f, bool b) { arg(f, b, "k").device = Device::cuda(0); },
              {"k:", "device"});
  expect_both([](MhaFixture& f, bool b) { arg(f, b, "cu_kv").device = Device::cuda(0); },
              {"cu_seqlens_kv:", "device"});
  expect_both([](MhaFixture& f, bool b) { arg(f, b, "q").strides[2] = 2; },
              {"q:", "contiguous"});
  expect_both([](MhaFixture& f, bool b) { arg(f, b, "out").strides[2] = 2; },
              {"out:", "contiguous"});
  expect_both([](MhaFixture& f, bool b) { arg(f, b, "k") = TensorView{}; }, {"k:", "missing"});
  expect_both([](MhaFixture& f, bool b) { arg(f, b, "q").rank = 4; }, {"q:", "3 dimensions"});
  expect_both(
      [](MhaFixture& f, bool b) {
        (b ? f.bwd.softmax_scale : f.fwd.softmax_scale) = std::numeric_limits<float>::infinity();
      },
      {"softmax_scale"});
}

TEST(MhaPrefillValidation, BackwardOnlyArguments) {
  auto bad = [](const std::function<void(MhaFixture&)>& edit,
                std::initializer_list<const char*> needles) {
    MhaFixture f;
    edit(f);
    expect_invalid(mha_prefill_backward(f.bwd), needles);
    EXPECT_TRUE(f.outputs_untouched());
  };
  bad([](MhaFixture& f) { f.bwd.dout.dtype = DType::kFP16; }, {"dout:", "bf16"});
  bad([](MhaFixture& f) { f.bwd.dout.shape[2] = 64; }, {"dout:", "d_v"});
  bad([](MhaFixture& f) { f.bwd.out = TensorView{}; }, {"out:", "missing"});
  bad([](MhaFixture& f) { f.bwd.dq.dtype = DType::kFP16; },
      {"dq:", "bf16 (q's dtype) or fp32", "got fp16"});
  bad([](MhaFixture& f) { f.bwd.dk.shape[1] = 4; }, {"dk:", "h_kv"});
  bad([](MhaFixture& f) { f.bwd.dv.shape[2] = 192; }, {"dv:", "d_v"});
  bad([](MhaFixture& f) { f.bwd.dv.strides[2] = 3; }, {"dv:", "contiguous"});
  bad([](MhaFixture& f) { f.bwd.dq = TensorView{}; }, {"dq:", "missing"});
}

}  // namespace
}  // namespace openmla
