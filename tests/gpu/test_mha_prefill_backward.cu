// Dense MHA prefill backward on the SM90 kernels against the CPU backend: the CPU forward gives
// out and lse, the CPU backward (fp32 gradients, double sums) the reference; the GPU runs on the
// same q, k, v, dout, out, lse with dq, dk, dv and the workspace poisoned (NaN) first.
// Checks, per gradient: nothing non-finite; per head, max |gpu - ref| <= tol * max |ref| of that
// head (tol 3e-2 for bf16 inputs, 1e-2 for fp16, plus the output dtype's rounding); the whole
// tensor's relative L2 error <= tol / 3; padding between rows (strided outputs) never written.
// Tests named *Small* run under compute-sanitizer memcheck (tools/device_check.sh).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "common/mha_inputs.h"
#include "common/test_data.h"
#include "gpu/gpu_test_util.h"
#include "openmla/openmla.h"

namespace openmla::testing {
namespace {

constexpr int64_t kDv = 128;

struct BwdCase {
  std::vector<int64_t> seqlens_q, seqlens_kv;
  int64_t h_q = 4, h_kv = 4, d_qk = 128;
  DType dtype = DType::kBF16;
  bool causal = false;
  DType grad_dtype = DType::kFP32;  // kFP32 or the inputs' dtype
  bool strided = false;             // q, k, v slices of packed rows; padded output rows
  uint64_t seed = 7;
};

struct BwdProblem : MhaInputs {
  BwdCase c;
  HostTensor out, lse, dq_ref, dk_ref, dv_ref;
  bool ok = true;  // the CPU forward and backward ran

  explicit BwdProblem(const BwdCase& cs)
      : MhaInputs(cs.seqlens_q, cs.seqlens_kv, cs.h_q, cs.h_kv, cs.d_qk, kDv, cs.dtype, cs.strided,
                  cs.seed),
        c(cs) {
    const int64_t d = c.d_qk;
    out = HostTensor(c.dtype, {total_q, c.h_q, kDv});
    lse = HostTensor(DType::kFP32, {total_q, c.h_q}, {1, total_q});  // FlashMLA's layout
    dq_ref = HostTensor(DType::kFP32, {total_q, c.h_q, d});
    dk_ref = HostTensor(DType::kFP32, {total_kv, c.h_kv, d});
    dv_ref = HostTensor(DType::kFP32, {total_kv, c.h_kv, kDv});

    MhaPrefillArgs f;
    f.q = q.view();
    f.k = k.view();
    f.v = v.view();
    f.cu_seqlens_q = cu_q_t.view();
    f.cu_seqlens_kv = cu_kv_t.view();
    f.max_seqlen_q = max_q;
    f.max_seqlen_kv = max_kv;
    f.causal = c.causal;
    f.out = out.view();
    f.lse = lse.view();
    const Status fs = mha_prefill(f);
    if (!fs.ok()) {
      ADD_FAILURE() << "CPU forward: " << fs.message();
      ok = false;
      return;
    }
    MhaPrefillBackwardArgs b = args(q.view(), k.view(), v.view(), dout.view(), out.view(),
                                    lse.view(), cu_q_t.view(), cu_kv_t.view());
    b.dq = dq_ref.view();
    b.dk = dk_ref.view();
    b.dv = dv_ref.view();
    const Status bs = mha_prefill_backward(b);
    if (!bs.ok()) {
      ADD_FAILURE() << "CPU backward: " << bs.message();
      ok = false;
    }
  }

