// SM90 sparse prefill (the sparse attention kernel run with one query token per problem) against
// the CPU backend, through the public API, on fresh random data: bf16 kv with one or two kv
// heads, every head count and both d_qk; indices mixing valid rows, duplicates, -1 and rows at
// or past s_kv; topk_length 0 and partial; sinks finite and ±inf; s_kv smaller than topk; s_q 1
// and odd s_q; and the kv_cache variant (keys straight from a paged cache of every format), also
// on FP8 tensor cores (fp8_tensor_cores: against the CPU backend's definition of that
// arithmetic; check() says what its tolerances tell apart). Outputs start poisoned; tolerances as sparse decode's. *Small* tests also run under memcheck.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cuda/sm90/sparse_decode/tuning.h"
#include "common/test_data.h"
#include "gpu/gpu_kv_cache.h"
#include "gpu/gpu_test_util.h"
#include "openmla/openmla.h"

namespace openmla::testing {
namespace {

struct PrefillCase {
  int64_t s_q = 7, s_kv = 300, h_q = 64, h_kv = 1, d_qk = 576, topk = 128;
  bool topk_length = false;
  int sink = 0;  // 0 none, 1 finite, 2 finite/+inf/-inf by head
  std::optional<CacheSpec> cache;  // the kv_cache variant (then s_kv, h_kv, d_qk from it)
  bool all_invalid = false;     // every index -1 or past the end (every query lonely)
  bool base_workspace = false;  // with a cache: only the (s_q, h_q, d_v) workspace size
  bool fp8 = false;             // the FP8 tensor-core path (fp8_tensor_cores) on both backends
  uint64_t seed = 1;
  std::string name() const {
    return "s_q " + std::to_string(s_q) + " h_q " + std::to_string(h_q) + " h_kv " +
           std::to_string(h_kv) + " d " + std::to_string(d_qk) + " s_kv " + std::to_string(s_kv) +
           " topk " + std::to_string(topk) + (topk_length ? " +len" : "") +
           (sink ? " +sink" : "") +
           (cache ? std::string(" cache ") + kv_format_name(cache->format) +
                        (cache->interleaved ? " interleaved" : "")
                  : "") +
           (all_invalid ? " all invalid" : "") + (base_workspace ? " base workspace" : "") +
           (fp8 ? " fp8 tensor cores" : "") + " seed " + std::to_string(seed);
  }
};

struct PrefillProblem {
  PrefillCase c;
  Rng rng;
  std::optional<TestCache> cache;
  HostTensor q, kv, indices, topk_length, sink, out, max_logits, lse;
  SparsePrefillArgs cpu, gpu;
  std::vector<DeviceTensor> device_inputs;
  DeviceTensor d_out, d_max, d_lse;
  DeviceBuffer workspace;

