// Dense decode over a paged cache of any format (DenseDecodeArgs::kv_cache, the KVCache sparse
// decode takes) on the GPU against the CPU backend: the same public openmla::dense_decode call on
// host copies of the same bytes is the reference (tests/cpu/test_cpu_dense_decode_kv_cache.cc
// checks that one against a plain bf16 cache).
//
// Every case draws fresh data: caches are written by the GPU kv_cache_write into buffers filled
// with 0xFF (NaN in every format), and only the slots a request reads (t < cache_seqlens[i]) are
// written, so pages outside the block table, spare pages the table names past a request's used
// blocks, and the tails of partly used pages all hold NaN. Block tables are permuted. q, out and
// lse have gaps between rows unless a case says otherwise; out, lse and the workspace start
// poisoned, and out's and lse's gaps must stay NaN. Tolerances as test_sparse_decode.cu (and the
// bf16 dense tests): ‖out − ref‖/‖ref‖ <= 1e-2, lse within 1e-3 · max(1, |lse|), and the exact
// zeros of lonely queries (out 0, lse +inf) exact.
//
// Until the kernel lands, the GPU answers NotImplemented and every test here fails on its first
// case. Cases named *Small* also run under compute-sanitizer memcheck (tools/device_check.sh).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/test_data.h"
#include "gpu/gpu_kv_cache.h"
#include "gpu/gpu_test_util.h"
#include "openmla/openmla.h"

namespace openmla::testing {
namespace {

constexpr int64_t kDimV = 512;
constexpr int kSparePages = 3;  // pages no request uses: NaN, some named by table entries past use

// How a case gets its split-KV schedule.
constexpr int kOwnSchedule = 0;      // none given: the call plans into its workspace
constexpr int kDeviceSchedule = -1;  // plan_decode_schedule for the device's worker count

struct Case {
  KVFormat format = KVFormat::kFP8_V32;
  int d_qk = 576;  // bf16 only; the other formats fix it
  bool interleaved = false;
  int page = 64;
  int s_q = 1, h_q = 16;
  std::vector<int> seqlens = {100};
  bool causal = false;
  int num_sm_parts = kOwnSchedule;  // > 0: plan_decode_schedule with that many workers
  bool strided = true;              // q, out and lse with gaps
  uint64_t seed = 1;