  MhaPrefillBackwardArgs args(TensorView q_, TensorView k_, TensorView v_, TensorView dout_,
                              TensorView out_, TensorView lse_, TensorView cu_q_,
                              TensorView cu_kv_) const {
    MhaPrefillBackwardArgs a;
    a.dout = dout_;
    a.q = q_;
    a.k = k_;
    a.v = v_;
    a.out = out_;
    a.lse = lse_;
    a.cu_seqlens_q = cu_q_;
    a.cu_seqlens_kv = cu_kv_;
    a.max_seqlen_q = max_q;
    a.max_seqlen_kv = max_kv;
    a.causal = c.causal;
    return a;
  }
};

std::string describe(const BwdCase& c) {
  std::ostringstream s;
  s << dtype_name(c.dtype) << " d_qk " << c.d_qk << " h_q " << c.h_q << " h_kv " << c.h_kv
    << (c.causal ? " causal" : " non-causal") << " grads " << dtype_name(c.grad_dtype)
    << (c.strided ? " strided" : "") << " seqlens_q {";
  for (int64_t x : c.seqlens_q) s << x << " ";
  s << "} seqlens_kv {";
  for (int64_t x : c.seqlens_kv) s << x << " ";
  s << "}";
  return s.str();
}

// `got` (a GPU result copied back, [tokens, heads, dim] with row padding `pad`) against `ref`.
void expect_close(const char* name, const HostTensor& got, const HostTensor& ref, int64_t pad,
                  double tol, const std::string& what) {
  const int64_t tokens = ref.size(0), heads = ref.size(1), dim = ref.size(2);
  int64_t bad = 0, nonfinite = 0;
  std::string first;
  double err2 = 0, ref2 = 0;
  for (int64_t h = 0; h < heads; ++h) {
    double max_ref = 0;
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t d = 0; d < dim; ++d) max_ref = std::max(max_ref, std::fabs(ref.get({t, h, d})));
    }
    const double bound = tol * max_ref + 1e-6;
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t d = 0; d < dim; ++d) {
        const double g = got.get({t, h, d}), r = ref.get({t, h, d});
        err2 += (g - r) * (g - r);
        ref2 += r * r;
        const bool finite = std::isfinite(g);
        if (!finite) ++nonfinite;
        if (!finite || std::fabs(g - r) > bound) {
          if (bad++ == 0) {
            std::ostringstream s;
            s << "first at token " << t << " head " << h << " dim " << d << ": gpu " << g
              << " ref " << r << " (head's max |ref| " << max_ref << ", bound " << bound << ")";
            first = s.str();
          }
        }
      }
      for (int64_t d = dim; d < dim + pad && h + 1 < heads; ++d) {
        // The padding after each row (but the last head's, outside the view) stays poisoned.
        const double g = got.get_storage(got.offset({t, h, 0}) + d);
        if (!std::isnan(g)) {
          ADD_FAILURE() << what << ": " << name << " wrote padding at token " << t << " head "
                        << h << " offset " << d;
          return;
        }
      }
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << name << ": " << bad << " of " << ref.numel()
                    << " elements off (" << nonfinite << " not finite); " << first;
  const double rel = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  EXPECT_LE(rel, tol / 3) << what << ": " << name << ": relative L2 error " << rel;
  std::printf("  %s: relative L2 error %.2e\n", name, rel);
}

void run_case(const BwdCase& c) {
  const std::string what = describe(c);
  SCOPED_TRACE(what);
  BwdProblem pr(c);
  if (!pr.ok) return;

  DeviceTensor q = to_device(pr.q), k = to_device(pr.k), v = to_device(pr.v);
  DeviceTensor dout = to_device(pr.dout), out = to_device(pr.out), lse = to_device(pr.lse);
  DeviceTensor cu_q = to_device(pr.cu_q_t), cu_kv = to_device(pr.cu_kv_t);
  const int64_t d = c.d_qk, pad = pr.pad;
  HostTensor dq(c.grad_dtype, {pr.total_q, c.h_q, d}, {c.h_q * (d + pad), d + pad, 1});
  HostTensor dk(c.grad_dtype, {pr.total_kv, c.h_kv, d}, {c.h_kv * (d + pad), d + pad, 1});
  HostTensor dv(c.grad_dtype, {pr.total_kv, c.h_kv, kDv}, {c.h_kv * (kDv + pad), kDv + pad, 1});
  DeviceTensor dq_d = poisoned_like(dq), dk_d = poisoned_like(dk), dv_d = poisoned_like(dv);

  MhaPrefillBackwardArgs a = pr.args(q.view, k.view, v.view, dout.view, out.view, lse.view,
                                     cu_q.view, cu_kv.view);
  a.dq = dq_d.view;
  a.dk = dk_d.view;
  a.dv = dv_d.view;
  const size_t ws_bytes = mha_prefill_backward_workspace_size(
      Device::cuda(0), pr.total_q, pr.total_kv, c.h_q, c.h_kv, d, kDv);
  DeviceBuffer ws(ws_bytes);
  ws.poison();  // the kernels must not rely on a zeroed workspace
  a.workspace = {ws.data(), ws_bytes};

  // Too small a workspace is refused, naming it.
  if (ws_bytes > 0) {
    MhaPrefillBackwardArgs small = a;
    small.workspace.bytes = ws_bytes - 1;
    const Status st = mha_prefill_backward(small);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
    EXPECT_NE(st.message().find("workspace"), std::string::npos) << st.message();
  }

  const Status st = mha_prefill_backward(a);
  ASSERT_TRUE(st.ok()) << st.message();
  synchronize();
  copy_to_host(dq_d, &dq);
  copy_to_host(dk_d, &dk);
  copy_to_host(dv_d, &dv);

  const bool bf16 = c.dtype == DType::kBF16;
  double tol = bf16 ? 3e-2 : 1e-2;
  if (c.grad_dtype != DType::kFP32) tol += bf16 ? 8e-3 : 1e-3;  // the output's rounding
  expect_close("dq", dq, pr.dq_ref, pad, tol, what);
  expect_close("dk", dk, pr.dk_ref, pad, tol, what);
  expect_close("dv", dv, pr.dv_ref, pad, tol, what);
}