  explicit PrefillProblem(const PrefillCase& cs) : c(cs), rng(cs.seed) {
    int64_t num_keys = c.s_kv;
    if (c.cache) {
      cache.emplace(*c.cache, rng);
      c.d_qk = kv_format_info(c.cache->format, c.cache->d_qk).d_qk;
      c.h_kv = 1;
      num_keys = cache->num_slots();
    }
    q = HostTensor(DType::kBF16, {c.s_q, c.h_q, c.d_qk});
    q.fill_normal(rng, rng.uniform(0.5, 2.0));
    if (!c.cache) {
      kv = HostTensor(DType::kBF16, {c.s_kv, c.h_kv, c.d_qk});
      kv.fill_normal(rng, 1.0);
    }
    indices = HostTensor(DType::kInt32, {c.s_q, c.h_kv, c.topk});
    for (int64_t s = 0; s < c.s_q; ++s) {
      for (int64_t g = 0; g < c.h_kv; ++g) {
        for (int64_t e = 0; e < c.topk; ++e) {
          const double u = rng.uniform(0, 1);
          int64_t v;
          if (c.all_invalid) {
            v = u < 0.5 ? -1 : num_keys + rng.randint(0, 100);
          } else if (u < 0.08) {
            v = -1;
          } else if (u < 0.12) {
            v = num_keys + rng.randint(0, 100);  // at or past the end
          } else if (u < 0.2 && e > 0) {
            v = static_cast<int64_t>(indices.get({s, g, rng.randint(0, e - 1)}));
          } else if (cache) {
            v = cache->live[rng.randint(0, cache->live.size() - 1)];
          } else {
            v = rng.randint(0, num_keys - 1);
          }
          indices.set({s, g, e}, static_cast<double>(v));
        }
      }
    }
    cpu.q = q.view();
    if (cache) {
      cpu.kv_cache = cache->host.cache;
    } else {
      cpu.kv = kv.view();
    }
    cpu.indices = indices.view();
    cpu.fp8_tensor_cores = c.fp8;
    if (c.topk_length) {
      topk_length = HostTensor(DType::kInt32, {c.s_q});
      for (int64_t s = 0; s < c.s_q; ++s) {
        topk_length.set({s}, static_cast<double>(s == 0 ? 0 : rng.randint(0, c.topk)));
      }
      cpu.topk_length = topk_length.view();
    }
    if (c.sink) {
      sink = HostTensor(DType::kFP32, {c.h_q});
      const double inf = std::numeric_limits<double>::infinity();
      for (int64_t h = 0; h < c.h_q; ++h) {
        double v = rng.uniform(-2, 6);
        if (c.sink == 2 && h % 3 == 1) v = inf;
        if (c.sink == 2 && h % 3 == 2) v = -inf;
        sink.set({h}, v);
      }
      cpu.attn_sink = sink.view();
    }
    out = HostTensor(DType::kBF16, {c.s_q, c.h_q, 512});
    max_logits = HostTensor(DType::kFP32, {c.s_q, c.h_q});
    lse = HostTensor(DType::kFP32, {c.s_q, c.h_q});
    out.poison();
    max_logits.poison();
    lse.poison();
    cpu.out = out.view();
    cpu.max_logits = max_logits.view();
    cpu.lse = lse.view();

    gpu = cpu;
    device_inputs.reserve(6);
    auto dev = [&](const HostTensor& t) {
      device_inputs.push_back(to_device(t));
      return device_inputs.back().view;
    };
    gpu.q = dev(q);
    if (cache) {
      gpu.kv_cache = cache->gpu;
    } else {
      gpu.kv = dev(kv);
    }
    gpu.indices = dev(indices);
    if (c.topk_length) gpu.topk_length = dev(topk_length);
    if (c.sink) gpu.attn_sink = dev(sink);
    d_out = poisoned_like(out);
    d_max = poisoned_like(max_logits);
    d_lse = poisoned_like(lse);
    gpu.out = d_out.view;
    gpu.max_logits = d_max.view;
    gpu.lse = d_lse.view;
    // With a quantised cache the larger size lets the call dequantise each named slot once
    // (where the plan or g_tuning takes it).
    const size_t ws =
        cache && !c.base_workspace
            ? sparse_prefill_workspace_size(Device::cuda(0), static_cast<int>(c.s_q),
                                            static_cast<int>(c.h_q), 512, c.topk, cache->gpu)
            : sparse_prefill_workspace_size(Device::cuda(0), static_cast<int>(c.s_q),
                                            static_cast<int>(c.h_q), 512);
    workspace = DeviceBuffer(ws);
    gpu.workspace = {workspace.data(), ws};
  }
};

// Null: the production entry; else the internal one (cuda/sm90/sparse_decode/tuning.h) with these
// settings (e.g. the dequantise-once path of a quantised cache forced off / on).
const core::SparseTuning* g_tuning = nullptr;

void check(const PrefillCase& c) {
  SCOPED_TRACE(c.name());
  PrefillProblem p(c);
  const Status st = sparse_prefill(p.cpu);
  ASSERT_TRUE(st.ok()) << st.message();
  const Status gst = g_tuning ? cuda::sm90::sparse_prefill_with_tuning(p.gpu, *g_tuning)
                              : sparse_prefill(p.gpu);
  ASSERT_TRUE(gst.ok()) << gst.message();
  synchronize();
  HostTensor out = same_layout(p.out), ml = same_layout(p.max_logits), lse = same_layout(p.lse);
  copy_to_host(p.d_out, &out);
  copy_to_host(p.d_max, &ml);
  copy_to_host(p.d_lse, &lse);
  const std::vector<double> ref = p.out.values(), got = out.values();
  const double out_err = relative_l2_error(got, ref);
  const double lse_err = max_lse_error(lse.values(), p.lse.values());
  const double ml_err = max_lse_error(ml.values(), p.max_logits.values());
  if (verbose()) {
    std::printf("%s: out %.2e lse %.2e max_logits %.2e\n", c.name().c_str(), out_err, lse_err,
                ml_err);
  }
  // The FP8 path: Hopper's e4m3 MMA keeps its partial sums to ~13 mantissa bits, so the logits
  // differ from the CPU's float32 ones by ~1e-3 (measured up to 2.3e-3), which moves some of P's
  // e4m3 roundings: out then differs by 1-3e-2. Skipping the FP8 arithmetic (q and k rounded to
  // e4m3) would move the logits by 2-7e-2 (q's rounding alone): the logits' bound tells the two
  // apart; out's catches any layout or scale error (those give errors of order 1).
  EXPECT_LE(out_err, c.fp8 ? 4e-2 : 1e-2);
  EXPECT_LE(lse_err, c.fp8 ? 5e-3 : 1e-3);
  EXPECT_LE(ml_err, c.fp8 ? 5e-3 : 1e-3);
  // Where the reference is 0, so is the GPU's output: element by element, but on the FP8 path
  // only in rows that are all 0 (lonely queries), since its e4m3 sums can cancel to exactly 0 in
  // one order and not in another.
  int64_t bad_zeros = 0;
  for (size_t row = 0; row < ref.size(); row += 512) {
    const bool zero_row =
        std::all_of(ref.begin() + row, ref.begin() + row + 512, [](double v) { return v == 0.0; });
    if (c.fp8 && !zero_row) continue;
    for (size_t k = row; k < row + 512; ++k) bad_zeros += ref[k] == 0.0 && got[k] != 0.0;
  }
  EXPECT_EQ(bad_zeros, 0);
}

TEST(SparsePrefill, HeadCountsKvHeadsAndDims) {
  uint64_t seed = 100;
  for (int64_t d : {576, 512}) {
    for (int64_t h_q : {16, 32, 64, 128}) {
      for (int64_t h_kv : {1, 2}) {
        PrefillCase c;
        c.d_qk = d;
        c.h_q = h_q;
        c.h_kv = h_kv;
        c.s_q = h_q == 128 ? 37 : 9;
        c.topk = h_kv == 1 ? 256 : 100;
        c.seed = seed++;
        check(c);
      }
    }
  }
}

TEST(SparsePrefill, LengthsSinksAndShortKv) {
  uint64_t seed = 200;
  for (int sink : {1, 2}) {
    for (int64_t s_kv : {40, 5000}) {
      PrefillCase c;
      c.s_kv = s_kv;  // 40 < topk: most entries repeat rows or are invalid
      c.topk = 192;
      c.topk_length = true;
      c.sink = sink;
      c.s_q = 1 + sink * 10;
      c.seed = seed++;
      check(c);
    }
  }
}

TEST(SparsePrefill, LargeTopk) {
  PrefillCase c;
  c.s_q = 64;
  c.s_kv = 8192;
  c.h_q = 128;
  c.topk = 2048;
  c.seed = 300;
  check(c);
}

TEST(SparsePrefill, StraightFromEveryCacheFormat) {
  uint64_t seed = 400;
  const KVFormat formats[] = {KVFormat::kFP8_V32, KVFormat::kFP8_Model1, KVFormat::kFP8_MX,
                              KVFormat::kFP4, KVFormat::kBF16};
  for (KVFormat f : formats) {
    for (int64_t h_q : {16, 128}) {
      PrefillCase c;
      CacheSpec s;
      s.format = f;
      s.d_qk = f == KVFormat::kBF16 ? 512 : 576;
      s.num_blocks = 12;
      c.cache = s;
      c.h_q = h_q;
      c.s_q = h_q == 16 ? 3 : 21;
      c.topk = 320;
      c.topk_length = h_q == 16;
      c.sink = h_q == 16 ? 1 : 0;
      c.seed = seed++;
      check(c);
    }
  }
}

// Each named slot dequantised once (SparseTuning::dequant_once 1) and the direct path (0) on
// every quantised format and layout, against the CPU backend: lengths, sinks, both head blocks,
// a cache far larger than the slots named (and one with more marked words than the marking's
// filter has entries), every index invalid, and a workspace too small for the compact rows (the
// call then takes the direct path whatever the switch says).
class PrefillDequantOnce : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    tuning_.dequant_once = GetParam();
    g_tuning = &tuning_;
  }
  void TearDown() override { g_tuning = nullptr; }
  core::SparseTuning tuning_;
};