  int dims() const { return kv_format_info(format, d_qk).d_qk; }
  int64_t batch() const { return static_cast<int64_t>(seqlens.size()); }
  std::string name() const {
    std::string s = std::string(kv_format_name(format)) + (interleaved ? "/interleaved" : "") +
                    " d" + std::to_string(dims()) + " page " + std::to_string(page) + " s_q " +
                    std::to_string(s_q) + " h_q " + std::to_string(h_q) +
                    (causal ? " causal" : "") + " schedule " +
                    (num_sm_parts == kOwnSchedule      ? std::string("own")
                     : num_sm_parts == kDeviceSchedule ? std::string("device")
                                                       : std::to_string(num_sm_parts)) +
                    (strided ? "" : " unstrided") + " seed " + std::to_string(seed) + " seqlens [";
    for (size_t i = 0; i < seqlens.size() && i < 8; ++i) {
      if (i > 0) s += ",";
      s += std::to_string(seqlens[i]);
    }
    if (seqlens.size() > 8) s += ",...(" + std::to_string(seqlens.size()) + ")";
    return s + "]";
  }
};

// The pages of a case: request i owns ceil(L_i / page) blocks drawn from a shuffled pool; its
// table entries past those alternate -1 and a spare (NaN) page, which no valid position names.
struct Paging {
  int64_t num_blocks = 0;
  HostTensor table, lens;
  std::vector<int64_t> live;  // the slots some t < L_i names, ascending
};

Paging make_paging(const Case& c, Rng& rng) {
  Paging p;
  const int64_t b = c.batch(), page = c.page;
  std::vector<int64_t> need(b);
  int64_t used = 0, max_need = 0;
  for (int64_t i = 0; i < b; ++i) {
    need[i] = (c.seqlens[i] + page - 1) / page;
    used += need[i];
    max_need = std::max(max_need, need[i]);
  }
  p.num_blocks = used + kSparePages;
  const std::vector<int32_t> pool = random_permutation(p.num_blocks, rng);
  const int64_t max_blocks = max_need + 2;
  p.table = HostTensor(DType::kInt32, {b, max_blocks});
  p.lens = HostTensor(DType::kInt32, {b});
  int64_t next = 0;
  for (int64_t i = 0; i < b; ++i) {
    p.lens.set({i}, c.seqlens[i]);
    for (int64_t j = 0; j < max_blocks; ++j) {
      int32_t id = -1;
      if (j < need[i]) {
        id = pool[next++];
        for (int64_t t = j * page; t < std::min<int64_t>((j + 1) * page, c.seqlens[i]); ++t) {
          p.live.push_back(id * page + t % page);
        }
      } else if ((i + j) % 2 == 0) {
        id = pool[used + (i + j) / 2 % kSparePages];
      }
      p.table.set({i, j}, id);
    }
  }
  std::sort(p.live.begin(), p.live.end());
  return p;
}

CacheSpec cache_spec(const Case& c, int64_t num_blocks) {
  CacheSpec s;
  s.format = c.format;
  s.d_qk = c.d_qk;
  s.interleaved = c.interleaved;
  s.page = c.page;
  s.num_blocks = num_blocks;
  s.pad_bytes = c.interleaved ? 80 : 0;  // a block stride past the footprint
  return s;
}

// q [b, s_q, h_q, d], out [b, s_q, h_q, 512] and lse [b, h_q, s_q], with gaps when strided (in
// 16-byte multiples: the GPU's loads and stores want them).
HostTensor make_q(const Case& c) {
  const int64_t b = c.batch(), d = c.dims();
  if (!c.strided) return HostTensor(DType::kBF16, {b, c.s_q, c.h_q, d});
  const int64_t head = d + 64, seq = c.h_q * head + 64, batch = c.s_q * seq + 64;
  return HostTensor(DType::kBF16, {b, c.s_q, c.h_q, d}, {batch, seq, head, 1});
}
HostTensor make_out(const Case& c) {
  const int64_t b = c.batch();
  if (!c.strided) return HostTensor(DType::kBF16, {b, c.s_q, c.h_q, kDimV});
  const int64_t head = kDimV + 32, seq = c.h_q * head + 32, batch = c.s_q * seq + 32;
  return HostTensor(DType::kBF16, {b, c.s_q, c.h_q, kDimV}, {batch, seq, head, 1});
}
HostTensor make_lse(const Case& c) {
  const int64_t b = c.batch();
  if (!c.strided) return HostTensor(DType::kFP32, {b, c.h_q, c.s_q});
  const int64_t head = c.s_q + 3, batch = c.h_q * head + 5;
  return HostTensor(DType::kFP32, {b, c.h_q, c.s_q}, {batch, head, 1});
}

// A GPU-planned schedule (what a serving step passes to every layer). Its buffers are allocated
// (and poisoned) up front, so the plan itself can be enqueued inside a graph capture.
struct DeviceSchedule {
  DeviceBuffer metadata, num_splits;
  DecodeSchedule view;
};

DeviceSchedule schedule_buffers(const Case& c) {
  int device_parts = 0;
  const Status st = decode_num_sm_parts(Device::cuda(0), c.s_q, c.h_q, 1, &device_parts);
  if (!st.ok()) throw std::runtime_error("decode_num_sm_parts: " + st.message());
  const int parts = c.num_sm_parts == kDeviceSchedule ? device_parts : c.num_sm_parts;
  // dense_decode_workspace_size sizes the workspace for the device's workers: no more here.
  if (parts > device_parts) throw std::runtime_error("more schedule workers than the device's");
  const int64_t b = c.batch();
  DeviceSchedule s;
  s.metadata = DeviceBuffer(sizeof(int32_t) * parts * kScheduleMetadataInts);
  s.num_splits = DeviceBuffer(sizeof(int32_t) * (b + 1));
  s.metadata.poison();
  s.num_splits.poison();
  s.view.metadata = TensorView::contiguous(s.metadata.data(), DType::kInt32,
                                           {parts, kScheduleMetadataInts}, Device::cuda(0));
  s.view.num_splits =
      TensorView::contiguous(s.num_splits.data(), DType::kInt32, {b + 1}, Device::cuda(0));
  return s;
}

Status plan_schedule(const Case& c, const DeviceSchedule& s, const TensorView& seqlens,
                     cudaStream_t stream) {
  DecodeScheduleArgs a;
  a.seqlens = seqlens;
  a.s_q = c.s_q, a.h_q = c.h_q, a.h_kv = 1;
  a.num_sm_parts = static_cast<int>(s.view.metadata.shape[0]);
  a.block_tokens = 64;
  a.metadata = s.view.metadata;
  a.num_splits = s.view.num_splits;
  return plan_decode_schedule(a, stream);
}

// One case: host tensors (the CPU reference runs on them, its outputs in out/lse) and their
// device mirrors, with the GPU's arguments ready (a schedule's buffers too; plan() fills them).
struct Problem {
  Case c;
  Rng rng;
  Paging paging;
  TestCache cache;
  HostTensor q, out, lse;
  DenseDecodeArgs cpu, gpu;
  DeviceTensor d_q, d_table, d_lens, d_out, d_lse;
  DeviceBuffer workspace;
  DeviceSchedule schedule;