BwdCase make(std::vector<int64_t> sq, std::vector<int64_t> skv, int64_t h_q, int64_t h_kv,
             int64_t d_qk, DType dtype, bool causal, DType grad = DType::kFP32) {
  BwdCase c;
  c.seqlens_q = std::move(sq);
  c.seqlens_kv = std::move(skv);
  c.h_q = h_q;
  c.h_kv = h_kv;
  c.d_qk = d_qk;
  c.dtype = dtype;
  c.causal = causal;
  c.grad_dtype = grad;
  return c;
}

constexpr DType kBF16 = DType::kBF16;
constexpr DType kFP16 = DType::kFP16;

// --- small shapes (also under memcheck) --------------------------------------------------------

TEST(MhaPrefillBackwardGpu, SmallNonCausalD128Bf16) {
  run_case(make({63, 1, 129}, {63, 1, 129}, 4, 4, 128, kBF16, false));
}
TEST(MhaPrefillBackwardGpu, SmallCausalD128Bf16) {
  run_case(make({63, 1, 129}, {63, 1, 129}, 4, 4, 128, kBF16, true));
}
TEST(MhaPrefillBackwardGpu, SmallNonCausalD192Bf16) {
  run_case(make({63, 1, 129}, {63, 1, 129}, 4, 4, 192, kBF16, false));
}
TEST(MhaPrefillBackwardGpu, SmallCausalD192Bf16) {
  run_case(make({1, 63, 129}, {1, 63, 129}, 4, 4, 192, kBF16, true));
}
// s_q < s_kv (bottom-right causal), GQA 4, 16-bit gradients.
TEST(MhaPrefillBackwardGpu, SmallCausalShortQueriesGqa4D192) {
  run_case(make({17, 64, 100}, {129, 200, 100}, 8, 2, 192, kBF16, true, kBF16));
}
TEST(MhaPrefillBackwardGpu, SmallCausalShortQueriesGqa4D128Fp16) {
  run_case(make({17, 65, 3}, {129, 65, 130}, 4, 1, 128, kFP16, true, kFP16));
}
TEST(MhaPrefillBackwardGpu, SmallNonCausalGqa4D192Fp16) {
  run_case(make({33, 70}, {150, 9}, 8, 2, 192, kFP16, false));
}
// Zero-length sequences on either side; s_q > s_kv with causal (the first queries see no key:
// lse -inf, dq 0); keys no query sees (dk = dv = 0).
TEST(MhaPrefillBackwardGpu, SmallZeroLengthsAndLonelyQueries) {
  run_case(make({0, 5, 0, 10, 3}, {0, 0, 7, 4, 70}, 4, 2, 128, kBF16, true));
  run_case(make({0, 5, 0, 10, 3}, {0, 0, 7, 4, 70}, 4, 2, 192, kBF16, false, kBF16));
}
// Empty sides: no query at all (total_q 0: no workspace, yet dk = dv = 0 must be written for
// every key), no key at all (total_kv 0: dq = 0), and b = 0.
TEST(MhaPrefillBackwardGpu, SmallEmptySides) {
  run_case(make({0, 0}, {5, 130}, 4, 2, 128, kBF16, true));
  run_case(make({0, 0}, {5, 130}, 4, 2, 192, kFP16, false, kFP16));
  run_case(make({3, 70}, {0, 0}, 4, 4, 192, kBF16, false));
  run_case(make({}, {}, 4, 4, 128, kBF16, true));
}
// q, k, v as slices of packed rows; dq, dk, dv with padding between rows (never written).
TEST(MhaPrefillBackwardGpu, SmallStridedPacked) {
  BwdCase c = make({40, 77}, {90, 77}, 4, 4, 192, kBF16, true, kBF16);
  c.strided = true;
  run_case(c);
  c = make({40, 77}, {90, 77}, 4, 2, 128, kFP16, false);
  c.strided = true;
  run_case(c);
}

// --- longer ------------------------------------------------------------------------------------

TEST(MhaPrefillBackwardGpu, OddLengths500) {
  run_case(make({500, 129, 1}, {500, 257, 63}, 8, 8, 128, kBF16, false));
  run_case(make({500, 129, 1}, {500, 257, 63}, 8, 4, 192, kBF16, true));
}
TEST(MhaPrefillBackwardGpu, Length2048CausalD192) {
  run_case(make({2048}, {2048}, 2, 2, 192, kBF16, true));
}
TEST(MhaPrefillBackwardGpu, Length2048NonCausalD128Gqa4Fp16) {
  run_case(make({2048}, {2048}, 4, 1, 128, kFP16, false, kFP16));
}

}  // namespace
}  // namespace openmla::testing