TEST_P(PrefillDequantOnce, EveryQuantisedFormat) {
  uint64_t seed = 600;
  const KVFormat formats[] = {KVFormat::kFP8_V32, KVFormat::kFP8_Model1, KVFormat::kFP8_MX,
                              KVFormat::kFP4};
  for (KVFormat f : formats) {
    for (int variant = 0; variant < 4; ++variant) {
      PrefillCase c;
      CacheSpec s;
      s.format = f;
      s.interleaved = variant == 1;
      s.page = variant == 2 ? 16 : 64;
      s.num_blocks = variant == 2 ? 300 : 20;  // variant 2: 4800 slots, few of them named
      c.cache = s;
      c.h_q = variant % 2 == 0 ? 64 : 128;
      c.s_q = variant == 3 ? 4 : 9;
      c.topk = variant == 2 ? 100 : 200;
      c.topk_length = variant == 1;
      c.sink = variant == 0 ? 2 : 0;
      c.all_invalid = variant == 3;
      c.seed = seed++;
      check(c);
    }
    if (f == KVFormat::kFP4) {
      // 4200 bitmap words: words 4096 apart share an entry of the marking's filter (4096).
      PrefillCase wide;
      CacheSpec s;
      s.format = f;
      s.num_blocks = 2100;
      wide.cache = s;
      wide.s_q = 3;
      wide.topk = 2000;
      wide.seed = seed++;
      check(wide);
    }
    PrefillCase small_ws;
    CacheSpec s;
    s.format = f;
    small_ws.cache = s;
    small_ws.s_q = 5;
    small_ws.topk = 128;
    small_ws.base_workspace = true;
    small_ws.seed = seed++;
    check(small_ws);
  }
}