  explicit Problem(const Case& cs)
      : c(cs), rng(cs.seed), paging(make_paging(cs, rng)),
        cache(cache_spec(cs, paging.num_blocks), rng, paging.live) {
    q = make_q(c);
    q.poison();  // q's gaps NaN too
    q.fill_normal(rng, rng.uniform(0.5, 2.0));
    out = make_out(c);
    lse = make_lse(c);
    out.poison();
    lse.poison();
    cpu.q = q.view();
    cpu.kv_cache = cache.host.cache;
    cpu.block_table = paging.table.view();
    cpu.cache_seqlens = paging.lens.view();
    cpu.causal = c.causal;
    cpu.out = out.view();
    cpu.lse = lse.view();

    gpu = cpu;
    d_q = to_device(q), d_table = to_device(paging.table), d_lens = to_device(paging.lens);
    d_out = poisoned_like(out), d_lse = poisoned_like(lse);
    gpu.q = d_q.view;
    gpu.kv_cache = cache.gpu;
    gpu.block_table = d_table.view;
    gpu.cache_seqlens = d_lens.view;
    gpu.out = d_out.view;
    gpu.lse = d_lse.view;
    const size_t ws = dense_decode_workspace_size(Device::cuda(0), static_cast<int>(c.batch()),
                                                  c.s_q, c.h_q, 1, static_cast<int>(kDimV));
    workspace = DeviceBuffer(ws);
    workspace.poison();
    gpu.workspace = {workspace.data(), ws};
    if (c.num_sm_parts != kOwnSchedule) {
      schedule = schedule_buffers(c);
      gpu.schedule = schedule.view;
    }
  }

