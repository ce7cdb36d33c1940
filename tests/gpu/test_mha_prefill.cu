// SM90 dense MHA prefill forward against the CPU backend, through the public API, on fresh random
// data: d_qk 192 / 128, bf16 / fp16, causal and not, GQA ratios 1 / 4 / 16, odd lengths
// (1, 63, 127, 129, 1000) and 4096, s_q < s_kv and s_q > s_kv with causal masking (queries that
// see no key: out 0, lse -inf), zero-length sequences in the batch, lse in FlashMLA's layout
// (strides (1, total_q)) and row-major, strided q / k / v / out with gaps, a CUDA-graph capture,
// and misaligned strides refused with a message naming the argument. Outputs start poisoned
// (0xFF: NaN); a row the kernel forgot, or a byte written in a gap, shows. Each failing row is
// reported by (sequence, token, head). *Small* tests also run under memcheck.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "common/test_data.h"
#include "gpu/gpu_test_util.h"
#include "openmla/openmla.h"

namespace openmla::testing {
namespace {

struct MhaGpuCase {
  std::vector<int64_t> seq_q, seq_kv;
  int64_t h_q = 4, h_kv = 4, d_qk = 192;
  DType dtype = DType::kBF16;
  bool causal = false;
  bool lse_flashmla = true;  // lse strides (1, total_q); else row-major with a gap per row
  bool strided = false;      // q, k, v, out with padded strides (gaps between heads and tokens)
  float scale = 0.f;         // 0: the default, d_qk^-0.5
  int64_t extra_max = 0;     // max_seqlen_q / _kv this much above the longest (extra CTAs exit)
  uint64_t seed = 1;
  std::string name() const {
    auto list = [](const std::vector<int64_t>& v) {
      std::string s = "{";
      for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
      return s + "}";
    };
    return "s_q " + list(seq_q) + " s_kv " + list(seq_kv) + " h_q " + std::to_string(h_q) +
           " h_kv " + std::to_string(h_kv) + " d_qk " + std::to_string(d_qk) + " " +
           dtype_name(dtype) + (causal ? " causal" : "") +
           (lse_flashmla ? " lse(1,total)" : " lse row-major") + (strided ? " strided" : "") +
           (extra_max ? " max +" + std::to_string(extra_max) : "") + " seed " +
           std::to_string(seed);
  }
};

int64_t sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

HostTensor cu_of(const std::vector<int64_t>& lengths) {
  HostTensor t(DType::kInt32, {static_cast<int64_t>(lengths.size()) + 1});
  int64_t acc = 0;
  t.set({0}, 0);
  for (size_t i = 0; i < lengths.size(); ++i) t.set({static_cast<int64_t>(i) + 1}, acc += lengths[i]);
  return t;
}

// [rows, heads, dim]; strided: every head padded by 8 elements and every token by one head's
// worth (strides stay multiples of 8 elements, as the kernel needs).
HostTensor rows_tensor(DType dtype, int64_t rows, int64_t heads, int64_t dim, bool strided) {
  if (!strided) return HostTensor(dtype, {rows, heads, dim});
  const int64_t head_stride = dim + 8;
  return HostTensor(dtype, {rows, heads, dim}, {(heads + 1) * head_stride, head_stride, 1});
}

struct MhaGpuProblem {
  MhaGpuCase c;
  Rng rng;
  int64_t total_q, total_kv;
  HostTensor q, k, v, cu_q, cu_kv, out, lse;
  MhaPrefillArgs cpu, gpu;
  DeviceTensor dq, dk, dv, dcu_q, dcu_kv, dout, dlse;