INSTANTIATE_TEST_SUITE_P(SparsePrefill, PrefillDequantOnce, ::testing::Values(1, 0));

// The FP8 tensor-core path on every quantised format and both d_qk: head counts 16-128 (one and
// two head blocks), lengths (with a token of none), sinks finite and ±inf, topk not a multiple of
// 64, the token-interleaved layout, every index invalid.
TEST(SparsePrefill, Fp8TensorCoresEveryQuantisedFormat) {
  uint64_t seed = 800;
  const KVFormat formats[] = {KVFormat::kFP8_V32, KVFormat::kFP8_Model1, KVFormat::kFP8_MX,
                              KVFormat::kFP4};
  for (KVFormat f : formats) {
    for (int variant = 0; variant < 4; ++variant) {
      PrefillCase c;
      CacheSpec s;
      s.format = f;
      s.interleaved = variant == 1;
      s.num_blocks = 20;
      c.cache = s;
      c.fp8 = true;
      c.h_q = variant == 0 ? 128 : variant == 1 ? 16 : 64;
      c.s_q = variant == 3 ? 4 : 9;
      c.topk = variant == 2 ? 200 : 256;
      c.topk_length = variant == 1;
      c.sink = variant == 0 ? 2 : variant == 2 ? 1 : 0;
      c.all_invalid = variant == 3;
      c.seed = seed++;
      check(c);
    }
  }
}