  void reference() {
    const Status st = dense_decode(cpu);
    ASSERT_TRUE(st.ok()) << "CPU reference: " << st.message();
  }
  // Enqueues the case's schedule, if it has one (gpu.schedule already points at its buffers).
  Status plan(cudaStream_t stream) const {
    if (c.num_sm_parts == kOwnSchedule) return Status::Ok();
    return plan_schedule(c, schedule, d_lens.view, stream);
  }
};

// The GPU's out and lse against the reference's.
void expect_matches_reference(const Problem& p, const std::string& what = "") {
  HostTensor got_out = same_layout(p.out), got_lse = same_layout(p.lse);
  copy_to_host(p.d_out, &got_out);
  copy_to_host(p.d_lse, &got_lse);
  const std::vector<double> out = got_out.values(), ref_out = p.out.values();
  const double out_err = relative_l2_error(out, ref_out);
  const double lse_err = max_lse_error(got_lse.values(), p.lse.values());
  if (verbose()) {
    std::printf("  %s%s: out %.2e lse %.2e\n", p.c.name().c_str(), what.c_str(), out_err, lse_err);
  }
  EXPECT_LE(out_err, 1e-2) << what;  // NaN fails too
  EXPECT_LE(lse_err, 1e-3) << what;
  int64_t bad_zeros = 0;
  for (size_t k = 0; k < ref_out.size(); ++k) bad_zeros += ref_out[k] == 0.0 && out[k] != 0.0;
  EXPECT_EQ(bad_zeros, 0) << what << ": outputs the reference has exactly 0 (lonely queries)";
  EXPECT_EQ(count_written_gaps(got_out), 0) << what << ": out written outside its view";
  EXPECT_EQ(count_written_gaps(got_lse), 0) << what << ": lse written outside its view";
}

void run_case(const Case& c) {
  SCOPED_TRACE(c.name());
  Problem p(c);
  ASSERT_NO_FATAL_FAILURE(p.reference());
  const Status planned = p.plan(nullptr);
  ASSERT_TRUE(planned.ok()) << "plan_decode_schedule: " << planned.message();
  const Status st = dense_decode(p.gpu);
  ASSERT_TRUE(st.ok()) << st.message();
  check_cuda(cudaGetLastError(), "dense_decode launch");
  synchronize();
  expect_matches_reference(p);
}

// Stops at the first case that cannot run (while the kernel is missing: the first one).
void run_cases(const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    run_case(c);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

struct Format {
  KVFormat format;
  int d_qk;
};
const Format kFormats[] = {{KVFormat::kFP8_V32, 576}, {KVFormat::kFP8_Model1, 512},
                           {KVFormat::kFP8_MX, 512},  {KVFormat::kFP4, 512},
                           {KVFormat::kBF16, 576},    {KVFormat::kBF16, 512}};
const Format kQuantised[] = {{KVFormat::kFP8_V32, 576}, {KVFormat::kFP8_Model1, 512},
                             {KVFormat::kFP8_MX, 512}, {KVFormat::kFP4, 512}};

// --- small cases (also run under compute-sanitizer) --------------------------------------------
// Every format in both layouts: empty, one-key, partial-page and multi-page requests side by side.
TEST(DenseDecodeKVCacheSmall, EveryFormatAndLayout) {
  std::vector<Case> cases;
  uint64_t seed = 100;
  for (const Format& f : kFormats) {
    for (bool interleaved : {false, true}) {
      cases.push_back({.format = f.format, .d_qk = f.d_qk, .interleaved = interleaved,
                       .page = interleaved ? 16 : 64, .s_q = interleaved ? 2 : 1,
                       .h_q = interleaved ? 16 : 64, .seqlens = {0, 70, 1, 129},
                       .causal = interleaved, .seed = seed++});
    }
  }
  run_cases(cases);
}

// Causal with L < s_q: the first queries of a request see no key (out 0, lse +inf).
TEST(DenseDecodeKVCacheSmall, CausalLonelyQueries) {
  run_cases({{.format = KVFormat::kFP8_V32, .page = 16, .s_q = 4, .h_q = 8,
              .seqlens = {2, 0, 37}, .causal = true, .seed = 110},
             {.format = KVFormat::kFP4, .page = 16, .s_q = 3, .h_q = 32, .seqlens = {1, 80},
              .causal = true, .seed = 111}});
}

// Precomputed schedules: the device's worker count, and few workers (several requests per
// worker, requests split across workers and combined).
TEST(DenseDecodeKVCacheSmall, PrecomputedSchedule) {
  run_cases({{.format = KVFormat::kFP8_Model1, .h_q = 16, .seqlens = {300, 0, 129, 5},
              .num_sm_parts = kDeviceSchedule, .seed = 120},
             {.format = KVFormat::kFP8_MX, .s_q = 2, .h_q = 64, .seqlens = {0, 900, 33, 64},
              .causal = true, .num_sm_parts = 3, .seed = 121}});
}

// --- formats x layouts x head counts ------------------------------------------------------------
// h_q 1-128 in every format and layout, s_q 1-4, causal and not, page 64 (default layout) and 16
// (interleaved).
TEST(DenseDecodeKVCache, EveryFormatLayoutAndHeadCount) {
  std::vector<Case> cases;
  uint64_t seed = 1000;
  const int heads[] = {1, 8, 16, 32, 64, 128};
  for (const Format& f : kFormats) {
    for (bool interleaved : {false, true}) {
      for (int k = 0; k < 6; ++k) {
        cases.push_back({.format = f.format, .d_qk = f.d_qk, .interleaved = interleaved,
                         .page = interleaved ? 16 : 64, .s_q = 1 + (k + interleaved) % 4,
                         .h_q = heads[k], .seqlens = {300, 77, 0, 129},
                         .causal = (k + interleaved) % 2 == 1, .seed = seed++});
      }
    }
  }
  run_cases(cases);
}

// Pages of 16 and 256 tokens in each format's default layout, lengths on and around page edges.
TEST(DenseDecodeKVCache, PageSizes) {
  std::vector<Case> cases;
  uint64_t seed = 2000;
  for (const Format& f : kFormats) {
    for (int page : {16, 256}) {
      cases.push_back({.format = f.format, .d_qk = f.d_qk, .page = page, .h_q = 16,
                       .seqlens = {1, 255, 256, 257, 0, 63}, .seed = seed++});
    }
  }
  run_cases(cases);
}

// --- query tokens -------------------------------------------------------------------------------
TEST(DenseDecodeKVCache, QueryTokensCausal) {
  std::vector<Case> cases;
  uint64_t seed = 3000;
  for (const Format& f : {kQuantised[0], kQuantised[3]}) {
    for (int s_q : {1, 2, 3, 4}) {
      for (bool causal : {false, true}) {
        cases.push_back({.format = f.format, .d_qk = f.d_qk, .s_q = s_q, .h_q = 16,
                         .seqlens = {s_q - 1, 64 + s_q, 190}, .causal = causal, .seed = seed++});
      }
    }
  }
  // s_q 8 x 16 heads: 128 query rows a request.
  cases.push_back({.format = KVFormat::kFP8_Model1, .d_qk = 512, .s_q = 8, .h_q = 16,
                   .seqlens = {260, 3}, .causal = true, .seed = seed++});
  run_cases(cases);
}

// --- batches and lengths ------------------------------------------------------------------------
// A batch padded with empty requests, and one with nothing but.
TEST(DenseDecodeKVCache, VarlenWithEmptyRequests) {
  std::vector<Case> cases;
  uint64_t seed = 4000;
  for (const Format& f : kFormats) {
    cases.push_back({.format = f.format, .d_qk = f.d_qk, .h_q = 64,
                     .seqlens = {0, 500, 0, 0, 1, 64, 0, 0, 0, 0, 0, 1000}, .seed = seed++});
  }
  cases.push_back({.h_q = 32, .seqlens = {0, 0, 0, 0}, .seed = seed++});
  cases.push_back({.format = KVFormat::kFP4, .d_qk = 512, .s_q = 2, .h_q = 16,
                   .seqlens = {0, 0, 0}, .causal = true, .seed = seed++});
  run_cases(cases);
}

// One request over a long context: split across every worker, then combined.
TEST(DenseDecodeKVCache, LongContextSplitKV) {
  std::vector<Case> cases;
  uint64_t seed = 5000;
  for (const Format& f : kQuantised) {
    cases.push_back({.format = f.format, .d_qk = f.d_qk, .h_q = 16, .seqlens = {6001},
                     .seed = seed++});
  }
  cases.push_back({.format = KVFormat::kFP8_V32, .s_q = 2, .h_q = 64, .seqlens = {20000},
                   .causal = true, .num_sm_parts = kDeviceSchedule, .seed = seed++});
  cases.push_back({.format = KVFormat::kFP4, .d_qk = 512, .interleaved = true, .page = 16,
                   .h_q = 128, .seqlens = {9000}, .seed = seed++});
  run_cases(cases);
}

// 32-64 requests of random lengths (some empty): memory-bound (16 heads) and compute-bound (128).
TEST(DenseDecodeKVCache, LargeBatches) {
  std::vector<Case> cases;
  uint64_t seed = 6000;
  Rng rng(5999);
  for (const Format& f : kQuantised) {
    for (int b : {32, 64}) {
      std::vector<int> lens(b);
      for (int& l : lens) l = rng.coin(0.1) ? 0 : static_cast<int>(rng.randint(1, 400));
      cases.push_back({.format = f.format, .d_qk = f.d_qk, .s_q = b == 32 ? 1 : 2,
                       .h_q = b == 32 ? 128 : 16, .seqlens = lens, .causal = b == 64,
                       .strided = false, .seed = seed++});
    }
  }
  run_cases(cases);
}

// --- schedules ----------------------------------------------------------------------------------
// The call's own plan, the device's (plan_decode_schedule), and few workers: every worker walks
// several requests, requests split across workers.
TEST(DenseDecodeKVCache, OwnDeviceAndFewWorkerSchedules) {
  std::vector<Case> cases;
  uint64_t seed = 7000;
  for (const Format& f : {kQuantised[1], kQuantised[3]}) {
    for (int parts : {kOwnSchedule, kDeviceSchedule, 1, 2, 5, 17}) {
      cases.push_back({.format = f.format, .d_qk = f.d_qk, .h_q = 16,
                       .seqlens = {0, 900, 33, 0, 1200, 64, 5}, .num_sm_parts = parts,
                       .seed = seed++});
      cases.push_back({.format = f.format, .d_qk = f.d_qk, .page = 16, .s_q = 2, .h_q = 128,
                       .seqlens = {0, 300, 129, 700}, .causal = true, .num_sm_parts = parts,
                       .seed = seed++});
    }
  }
  run_cases(cases);
}

// --- CUDA graph: schedule + a few layers, captured once, replayed -------------------------------
// Each layer its own cache (three formats, so one graph holds launches of several), q, block
// table and outputs over the same lengths; one schedule planned inside the graph serves them all.
// The second replay runs with new queries written into the same buffers.
TEST(DenseDecodeKVCacheGraph, ScheduleAndLayersReplayed) {
  const std::vector<int> lens = {0, 1500, 77, 4000, 1, 640};
  std::vector<Problem> layers;
  layers.reserve(3);
  uint64_t seed = 8000;
  for (const Format& f : {kQuantised[0], kQuantised[1], kQuantised[3]}) {
    layers.emplace_back(Case{.format = f.format, .d_qk = f.d_qk, .s_q = 2, .h_q = 64,
                             .seqlens = lens, .causal = true, .num_sm_parts = kDeviceSchedule,
                             .seed = seed++});
  }
  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaGraph_t graph;
  check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
  const Status planned = layers[0].plan(stream);
  EXPECT_TRUE(planned.ok()) << "plan_decode_schedule: " << planned.message();
  for (Problem& p : layers) {
    p.gpu.schedule = layers[0].schedule.view;  // the same lengths: one plan for every layer
    const Status st = dense_decode(p.gpu, stream);
    EXPECT_TRUE(st.ok()) << p.c.name() << ": " << st.message();  // (no return inside a capture)
  }
  check_cuda(cudaStreamEndCapture(stream, &graph), "end capture");
  cudaGraphExec_t exec = nullptr;
  if (!HasFailure()) {
    check_cuda(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    for (int replay = 0; replay < 2; ++replay) {
      for (Problem& p : layers) {
        if (replay == 1) {  // new queries in the same buffers: the replay must use them
          p.q.fill_normal(p.rng);
          p.d_q.buffer.copy_from_host(p.q.view().data, storage_bytes(p.q));
          p.d_out.buffer.poison();
          p.d_lse.buffer.poison();
        }
        ASSERT_NO_FATAL_FAILURE(p.reference());
      }
      check_cuda(cudaGraphLaunch(exec, stream), "graph launch");
      check_cuda(cudaStreamSynchronize(stream), "sync");
      for (const Problem& p : layers) {
        SCOPED_TRACE(p.c.name());
        expect_matches_reference(p, " replay " + std::to_string(replay));
      }
    }
    check_cuda(cudaGraphExecDestroy(exec), "exec destroy");
  }
  check_cuda(cudaGraphDestroy(graph), "graph destroy");
  check_cuda(cudaStreamDestroy(stream), "stream destroy");
}

}  // namespace
}  // namespace openmla::testing
