// The SM90 sparse decode kernel (src/cuda/sm90/sparse_decode) against the CPU backend, through
// the public API, on fresh random data. Caches are written by the GPU kv_cache_write into buffers
// filled with 0xFF first (NaN in every format's scales and elements), so any slot no counted
// index names holds NaN; indices mix live slots, duplicates, -1, other negatives and slots past
// the cache's end; entries past topk_length name dead slots. Outputs start poisoned (NaN), and
// strided outputs' gaps must stay NaN. Tolerances as the dense decode tests: ‖out − ref‖/‖ref‖
// <= 1e-2, lse within 1e-3 · max(1, |lse|), exact zeros (lonely queries, +inf sinks) exact.
// Tests named *Small* run under compute-sanitizer memcheck too (tools/device_check.sh).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/test_data.h"
#include "cuda/sm90/sparse_decode/tuning.h"
#include "gpu/gpu_kv_cache.h"
#include "gpu/gpu_test_util.h"
#include "openmla/openmla.h"

namespace openmla::testing {
namespace {

enum class Sink { kNone, kFinite, kMixed };

struct Case {
  int64_t b = 2, s_q = 1, h_q = 64, topk = 128;
  CacheSpec cache;
  bool topk_length = false;
  std::optional<CacheSpec> extra;
  int64_t extra_topk = 64;
  bool extra_topk_length = false;
  Sink sink = Sink::kNone;
  bool strided_out = false;
  bool all_invalid = false;
  double q_sigma = 0;  // q's standard deviation; 0: drawn from [0.5, 2]
  uint64_t seed = 1;

  std::string name() const {
    return std::string(kv_format_name(cache.format)) + (cache.interleaved ? "/interleaved" : "") +
           " d" + std::to_string(kv_format_info(cache.format, cache.d_qk).d_qk) + " page " +
           std::to_string(cache.page) + " b " + std::to_string(b) + " s_q " +
           std::to_string(s_q) + " h_q " + std::to_string(h_q) + " topk " + std::to_string(topk) +
           (topk_length ? " +len" : "") +
           (extra ? std::string(" +extra ") + kv_format_name(extra->format) + " topk " +
                        std::to_string(extra_topk) + (extra_topk_length ? " +len" : "")
                  : "") +
           (sink != Sink::kNone ? " +sink" : "") + (strided_out ? " strided" : "") +
           (q_sigma > 0 ? " q sigma " + std::to_string(static_cast<int>(q_sigma)) : "") +
           " seed " + std::to_string(seed);
  }
};

std::vector<int32_t> random_lengths(int64_t b, int64_t topk, bool present, Rng& rng) {
  std::vector<int32_t> len(b, static_cast<int32_t>(topk));
  if (!present) return len;
  for (int64_t i = 0; i < b; ++i) len[i] = static_cast<int32_t>(rng.randint(0, topk));
  if (b >= 2) len[rng.randint(0, b - 1)] = 0;  // one request attends nothing of this cache
  if (b >= 3) len[rng.randint(0, b - 1)] = static_cast<int32_t>(topk);
  return len;
}

HostTensor random_indices(int64_t b, int64_t s_q, int64_t topk, const TestCache& cache,
                          const std::vector<int32_t>& counted, bool all_invalid, Rng& rng) {
  HostTensor t(DType::kInt32, {b, s_q, topk});
  std::vector<int64_t> dead;
  for (int64_t slot = 0, k = 0; slot < cache.num_slots(); ++slot) {
    if (k < static_cast<int64_t>(cache.live.size()) && cache.live[k] == slot) {
      ++k;
    } else {
      dead.push_back(slot);
    }
  }
  for (int64_t i = 0; i < b; ++i) {
    for (int64_t j = 0; j < s_q; ++j) {
      for (int64_t e = 0; e < topk; ++e) {
        int64_t v;
        const double u = rng.uniform(0, 1);
        if (all_invalid) {
          const int64_t bad[] = {-1, -5, cache.num_slots(), cache.num_slots() + 7};
          v = bad[e % 4];
        } else if (e >= counted[i]) {  // not counted: a NaN slot where there is one
          v = dead.empty() ? -1 : dead[rng.randint(0, dead.size() - 1)];
        } else if (u < 0.08) {
          v = -1;
        } else if (u < 0.12) {
          v = -rng.randint(2, 1 << 30);
        } else if (u < 0.16) {
          v = cache.num_slots() + rng.randint(0, 1 << 20);
        } else if (u < 0.26 && e > 0) {
          v = static_cast<int64_t>(t.get({i, j, rng.randint(0, e - 1)}));  // a duplicate
        } else {
          v = cache.live[rng.randint(0, cache.live.size() - 1)];
        }
        t.set({i, j, e}, static_cast<double>(v));
      }
    }
  }
  return t;
}

HostTensor lengths_tensor(const std::vector<int32_t>& len) {
  HostTensor t(DType::kInt32, {static_cast<int64_t>(len.size())});
  for (size_t i = 0; i < len.size(); ++i) t.set({static_cast<int64_t>(i)}, len[i]);
  return t;
}

// One problem: host tensors (the CPU reference runs on them) and their device mirrors.
struct Problem {
  Case c;
  Rng rng;
  TestCache cache;
  std::optional<TestCache> extra;
  HostTensor q, indices, extra_indices, topk_length, extra_topk_length, sink, out, lse;
  SparseDecodeArgs cpu;
  std::vector<DeviceTensor> device_inputs;  // kept alive for `gpu`
  DeviceTensor d_out, d_lse;
  DeviceBuffer workspace;
  SparseDecodeArgs gpu;