// The FP8 path always needs the workspace sized with topk and the cache: given only the base
// size, the call is refused, naming the workspace, and writes nothing.
TEST(SparsePrefill, Fp8TensorCoresNeedTheirWorkspace) {
  PrefillCase c;
  CacheSpec s;
  s.format = KVFormat::kFP8_Model1;
  c.cache = s;
  c.fp8 = true;
  c.base_workspace = true;
  c.s_q = 5;
  c.seed = 950;
  PrefillProblem p(c);
  const Status st = sparse_prefill(p.gpu);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
  EXPECT_NE(st.message().find("workspace"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("FP8"), std::string::npos) << st.message();
}

// The FP8 path reads q's rows by 16-byte loads: a q that is not 16-byte aligned is refused,
// naming q (before anything runs: the shifted view is never read).
TEST(SparsePrefill, Fp8TensorCoresNeedAlignedQ) {
  PrefillCase c;
  CacheSpec s;
  s.format = KVFormat::kFP8_V32;
  c.cache = s;
  c.fp8 = true;
  c.s_q = 5;
  c.seed = 951;
  PrefillProblem p(c);
  p.gpu.q.data = static_cast<uint16_t*>(p.gpu.q.data) + 4;
  const Status st = sparse_prefill(p.gpu);
  EXPECT_EQ(st.code(), StatusCode::kNotImplemented) << st.message();
  EXPECT_NE(st.message().find("q:"), std::string::npos) << st.message();
}

TEST(SparsePrefillSmall, Fp8TensorCoresSanitizer) {
  uint64_t seed = 900;
  for (KVFormat f : {KVFormat::kFP8_V32, KVFormat::kFP8_Model1}) {
    PrefillCase c;
    CacheSpec s;
    s.format = f;
    s.page = 16;
    s.num_blocks = 5;
    c.cache = s;
    c.fp8 = true;
    c.s_q = 3;
    c.h_q = 32;
    c.topk = 90;
    c.topk_length = true;
    c.sink = 1;
    c.seed = seed++;
    check(c);
  }
}

TEST(SparsePrefillSmall, DequantOnceSanitizer) {
  core::SparseTuning once;
  once.dequant_once = 1;
  g_tuning = &once;
  PrefillCase c;
  CacheSpec s;
  s.format = KVFormat::kFP8_V32;
  s.page = 16;
  s.num_blocks = 5;
  c.cache = s;
  c.s_q = 3;
  c.h_q = 16;
  c.topk = 90;
  c.topk_length = true;
  c.sink = 1;
  c.seed = 700;
  check(c);
  g_tuning = nullptr;
}

// bf16 kv through the orders and fills the plan does not pick for prefill (SparseTuning): the
// plain seesaw, the first order, the stagger's seesaw without the group fill, the register path.
TEST(SparsePrefillForms, OtherOrdersAndFills) {
  std::vector<std::pair<std::string, core::SparseTuning>> forms(4);
  forms[0].first = "plain seesaw";
  forms[0].second.stagger = 0;
  forms[1].first = "first order";
  forms[1].second.seesaw = 0;
  forms[2].first = "no group fill";
  forms[2].second.groups = 0;
  forms[3].first = "bf16 through registers";
  forms[3].second.bf16_registers = true;
  uint64_t seed = 900;
  for (const auto& [name, tuning] : forms) {
    SCOPED_TRACE(name);
    g_tuning = &tuning;
    for (int64_t d : {576, 512}) {
      for (int64_t h_q : {64, 128}) {
        PrefillCase c;
        c.d_qk = d;
        c.h_q = h_q;
        c.h_kv = h_q == 128 ? 2 : 1;
        c.s_q = 5;
        c.topk = 200;
        c.topk_length = h_q == 64;
        c.sink = h_q == 128 ? 2 : 0;
        c.seed = seed++;
        check(c);
      }
    }
  }
  g_tuning = nullptr;
}

TEST(SparsePrefillSmall, Sanitizer) {
  uint64_t seed = 500;
  for (int64_t h_kv : {1, 2}) {
    PrefillCase c;
    c.s_q = 3;
    c.s_kv = 70;
    c.h_q = 32;
    c.h_kv = h_kv;
    c.topk = 100;
    c.topk_length = true;
    c.sink = 1;
    c.seed = seed++;
    check(c);
  }
  PrefillCase c;
  CacheSpec s;
  s.format = KVFormat::kFP8_Model1;
  s.page = 16;
  s.num_blocks = 4;
  c.cache = s;
  c.s_q = 2;
  c.h_q = 16;
  c.topk = 90;
  c.seed = seed++;
  check(c);
}

}  // namespace
}  // namespace openmla::testing