  explicit MhaGpuProblem(const MhaGpuCase& cs)
      : c(cs), rng(cs.seed), total_q(sum(cs.seq_q)), total_kv(sum(cs.seq_kv)) {
    q = rows_tensor(c.dtype, total_q, c.h_q, c.d_qk, c.strided);
    k = rows_tensor(c.dtype, total_kv, c.h_kv, c.d_qk, c.strided);
    v = rows_tensor(c.dtype, total_kv, c.h_kv, 128, c.strided);
    q.fill_normal(rng, rng.uniform(0.5, 2.0));  // logits of varied sharpness
    k.fill_normal(rng, 1.0);
    v.fill_normal(rng, 1.0);
    cu_q = cu_of(c.seq_q);
    cu_kv = cu_of(c.seq_kv);
    out = rows_tensor(c.dtype, total_q, c.h_q, 128, c.strided);
    lse = c.lse_flashmla ? HostTensor(DType::kFP32, {total_q, c.h_q}, {1, total_q})
                         : HostTensor(DType::kFP32, {total_q, c.h_q}, {c.h_q + 3, 1});
    out.poison();
    lse.poison();
    cpu = args_of(q.view(), k.view(), v.view(), cu_q.view(), cu_kv.view(), out.view(),
                  lse.view());
    dq = to_device(q);
    dk = to_device(k);
    dv = to_device(v);
    dcu_q = to_device(cu_q);
    dcu_kv = to_device(cu_kv);
    dout = poisoned_like(out);
    dlse = poisoned_like(lse);
    gpu = args_of(dq.view, dk.view, dv.view, dcu_q.view, dcu_kv.view, dout.view, dlse.view);
  }