  explicit Problem(const Case& cs) : c(cs), rng(cs.seed), cache(cs.cache, rng) {
    const int64_t d = kv_format_info(c.cache.format, c.cache.d_qk).d_qk, d_v = 512;
    q = HostTensor(DType::kBF16, {c.b, c.s_q, c.h_q, d});
    q.fill_normal(rng, c.q_sigma > 0 ? c.q_sigma : rng.uniform(0.5, 2.0));
    const std::vector<int32_t> len = random_lengths(c.b, c.topk, c.topk_length, rng);
    indices = random_indices(c.b, c.s_q, c.topk, cache, len, c.all_invalid, rng);
    cpu.q = q.view();
    cpu.k_cache = cache.host.cache;
    cpu.indices = indices.view();
    if (c.topk_length) {
      topk_length = lengths_tensor(len);
      cpu.topk_length = topk_length.view();
    }
    if (c.extra) {
      extra.emplace(*c.extra, rng);
      const std::vector<int32_t> elen =
          random_lengths(c.b, c.extra_topk, c.extra_topk_length, rng);
      extra_indices = random_indices(c.b, c.s_q, c.extra_topk, *extra, elen, c.all_invalid, rng);
      cpu.extra_k_cache = extra->host.cache;
      cpu.extra_indices = extra_indices.view();
      if (c.extra_topk_length) {
        extra_topk_length = lengths_tensor(elen);
        cpu.extra_topk_length = extra_topk_length.view();
      }
    }
    if (c.sink != Sink::kNone) {
      const float inf = std::numeric_limits<float>::infinity();
      sink = HostTensor(DType::kFP32, {c.h_q});
      for (int64_t h = 0; h < c.h_q; ++h) {
        float v = static_cast<float>(rng.uniform(-2, 6));
        if (c.sink == Sink::kMixed && h % 3 == 1) v = inf;
        if (c.sink == Sink::kMixed && h % 3 == 2) v = -inf;
        sink.set({h}, v);
      }
      cpu.attn_sink = sink.view();
    }
    if (c.strided_out) {
      out = HostTensor(DType::kBF16, {c.b, c.s_q, c.h_q, d_v},
                       {c.s_q * c.h_q * (d_v + 8), c.h_q * (d_v + 8), d_v + 8, 1});
      lse = HostTensor(DType::kFP32, {c.b, c.h_q, c.s_q}, {c.s_q * c.h_q, 1, c.h_q});
    } else {
      out = HostTensor(DType::kBF16, {c.b, c.s_q, c.h_q, d_v});
      lse = HostTensor(DType::kFP32, {c.b, c.h_q, c.s_q});
    }
    out.poison();
    lse.poison();
    cpu.out = out.view();
    cpu.lse = lse.view();

    gpu = cpu;
    auto dev = [&](const HostTensor& t) {
      device_inputs.push_back(to_device(t));
      return device_inputs.back().view;
    };
    device_inputs.reserve(8);
    gpu.q = dev(q);
    gpu.indices = dev(indices);
    gpu.k_cache = cache.gpu;
    if (c.topk_length) gpu.topk_length = dev(topk_length);
    if (c.extra) {
      gpu.extra_k_cache = extra->gpu;
      gpu.extra_indices = dev(extra_indices);
      if (c.extra_topk_length) gpu.extra_topk_length = dev(extra_topk_length);
    }
    if (c.sink != Sink::kNone) gpu.attn_sink = dev(sink);
    d_out = poisoned_like(out);
    d_lse = poisoned_like(lse);
    gpu.out = d_out.view;
    gpu.lse = d_lse.view;
    const size_t ws = sparse_decode_workspace_size(Device::cuda(0), static_cast<int>(c.b),
                                                   static_cast<int>(c.s_q),
                                                   static_cast<int>(c.h_q), 512);
    workspace = DeviceBuffer(ws);
    gpu.workspace = {workspace.data(), ws};
  }
};

// The production entry, or with `tuning` the internal one (cuda/sm90/sparse_decode/tuning.h)
// that launches the forms the plan would not pick for this shape.
Status run_gpu(const SparseDecodeArgs& args, const core::SparseTuning* tuning = nullptr) {
  return tuning ? cuda::sm90::sparse_decode_with_tuning(args, *tuning) : sparse_decode(args);
}

void check(const Case& c, const core::SparseTuning* tuning = nullptr) {
  SCOPED_TRACE(c.name());
  Problem p(c);
  Status st = sparse_decode(p.cpu);
  ASSERT_TRUE(st.ok()) << st.message();
  const std::vector<double> ref_out = p.out.values(), ref_lse = p.lse.values();
  const Status gst = run_gpu(p.gpu, tuning);
  ASSERT_TRUE(gst.ok()) << gst.message();
  ASSERT_TRUE(st.ok()) << st.message();
  synchronize();
  HostTensor got_out = same_layout(p.out), got_lse = same_layout(p.lse);
  copy_to_host(p.d_out, &got_out);
  copy_to_host(p.d_lse, &got_lse);
  const std::vector<double> out = got_out.values(), lse = got_lse.values();
  const double out_err = relative_l2_error(out, ref_out), lse_err = max_lse_error(lse, ref_lse);
  if (verbose()) std::printf("%s: out %.2e lse %.2e\n", c.name().c_str(), out_err, lse_err);
  EXPECT_LE(out_err, 1e-2);
  EXPECT_LE(lse_err, 1e-3);
  int64_t bad_zeros = 0;
  for (size_t k = 0; k < ref_out.size(); ++k) bad_zeros += ref_out[k] == 0.0 && out[k] != 0.0;
  EXPECT_EQ(bad_zeros, 0) << "outputs the reference has exactly 0 (lonely rows, +inf sinks)";
  EXPECT_EQ(count_written_gaps(got_out), 0);
  EXPECT_EQ(count_written_gaps(got_lse), 0);
}

CacheSpec spec(KVFormat f, int d_qk = 576) {
  CacheSpec s;
  s.format = f;
  s.d_qk = d_qk;
  return s;
}
const CacheSpec kFormats[] = {spec(KVFormat::kFP8_V32),    spec(KVFormat::kFP8_Model1),
                              spec(KVFormat::kFP8_MX),     spec(KVFormat::kFP4),
                              spec(KVFormat::kBF16, 576),  spec(KVFormat::kBF16, 512)};

// Every format x layout x head count, s_q 1-4, one split and several.
TEST(SparseDecode, EveryFormatLayoutAndHeadCount) {
  uint64_t seed = 1000;
  const int64_t heads[] = {8, 16, 32, 64, 128};
  for (CacheSpec s : kFormats) {
    for (bool interleaved : {false, true}) {
      s.interleaved = interleaved;
      s.pad_bytes = interleaved ? 80 : 0;
      s.page = interleaved ? 16 : 64;
      s.num_blocks = interleaved ? 40 : 10;
      for (int k = 0; k < 5; ++k) {
        Case c;
        c.cache = s;
        c.h_q = heads[k];
        c.s_q = 1 + (k + interleaved) % 4;
        c.b = k % 2 == 0 ? 3 : 40;  // few tokens: split; many: not
        c.topk = k % 2 == 0 ? 200 : 64 * (1 + k);
        c.topk_length = k == 3;
        c.seed = seed++;
        check(c);
      }
    }
  }
}

// A sharp softmax: q of standard deviation 20 puts a row's scores tens of powers of two apart,
// so its max moves past the lazy-rescale threshold (2^8 in P's units) from tile to tile and
// every rescale path runs: the default order's, the seesaw order's shared max (bf16 tiles), the
// split partials' merge. Random q of standard deviation ~1 almost never rescales.
TEST(SparseDecode, SharpSoftmaxRescales) {
  uint64_t seed = 8000;
  for (CacheSpec s : {spec(KVFormat::kBF16, 576), spec(KVFormat::kBF16, 512),
                      spec(KVFormat::kFP8_V32), spec(KVFormat::kFP8_Model1)}) {
    for (int64_t h_q : {64, 128}) {
      for (int64_t b : {3, 40}) {  // several splits a token, and one
        Case c;
        c.cache = s;
        c.h_q = h_q;
        c.b = b;
        c.s_q = b == 3 ? 2 : 1;
        c.topk = 704;  // 11 tiles: an odd count
        c.topk_length = b == 3;
        c.q_sigma = 20;
        c.seed = seed++;
        check(c);
      }
    }
  }
}

TEST(SparseDecode, TopkLengthSinkAndStridedOutputs) {
  uint64_t seed = 2000;
  for (CacheSpec s : {spec(KVFormat::kFP8_V32), spec(KVFormat::kFP8_Model1)}) {
    for (Sink sink : {Sink::kFinite, Sink::kMixed}) {
      for (int64_t b : {2, 70}) {
        Case c;
        c.cache = s;
        c.b = b;
        c.s_q = 2;
        c.h_q = b == 2 ? 128 : 16;
        c.topk = 300;
        c.topk_length = true;
        c.sink = sink;
        c.strided_out = true;
        c.seed = seed++;
        check(c);
      }
    }
  }
}

// V4: the main cache and a second one (its own format, page size, indices and lengths) in one
// softmax; V4.1: fp8_mx main + fp4 extra.
TEST(SparseDecode, ExtraCache) {
  struct Pair {
    KVFormat main, extra;
    int d_qk;
  };
  const Pair pairs[] = {{KVFormat::kFP8_Model1, KVFormat::kFP8_Model1, 512},
                        {KVFormat::kFP8_MX, KVFormat::kFP4, 512},
                        {KVFormat::kFP8_Model1, KVFormat::kFP4, 512},
                        {KVFormat::kFP8_V32, KVFormat::kBF16, 576},
                        {KVFormat::kBF16, KVFormat::kFP8_MX, 512}};
  uint64_t seed = 3000;
  for (const Pair& pr : pairs) {
    for (bool lengths : {false, true}) {
      Case c;
      c.b = lengths ? 4 : 48;
      c.s_q = 2;
      c.h_q = lengths ? 64 : 32;
      c.cache = spec(pr.main, pr.d_qk);
      c.cache.page = 256;
      c.cache.num_blocks = 3;
      c.topk = 128;
      CacheSpec e = spec(pr.extra, pr.d_qk);
      e.page = 64;
      e.num_blocks = 20;
      c.extra = e;
      c.extra_topk = lengths ? 1024 : 100;
      c.topk_length = lengths;
      c.extra_topk_length = lengths;
      c.sink = lengths ? Sink::kFinite : Sink::kNone;
      c.seed = seed++;
      check(c);
    }
  }
}

// The serving shapes: topk 2048 over a large cache, small batches (split) and large ones.
TEST(SparseDecode, ServingShapes) {
  uint64_t seed = 4000;
  struct Shape {
    KVFormat f;
    int64_t b, s_q, h_q;
  };
  const Shape shapes[] = {{KVFormat::kFP8_V32, 1, 1, 16},   {KVFormat::kFP8_V32, 8, 1, 16},
                          {KVFormat::kFP8_Model1, 4, 2, 64}, {KVFormat::kFP8_V32, 16, 1, 128},
                          {KVFormat::kFP4, 2, 1, 32},        {KVFormat::kFP8_MX, 140, 1, 64}};
  for (const Shape& s : shapes) {
    Case c;
    c.cache = spec(s.f);
    c.cache.num_blocks = 64;
    c.b = s.b;
    c.s_q = s.s_q;
    c.h_q = s.h_q;
    c.topk = 2048;
    c.seed = seed++;
    check(c);
  }
}

TEST(SparseDecode, AllIndicesInvalidIsLonely) {
  for (int64_t b : {2, 64}) {
    Case c;
    c.b = b;
    c.h_q = 16;
    c.all_invalid = true;
    c.sink = Sink::kFinite;
    c.seed = 5000 + b;
    check(c);
  }
}

// bf16 caches through both fills on long key lists (many tiles a CTA): the register path
// (SparseTuning::bf16_registers) and cp.async straight into the stage (the default), whose first
// form handed a stage over only after the next tile's copies and deadlocked from a CTA's third
// tile. With an fp8 extra cache, tiles of both fills alternate in one CTA.
TEST(SparseDecode, Bf16FillsOnLongLists) {
  uint64_t seed = 7000;
  for (bool registers : {true, false}) {
    core::SparseTuning tuning;
    tuning.bf16_registers = registers;
    for (int d_qk : {576, 512}) {
      for (int64_t s_q : {1, 2}) {
        Case c;
        c.cache = spec(KVFormat::kBF16, d_qk);
        c.cache.num_blocks = 64;
        c.b = s_q == 1 ? 8 : 70;  // split and not
        c.s_q = s_q;
        c.h_q = 64;
        c.topk = 2048;
        c.topk_length = s_q == 2;
        if (d_qk == 512 && s_q == 2) {
          c.extra = spec(KVFormat::kFP8_Model1, 512);
          c.extra_topk = 512;
        }
        c.seed = seed++;
        SCOPED_TRACE(registers ? "bf16 keys through registers" : "bf16 keys by cp.async");
        check(c, &tuning);
      }
    }
  }
}

// Every compiled form the plan would not pick for these shapes, forced through SparseTuning (the
// internal entry, cuda/sm90/sparse_decode/tuning.h), against the CPU backend on every format,
// h_q 64 and 128, one split and several, with V4's extra cache at d 512: the warp-per-key fill,
// the CTA pair off and forced, the ring fill off, everywhere and in its one-stage form, the token
// fill streamed and round by round, the fill that reads the format at run time, the first order
// and the stagger for bf16 keys, the group fill off, no L2 prefetch, one-tile splits.
TEST(SparseDecodeForms, EveryFormThroughTuning) {
  std::vector<std::pair<std::string, core::SparseTuning>> forms;
  auto add = [&](const char* name, auto set) {
    core::SparseTuning t;
    set(t);
    forms.emplace_back(name, t);
  };
  add("warp-per-key fill", [](core::SparseTuning& t) { t.key_fill = true; });
  add("unpaired", [](core::SparseTuning& t) { t.pair = 0; });
  add("paired", [](core::SparseTuning& t) { t.pair = 1; });
  add("no ring", [](core::SparseTuning& t) { t.ring = 0; });
  add("ring everywhere", [](core::SparseTuning& t) { t.ring = 1, t.pair = 0; });
  add("ring one stage", [](core::SparseTuning& t) { t.ring = 1, t.slots = 0, t.pair = 0; });
  add("streamed", [](core::SparseTuning& t) { t.ring = 0, t.stream = 1; });
  add("round by round", [](core::SparseTuning& t) { t.ring = 0, t.stream = 0; });
  add("format at run time", [](core::SparseTuning& t) { t.generic_fill = true; });
  add("first order", [](core::SparseTuning& t) { t.seesaw = 0; });
  add("stagger", [](core::SparseTuning& t) { t.stagger = 1; });
  add("no group fill", [](core::SparseTuning& t) { t.groups = 0; });
  add("no prefetch", [](core::SparseTuning& t) { t.no_prefetch = true; });
  add("one-tile splits", [](core::SparseTuning& t) { t.tiles_per_split = 1; });
  uint64_t seed = 8000;
  for (const auto& [name, tuning] : forms) {
    SCOPED_TRACE(name);
    for (CacheSpec s : kFormats) {
      for (int64_t h_q : {64, 128}) {
        Case c;
        c.cache = s;
        c.cache.num_blocks = 12;
        c.b = h_q == 64 ? 2 : 3;
        c.s_q = 2;
        c.h_q = h_q;
        c.topk = h_q == 64 ? 300 : 200;
        c.topk_length = h_q == 128;
        c.sink = h_q == 128 ? Sink::kMixed : Sink::kNone;
        if (kv_format_info(s.format, s.d_qk).d_qk == 512 && h_q == 64) {
          CacheSpec e = spec(s.format, 512);
          e.page = 32;
          e.num_blocks = 4;
          c.extra = e;
          c.extra_topk = 90;
          c.extra_topk_length = true;
        }
        c.seed = seed++;
        check(c, &tuning);
      }
    }
  }
}

// Small shapes of every format, split and not, with an extra cache: also run under memcheck.
TEST(SparseDecodeSmall, Sanitizer) {
  uint64_t seed = 6000;
  for (CacheSpec s : kFormats) {
    for (bool interleaved : {false, true}) {
      s.interleaved = interleaved;
      s.page = 16;
      s.num_blocks = 5;
      Case c;
      c.cache = s;
      c.b = interleaved ? 2 : 1;
      c.s_q = 2;
      c.h_q = interleaved ? 16 : 64;
      c.topk = 150;
      c.topk_length = interleaved;
      if (s.d_qk == 512 || s.format != KVFormat::kBF16) {
        CacheSpec e = s;
        e.format = kv_format_info(s.format, s.d_qk).d_qk == 576 ? KVFormat::kBF16 : KVFormat::kFP4;
        e.d_qk = kv_format_info(s.format, s.d_qk).d_qk;
        e.num_blocks = 3;
        c.extra = e;
        c.extra_topk = 70;
      }
      c.seed = seed++;
      check(c);
    }
  }
}

// h_q 96 and 128 over quantised caches run as CTA pairs (a 2-CTA cluster: each CTA decodes half
// of every tile into both CTAs' shared memory). Against the CPU, and bit for bit against the same
// launch with the pair off (SparseTuning::pair 0): the pair changes who decodes, not what.
// Small, so memcheck runs it too.
TEST(SparseDecodeSmall, CtaPairMatchesUnpaired) {
  uint64_t seed = 6500;
  for (CacheSpec s : {spec(KVFormat::kFP8_V32), spec(KVFormat::kFP8_Model1),
                      spec(KVFormat::kFP8_MX), spec(KVFormat::kFP4)}) {
    for (bool interleaved : {false, true}) {
      s.interleaved = interleaved;
      s.page = interleaved ? 16 : 64;
      s.num_blocks = interleaved ? 12 : 4;
      Case c;
      c.cache = s;
      c.b = interleaved ? 3 : 1;  // several splits a token, and one
      c.s_q = interleaved ? 1 : 2;
      c.h_q = interleaved ? 96 : 128;
      c.topk = interleaved ? 150 : 320;
      c.topk_length = interleaved;
      c.sink = interleaved ? Sink::kMixed : Sink::kNone;
      const int d_qk = kv_format_info(s.format, s.d_qk).d_qk;
      if (d_qk == 512 && !interleaved) {  // V4: a second cache of the same format in the pair
        CacheSpec e = spec(s.format, 512);
        e.page = 32;
        e.num_blocks = 4;
        c.extra = e;
        c.extra_topk = 90;
        c.extra_topk_length = true;
      }
      c.seed = seed++;
      check(c);
      SCOPED_TRACE(c.name());
      Problem p(c);
      auto run = [&](int pair) {
        core::SparseTuning tuning;
        tuning.pair = pair;
        const Status st = run_gpu(p.gpu, &tuning);
        EXPECT_TRUE(st.ok()) << st.message();
        synchronize();
        HostTensor out = same_layout(p.out), lse = same_layout(p.lse);
        copy_to_host(p.d_out, &out);
        copy_to_host(p.d_lse, &lse);
        std::vector<double> v = out.values(), l = lse.values();
        v.insert(v.end(), l.begin(), l.end());
        return v;
      };
      const std::vector<double> paired = run(1), apart = run(0);
      int64_t differ = 0;
      for (size_t k = 0; k < paired.size(); ++k) {
        differ += !(paired[k] == apart[k] || (paired[k] != paired[k] && apart[k] != apart[k]));
      }
      EXPECT_EQ(differ, 0) << "outputs that differ between the paired and unpaired launches";
    }
  }
}

// batch_invariant: request 0 decoded alone (a batch of 1, which would split over many SMs) and
// inside a batch of 64 (which would not) gives the same bits; and it still matches the CPU.
TEST(SparseDecode, BatchInvariantMode) {
  Case c;
  c.b = 64;
  c.h_q = 64;
  c.topk = 1024;
  c.cache = spec(KVFormat::kFP8_V32);
  c.cache.num_blocks = 32;
  c.seed = 7500;
  Problem p(c);
  p.gpu.batch_invariant = true;
  ASSERT_TRUE(sparse_decode(p.gpu).ok());
  synchronize();
  HostTensor all = same_layout(p.out), all_lse = same_layout(p.lse);
  copy_to_host(p.d_out, &all);
  copy_to_host(p.d_lse, &all_lse);
  ASSERT_TRUE(sparse_decode(p.cpu).ok());
  EXPECT_LE(relative_l2_error(all.values(), p.out.values()), 1e-2);
  // Request 0 alone: the batch's first rows, as a batch of one.
  SparseDecodeArgs one = p.gpu;
  for (TensorView* t : {&one.q, &one.indices, &one.out, &one.lse}) t->shape[0] = 1;
  const std::vector<double> before = all.values();
  p.d_out.buffer.poison();
  p.d_lse.buffer.poison();
  ASSERT_TRUE(sparse_decode(one).ok());
  synchronize();
  HostTensor alone = same_layout(p.out), alone_lse = same_layout(p.lse);
  copy_to_host(p.d_out, &alone);
  copy_to_host(p.d_lse, &alone_lse);
  const std::vector<double> a = alone.values(), l1 = alone_lse.values(), l64 = all_lse.values();
  const size_t row = static_cast<size_t>(c.s_q * c.h_q * 512);
  for (size_t k = 0; k < row; ++k) ASSERT_EQ(a[k], before[k]) << "element " << k;
  for (size_t k = 0; k < static_cast<size_t>(c.h_q * c.s_q); ++k) {
    ASSERT_EQ(l1[k], l64[k]) << "lse " << k;
  }
}

// A layer loop captured into a CUDA graph and replayed gives what direct calls give.
TEST(SparseDecode, CudaGraphLayerLoop) {
  Case c;
  c.b = 4;
  c.s_q = 2;
  c.h_q = 64;
  c.topk = 512;
  c.cache = spec(KVFormat::kFP8_Model1);
  c.cache.num_blocks = 16;
  c.seed = 7000;
  Problem p(c);
  constexpr int kLayers = 3;
  std::vector<DeviceTensor> outs, lses;
  for (int l = 0; l < kLayers; ++l) {
    outs.push_back(poisoned_like(p.out));
    lses.push_back(poisoned_like(p.lse));
  }
  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  cudaGraph_t graph;
  check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
  for (int l = 0; l < kLayers; ++l) {
    SparseDecodeArgs a = p.gpu;
    a.out = outs[l].view;
    a.lse = lses[l].view;
    const Status st = sparse_decode(a, stream);
    ASSERT_TRUE(st.ok()) << st.message();
  }
  check_cuda(cudaStreamEndCapture(stream, &graph), "end capture");
  cudaGraphExec_t exec;
  check_cuda(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  check_cuda(cudaGraphLaunch(exec, stream), "launch");
  check_cuda(cudaGraphLaunch(exec, stream), "launch again");
  check_cuda(cudaStreamSynchronize(stream), "sync");
  ASSERT_TRUE(sparse_decode(p.gpu).ok());
  synchronize();
  HostTensor direct = same_layout(p.out), direct_lse = same_layout(p.lse);
  copy_to_host(p.d_out, &direct);
  copy_to_host(p.d_lse, &direct_lse);
  for (int l = 0; l < kLayers; ++l) {
    HostTensor o = same_layout(p.out), s = same_layout(p.lse);
    copy_to_host(outs[l], &o);
    copy_to_host(lses[l], &s);
    EXPECT_EQ(o.values(), direct.values()) << "layer " << l;
    EXPECT_EQ(s.values(), direct_lse.values()) << "layer " << l;
  }
  check_cuda(cudaGraphExecDestroy(exec), "destroy exec");
  check_cuda(cudaGraphDestroy(graph), "destroy graph");
  check_cuda(cudaStreamDestroy(stream), "destroy stream");
}

}  // namespace
}  // namespace openmla::testing