  MhaPrefillArgs args_of(const TensorView& q_, const TensorView& k_, const TensorView& v_,
                         const TensorView& cq, const TensorView& ckv, const TensorView& o,
                         const TensorView& l) const {
    MhaPrefillArgs a;
    a.q = q_, a.k = k_, a.v = v_, a.cu_seqlens_q = cq, a.cu_seqlens_kv = ckv, a.out = o, a.lse = l;
    a.max_seqlen_q = *std::max_element(c.seq_q.begin(), c.seq_q.end()) + c.extra_max;
    a.max_seqlen_kv = *std::max_element(c.seq_kv.begin(), c.seq_kv.end()) + c.extra_max;
    a.causal = c.causal;
    a.softmax_scale = c.scale;
    return a;
  }
};

// Compares a GPU result (out, lse copied back) with the CPU backend's, row by row: each
// (token, head) row's relative L2 error, lse within 1e-3 (absolute, or relative past 1), -inf
// and zeros exactly where the reference has them, and the gaps of the storage still poisoned.
void compare(const MhaGpuProblem& p, const HostTensor& out, const HostTensor& lse) {
  const double row_tol = p.c.dtype == DType::kBF16 ? 2e-2 : 1e-2;
  double worst_row = 0.0, worst_lse = 0.0;
  int reported = 0;
  std::vector<double> all_got, all_ref;
  for (size_t b = 0; b < p.c.seq_q.size(); ++b) {
    const int64_t q0 = static_cast<int64_t>(p.cu_q.get({static_cast<int64_t>(b)}));
    for (int64_t t = 0; t < p.c.seq_q[b]; ++t) {
      for (int64_t h = 0; h < p.c.h_q; ++h) {
        const int64_t token = q0 + t;
        double diff = 0.0, norm = 0.0;
        bool zero_ok = true, finite = true;
        for (int64_t d = 0; d < 128; ++d) {
          const double g = out.get({token, h, d}), r = p.out.get({token, h, d});
          all_got.push_back(g);
          all_ref.push_back(r);
          finite = finite && std::isfinite(g);
          diff += (g - r) * (g - r);
          norm += r * r;
          if (r == 0.0 && g != 0.0) zero_ok = false;
        }
        const double rel = norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
        const double lg = lse.get({token, h}), lr = p.lse.get({token, h});
        double lerr = 0.0;
        if (!std::isfinite(lr) || !std::isfinite(lg)) {
          lerr = (lg == lr) ? 0.0 : std::numeric_limits<double>::infinity();
        } else {
          lerr = std::fabs(lg - lr) / std::max(1.0, std::fabs(lr));
        }
        worst_row = std::max(worst_row, finite ? rel : std::numeric_limits<double>::infinity());
        worst_lse = std::max(worst_lse, lerr);
        const bool bad = !finite || rel > row_tol || lerr > 1e-3 || (norm == 0.0 && !zero_ok);
        if (bad && reported < 8) {
          ++reported;
          ADD_FAILURE() << "sequence " << b << " token " << t << " (of s_q " << p.c.seq_q[b]
                        << ", s_kv " << p.c.seq_kv[b] << ") head " << h << ": out row rel err "
                        << rel << " (ref norm " << std::sqrt(norm) << ", finite " << finite
                        << "), out[0..1] got " << out.get({token, h, 0}) << ", "
                        << out.get({token, h, 1}) << " ref " << p.out.get({token, h, 0}) << ", "
                        << p.out.get({token, h, 1}) << "; lse got " << lg << " ref " << lr;
        }
      }
    }
  }
  const double global = relative_l2_error(all_got, all_ref);
  if (verbose()) {
    std::printf("%s: out %.2e (worst row %.2e) lse %.2e\n", p.c.name().c_str(), global, worst_row,
                worst_lse);
  }
  EXPECT_LE(global, 1e-2) << "relative L2 error of the whole output";
  // Gaps of out's and lse's storage (strided layouts) were never written: still NaN.
  auto gaps_poisoned = [](const HostTensor& t, const char* name) {
    int64_t nan_count = 0;
    for (int64_t o = 0; o < t.storage_elements(); ++o) nan_count += std::isnan(t.get_storage(o));
    EXPECT_EQ(nan_count, t.storage_elements() - t.numel())
        << name << ": NaN elements in the storage should be exactly its gaps (a NaN inside the "
        << "view is a row not written; fewer NaN than gaps is a write outside the view)";
  };
  gaps_poisoned(out, "out");
  gaps_poisoned(lse, "lse");
}

void check(const MhaGpuCase& c) {
  SCOPED_TRACE(c.name());
  MhaGpuProblem p(c);
  const Status st = mha_prefill(p.cpu);
  ASSERT_TRUE(st.ok()) << st.message();
  p.dout.buffer.poison();
  p.dlse.buffer.poison();
  const Status gst = mha_prefill(p.gpu);
  ASSERT_TRUE(gst.ok()) << gst.message();
  synchronize();
  HostTensor out = same_layout(p.out), lse = same_layout(p.lse);
  copy_to_host(p.dout, &out);
  copy_to_host(p.dlse, &lse);
  compare(p, out, lse);
}

// Every (d_qk, dtype, causal) family on one batch.
void check_families(MhaGpuCase c) {
  for (int64_t d : {192, 128}) {
    for (DType dt : {DType::kBF16, DType::kFP16}) {
      for (bool causal : {false, true}) {
        c.d_qk = d, c.dtype = dt, c.causal = causal;
        ++c.seed;
        check(c);
      }
    }
  }
}

// --- small (also under compute-sanitizer memcheck) --------------------------------------------

TEST(MhaPrefillGpu, SmallEveryFamily) {
  MhaGpuCase c;
  c.seq_q = {1, 63, 0, 129, 5};
  c.seq_kv = {1, 63, 7, 129, 0};  // a sequence with queries and no key: out 0, lse -inf
  c.h_q = 4, c.h_kv = 2;
  check_families(c);
}

TEST(MhaPrefillGpu, SmallCausalQueriesShorterAndLongerThanKeys) {
  MhaGpuCase c;
  c.seq_q = {5, 17, 100, 130, 3};
  c.seq_kv = {300, 17, 129, 7, 0};  // s_q < s_kv (bottom-right), equal, s_q > s_kv (lonely rows)
  c.h_q = 2, c.h_kv = 1, c.causal = true;
  for (int64_t d : {192, 128}) {
    c.d_qk = d, ++c.seed;
    check(c);
  }
}

TEST(MhaPrefillGpu, SmallLseLayoutsStridesAndScale) {
  MhaGpuCase c;
  c.seq_q = {70, 0, 129};
  c.seq_kv = {70, 4, 200};
  c.h_q = 4, c.h_kv = 4;
  for (bool flashmla : {true, false}) {
    for (bool strided : {false, true}) {
      c.lse_flashmla = flashmla, c.strided = strided, c.causal = strided, ++c.seed;
      check(c);
    }
  }
  c.scale = 0.37f, ++c.seed;
  check(c);
}

// Many short sequences (0 to 40 tokens, keys 0 to 150): sequence boundaries inside every TMA box,
// zero-length queries and keys, lengths below and above one 128-row block; max_seqlen above the
// longest (CTAs past every sequence exit).
TEST(MhaPrefillGpu, SmallManyShortSequences) {
  Rng rng(77);
  MhaGpuCase c;
  for (int i = 0; i < 40; ++i) {
    c.seq_q.push_back(rng.coin(0.15) ? 0 : rng.randint(1, 40));
    c.seq_kv.push_back(rng.coin(0.15) ? 0 : rng.randint(1, 150));
  }
  c.h_q = 4, c.h_kv = 1, c.extra_max = 200;
  for (int64_t d : {192, 128}) {
    for (bool causal : {false, true}) {
      c.d_qk = d, c.causal = causal, ++c.seed;
      check(c);
    }
  }
}

TEST(MhaPrefillGpu, SmallMisalignedStridesRefused) {
  MhaGpuCase c;
  c.seq_q = {8};
  c.seq_kv = {8};
  MhaGpuProblem p(c);
  // q with a head stride of 196 elements (392 bytes: not a multiple of 16) over its own buffer.
  DeviceBuffer buf(static_cast<size_t>(8 * 4 * 196 + 196) * 2);
  MhaPrefillArgs a = p.gpu;
  a.q.data = buf.data();
  a.q.strides[0] = 4 * 196, a.q.strides[1] = 196;
  const Status st = mha_prefill(a);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
  EXPECT_NE(st.message().find("mha_prefill: q: "), std::string::npos) << st.message();
}

TEST(MhaPrefillGpu, SmallGraphCapture) {
  MhaGpuCase c;
  c.seq_q = {33, 130};
  c.seq_kv = {200, 130};
  c.h_q = 8, c.h_kv = 2, c.causal = true;
  MhaGpuProblem p(c);
  ASSERT_TRUE(mha_prefill(p.cpu).ok());
  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  cudaGraph_t graph;
  check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
  const Status st = mha_prefill(p.gpu, stream);
  const Status st_again = mha_prefill(p.gpu, stream);  // the same output written twice
  check_cuda(cudaStreamEndCapture(stream, &graph), "end capture");
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_TRUE(st_again.ok()) << st_again.message();
  cudaGraphExec_t exec;
  check_cuda(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  for (int replay = 0; replay < 2; ++replay) {
    p.dout.buffer.poison();
    p.dlse.buffer.poison();
    check_cuda(cudaGraphLaunch(exec, stream), "launch");
    check_cuda(cudaStreamSynchronize(stream), "sync");
    HostTensor out = same_layout(p.out), lse = same_layout(p.lse);
    copy_to_host(p.dout, &out);
    copy_to_host(p.dlse, &lse);
    SCOPED_TRACE("replay " + std::to_string(replay));
    compare(p, out, lse);
  }
  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);
  (void)cudaStreamDestroy(stream);
}

// --- full size ----------------------------------------------------------------------------------

TEST(MhaPrefillGpu, OddLengthsEveryFamily) {
  MhaGpuCase c;
  c.seq_q = {1, 63, 127, 129, 1000};
  c.seq_kv = {1, 63, 127, 129, 1000};
  c.h_q = 4, c.h_kv = 4;
  check_families(c);
}

TEST(MhaPrefillGpu, GqaRatios) {
  for (int64_t h_kv : {16, 4, 1}) {
    MhaGpuCase c;
    c.seq_q = {300, 0, 129};
    c.seq_kv = {500, 64, 129};
    c.h_q = 16, c.h_kv = h_kv, c.seed = 100 + h_kv;
    for (bool causal : {false, true}) {
      for (int64_t d : {192, 128}) {
        c.causal = causal, c.d_qk = d, ++c.seed;
        check(c);
      }
    }
  }
}

TEST(MhaPrefillGpu, Long4096) {
  MhaGpuCase c;
  c.seq_q = {4096};
  c.seq_kv = {4096};
  c.h_q = 2, c.h_kv = 1;
  for (int64_t d : {192, 128}) {
    for (bool causal : {false, true}) {
      c.d_qk = d, c.causal = causal, ++c.seed;
      check(c);
    }
  }
  c.seq_q = {1000, 4096};  // chunked prefill: queries the tail of a long context
  c.seq_kv = {4096, 4096};
  c.causal = true, c.dtype = DType::kFP16, ++c.seed;
  check(c);
}

}  // namespace
}  // namespace openmla::testing
