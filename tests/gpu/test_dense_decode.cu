// Dense decode on the GPU (src/cuda/sm90/dense_decode) against the CPU backend: the same public
// openmla::dense_decode call on host copies of the same tensors is the reference. Fresh random
// data per case, every cache slot a request does not own NaN (the tails of partly used pages
// too), block tables permuted, q / k_cache / out / lse strided with gaps, outputs and workspace
// poisoned before the launch, gaps checked untouched afterwards.
//
// Also: the GPU split-KV planner against core::plan_decode_schedule_host (bit for bit), explicit
// schedules with few workers (several requests per CTA, requests split across CTAs), CUDA-graph
// capture and replay of schedule + decode for two layers, and the launcher's argument errors.
// Cases named *Small* are the ones compute-sanitizer runs (tools/device_check.sh).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "common/test_data.h"
#include "core/schedule.h"
#include "cuda/common/decode_schedule.h"
#include "cuda/sm90/dense_decode/launch.h"
#include "cuda/sm90/dense_decode/tuning.h"
#include "gpu/gpu_test_util.h"
#include "openmla/ops.h"

namespace openmla::testing {
namespace {

constexpr int kDimV = 512;

struct DecodeCase {
  DType dtype = DType::kBF16;
  int d_qk = 576;
  int s_q = 1, h_q = 16, h_kv = 1, page_size = 64;
  std::vector<int> seqlens = {100};
  bool causal = false;
  bool strided = true;    // q, k_cache, out, lse with padded strides (gaps)
  int num_sm_parts = 0;   // > 0: an explicit GPU-planned schedule with that many workers
  uint64_t seed = 1;
  int out_gap = 32;       // strided out: elements between heads, tokens, requests (2: 4-byte rows)
  double q_sigma = 1.0;   // q ~ N(0, q_sigma^2): wider scores move the running max more often
  int device = 0;         // the GPU every tensor lives on (current during the case)
};

std::string describe(const DecodeCase& c) {
  std::string s = std::string(dtype_name(c.dtype)) + " d" + std::to_string(c.d_qk) + " s_q " +
                  std::to_string(c.s_q) + " h_q " + std::to_string(c.h_q) + " h_kv " +
                  std::to_string(c.h_kv) + " page " + std::to_string(c.page_size) +
                  (c.causal ? " causal" : "") + " parts " + std::to_string(c.num_sm_parts) +
                  (c.device != 0 ? " cuda:" + std::to_string(c.device) : "") + " seqlens [";
  for (size_t i = 0; i < c.seqlens.size() && i < 8; ++i) {
    if (i > 0) s += ",";
    s += std::to_string(c.seqlens[i]);
  }
  if (c.seqlens.size() > 8) s += ",...(" + std::to_string(c.seqlens.size()) + ")";
  return s + "]";
}

// Host-side inputs of one case and the CPU reference outputs.
struct HostProblem {
  HostTensor q, k_cache, block_table, seqlens, out_ref, lse_ref;
  int64_t batch = 0;
};

HostProblem make_problem(const DecodeCase& c, Rng& rng) {
  HostProblem p;
  const int64_t b = static_cast<int64_t>(c.seqlens.size());
  p.batch = b;
  const int64_t d = c.d_qk, ps = c.page_size, hkv = c.h_kv;
  const int64_t pad = c.strided ? 64 : 0;  // elements, keeps 16-byte multiples

  // Pages: each request gets ceil(L / page) physical blocks from a shuffled pool with spares.
  std::vector<int64_t> need(b);
  int64_t total = 0, max_need = 1;
  for (int64_t i = 0; i < b; ++i) {
    need[i] = (c.seqlens[i] + ps - 1) / ps;
    total += need[i];
    max_need = std::max(max_need, need[i]);
  }
  const int64_t num_blocks = total + 3;
  const int64_t max_blocks = max_need + 1;
  const std::vector<int32_t> pool = random_permutation(num_blocks, rng);

  p.seqlens = HostTensor(DType::kInt32, {b});
  p.block_table = HostTensor(DType::kInt32, {b, max_blocks});
  p.block_table.poison(-1);
  int64_t next = 0;
  for (int64_t i = 0; i < b; ++i) {
    p.seqlens.set({i}, c.seqlens[i]);
    for (int64_t j = 0; j < need[i]; ++j) p.block_table.set({i, j}, pool[next++]);
  }

  const int64_t head_stride = d + pad, page_stride = hkv * head_stride + pad;
  const int64_t block_stride = ps * page_stride + pad;
  p.k_cache = HostTensor(c.dtype, {num_blocks, ps, hkv, d},
                         {block_stride, page_stride, head_stride, 1});
  p.k_cache.poison();  // unused slots (and gaps) stay NaN
  for (int64_t i = 0; i < b; ++i) {
    for (int64_t t = 0; t < c.seqlens[i]; ++t) {
      const int64_t block = static_cast<int64_t>(p.block_table.get({i, t / ps}));
      for (int64_t g = 0; g < hkv; ++g) {
        for (int64_t e = 0; e < d; ++e) p.k_cache.set({block, t % ps, g, e}, rng.normal());
      }
    }
  }

  const int64_t hq = c.h_q, sq = c.s_q;
  const int64_t q_head = d + pad, q_seq = hq * q_head + pad, q_batch = sq * q_seq + pad;
  p.q = HostTensor(c.dtype, {b, sq, hq, d}, {q_batch, q_seq, q_head, 1});
  p.q.poison();
  p.q.fill_normal(rng, c.q_sigma);

  p.out_ref = HostTensor(c.dtype, {b, sq, hq, kDimV});
  p.lse_ref = HostTensor(DType::kFP32, {b, hq, sq});
  return p;
}

DenseDecodeArgs args_of(const TensorView& q, const TensorView& k, const TensorView& table,
                        const TensorView& seqlens, const TensorView& out, const TensorView& lse,
                        bool causal) {
  DenseDecodeArgs a;
  a.q = q, a.k_cache = k, a.block_table = table, a.cache_seqlens = seqlens;
  a.out = out, a.lse = lse, a.causal = causal;
  return a;
}

void run_reference(HostProblem* p, bool causal) {
  const DenseDecodeArgs a = args_of(p->q.view(), p->k_cache.view(), p->block_table.view(),
                                    p->seqlens.view(), p->out_ref.view(), p->lse_ref.view(), causal);
  const Status st = dense_decode(a);
  ASSERT_TRUE(st.ok()) << "CPU reference: " << st.message();
}

// Output tensors for the GPU: strided (gaps) when asked.
HostTensor make_out(const DecodeCase& c, int64_t b) {
  if (!c.strided) return HostTensor(c.dtype, {b, c.s_q, c.h_q, kDimV});
  const int64_t g = c.out_gap;
  const int64_t head = kDimV + g, seq = c.h_q * head + g, batch = c.s_q * seq + g;
  return HostTensor(c.dtype, {b, c.s_q, c.h_q, kDimV}, {batch, seq, head, 1});
}
HostTensor make_lse(const DecodeCase& c, int64_t b) {
  if (!c.strided) return HostTensor(DType::kFP32, {b, c.h_q, c.s_q});
  const int64_t head = c.s_q + 3, batch = c.h_q * head + 5;
  return HostTensor(DType::kFP32, {b, c.h_q, c.s_q}, {batch, head, 1});
}

struct Errors {
  double out = 0, lse = 0;
  int64_t out_gaps = 0, lse_gaps = 0;
};

Errors compare(const HostProblem& p, const HostTensor& out, const HostTensor& lse) {
  Errors e;
  e.out = relative_l2_error(out.values(), p.out_ref.values());
  e.lse = max_lse_error(lse.values(), p.lse_ref.values());
  e.out_gaps = count_written_gaps(out);
  e.lse_gaps = count_written_gaps(lse);
  return e;
}

void expect_close(const Errors& e, const std::string& what) {
  EXPECT_LT(e.out, 1e-2) << what;  // NaN fails too
  EXPECT_LT(e.lse, 1e-3) << what;
  EXPECT_EQ(e.out_gaps, 0) << what << ": out written outside its view";
  EXPECT_EQ(e.lse_gaps, 0) << what << ": lse written outside its view";
  if (verbose()) std::printf("  %s: out rel err %.3g, lse err %.3g\n", what.c_str(), e.out, e.lse);
}

// A GPU-planned schedule of `parts` workers for device seqlens.
struct DeviceSchedule {
  DeviceBuffer metadata, num_splits;
  DecodeSchedule view;
};
DeviceSchedule plan_on_gpu(const TensorView& seqlens, int64_t batch, int parts, const DecodeCase& c,
                           cudaStream_t stream) {
  DeviceSchedule s;
  s.metadata = DeviceBuffer(sizeof(int32_t) * parts * kScheduleMetadataInts);
  s.num_splits = DeviceBuffer(sizeof(int32_t) * (batch + 1));
  s.metadata.poison();
  s.num_splits.poison();
  s.view.metadata = TensorView::contiguous(s.metadata.data(), DType::kInt32,
                                           {parts, kScheduleMetadataInts}, Device::cuda(c.device));
  s.view.num_splits = TensorView::contiguous(s.num_splits.data(), DType::kInt32, {batch + 1},
                                             Device::cuda(c.device));
  DecodeScheduleArgs a;
  a.seqlens = seqlens;
  a.s_q = c.s_q, a.h_q = c.h_q, a.h_kv = c.h_kv;
  a.num_sm_parts = parts;
  a.block_tokens = 64;
  a.metadata = s.view.metadata;
  a.num_splits = s.view.num_splits;
  const Status st = plan_decode_schedule(a, stream);
  if (!st.ok()) throw std::runtime_error("plan_decode_schedule: " + st.message());
  return s;
}

size_t workspace_bytes(const DecodeCase& c, int64_t batch) {
  const size_t by_device = dense_decode_workspace_size(
      Device::cuda(c.device), static_cast<int>(batch), c.s_q, c.h_q, c.h_kv, kDimV);
  if (c.num_sm_parts <= 0) return by_device;
  return std::max(by_device, cuda::sm90::dense_decode_workspace_bytes(
                                 static_cast<int>(batch), c.s_q, c.h_q, c.h_kv, kDimV, c.num_sm_parts));
}

// Makes `device` current for a scope (buffers are allocated on the current device).
struct CurrentDevice {
  explicit CurrentDevice(int device) { check_cuda(cudaSetDevice(device), "cudaSetDevice"); }
  ~CurrentDevice() { (void)cudaSetDevice(0); }
};

// The launch settings the decodes below run with: the production ones (the public dense_decode)
// unless a TuningScope is alive, whose `tuning` (the defaults until a test changes them) then
// goes to cuda::sm90::dense_decode_with_tuning (the kernel's other paths: tuning.h).
const cuda::sm90::DenseDecodeTuning* g_tuning = nullptr;
struct TuningScope {
  static constexpr cuda::sm90::DenseDecodeTuning kDefaults{};
  cuda::sm90::DenseDecodeTuning tuning;
  TuningScope() { g_tuning = &tuning; }
  ~TuningScope() { g_tuning = nullptr; }
  TuningScope(const TuningScope&) = delete;
  TuningScope& operator=(const TuningScope&) = delete;
};

// One decode on the GPU, then out and lse back to the host (their whole storage, gaps included).
void decode_to_host(const DenseDecodeArgs& a, const DeviceTensor& out_d, HostTensor* out,
                    const DeviceTensor& lse_d, HostTensor* lse) {
  const Status st =
      g_tuning != nullptr ? cuda::sm90::dense_decode_with_tuning(a, *g_tuning) : dense_decode(a);
  ASSERT_TRUE(st.ok()) << st.message();
  check_cuda(cudaGetLastError(), "dense_decode launch");
  synchronize();
  copy_to_host(out_d, out);
  copy_to_host(lse_d, lse);
}

// A valid small decode's device buffers and arguments, for a test to break one argument of (the
// launcher's refusals, a corrupted block table).
struct LauncherCase {
  HostProblem p;
  DeviceTensor q, k, table, seqlens, out, lse;
  DeviceBuffer workspace;
  DenseDecodeArgs args;
  LauncherCase(const DecodeCase& c, uint64_t seed, size_t workspace_size) {
    Rng rng(seed);
    p = make_problem(c, rng);
    q = to_device(p.q), k = to_device(p.k_cache), table = to_device(p.block_table);
    seqlens = to_device(p.seqlens);
    out = poisoned_like(make_out(c, p.batch)), lse = poisoned_like(make_lse(c, p.batch));
    workspace = DeviceBuffer(workspace_size);
    args = args_of(q.view, k.view, table.view, seqlens.view, out.view, lse.view, false);
    args.workspace = {workspace.data(), workspace.bytes()};
  }
};

void run_case(const DecodeCase& c) {
  SCOPED_TRACE(describe(c));
  Rng rng(c.seed);
  HostProblem p = make_problem(c, rng);
  run_reference(&p, c.causal);
  const int64_t b = p.batch;

  const CurrentDevice current(c.device);
  DeviceTensor q = to_device(p.q, c.device), k = to_device(p.k_cache, c.device);
  DeviceTensor table = to_device(p.block_table, c.device);
  DeviceTensor seqlens = to_device(p.seqlens, c.device);
  HostTensor out = make_out(c, b), lse = make_lse(c, b);
  DeviceTensor out_d = poisoned_like(out, c.device), lse_d = poisoned_like(lse, c.device);
  DeviceBuffer workspace(workspace_bytes(c, b));
  workspace.poison();

  DenseDecodeArgs a = args_of(q.view, k.view, table.view, seqlens.view, out_d.view, lse_d.view,
                              c.causal);
  a.workspace = {workspace.data(), workspace.bytes()};
  DeviceSchedule schedule;
  if (c.num_sm_parts > 0) {
    schedule = plan_on_gpu(seqlens.view, b, c.num_sm_parts, c, nullptr);
    a.schedule = schedule.view;
  }
  ASSERT_NO_FATAL_FAILURE(decode_to_host(a, out_d, &out, lse_d, &lse));
  expect_close(compare(p, out, lse), describe(c));
}

// --- small cases (also run under compute-sanitizer) -------------------------------------------
TEST(DenseDecodeSmall, OneRequest) { run_case({.seqlens = {37}}); }
TEST(DenseDecodeSmall, VarlenWithEmpty) {
  run_case({.h_q = 8, .seqlens = {0, 130, 1, 64}, .seed = 2});
}
TEST(DenseDecodeSmall, CausalPage16) {
  run_case({.s_q = 2, .h_q = 4, .page_size = 16, .seqlens = {1, 45, 80}, .causal = true, .seed = 3});
}
TEST(DenseDecodeSmall, Fp16D512SplitAcrossWorkers) {
  run_case({.dtype = DType::kFP16, .d_qk = 512, .h_q = 16, .seqlens = {300, 5, 200},
            .num_sm_parts = 3, .seed = 4});
}

// The combine under memcheck: one request over 80 workers (one slot a lane, 8 warps a unit)
// and three requests over 20 (eight slots, 2 warps a unit).
TEST(DenseDecodeSmall, CombineUnits) {
  run_case({.h_q = 16, .seqlens = {5000}, .num_sm_parts = 80, .seed = 5});
  run_case({.s_q = 2, .h_q = 12, .seqlens = {900, 1300, 700}, .causal = true, .num_sm_parts = 20,
            .seed = 6});
}

// The pipeline across tile and request boundaries: tiles of a pair are scored by different
// warpgroups and each tile's PVs run under the next tile's QK^T, so odd and even tile counts,
// one-tile and one-key requests, empty requests between others, partial last tiles and several
// requests per CTA (few workers) all take other paths through it.
TEST(DenseDecodeSmall, PipelineBoundaries) {
  run_case({.h_q = 16, .seqlens = {37, 200, 129, 64, 0, 128}, .num_sm_parts = 2, .seed = 40});
  run_case({.h_q = 128, .seqlens = {65, 1, 192}, .num_sm_parts = 1, .seed = 41});
}
// A caller's schedule is checked for its shape only; its contents are trusted to be a plan of
// these lengths. The kernels still keep a wrong one inside the buffers: random garbage, extreme
// values and a stale plan (of longer lengths, at 16-key splits) leave the outside of out, lse
// and the workspace untouched (guard bands), and compute-sanitizer sees no access out of bounds
// (a Small test). What such a call writes inside out and lse is unspecified. The true plan,
// before and after, gives the right answer.
TEST(DenseDecodeSmall, CorruptedScheduleStaysInBounds) {
  const DecodeCase c{.h_q = 16, .page_size = 16, .seqlens = {0, 300, 129, 700, 37}, .seed = 170};
  Rng rng(c.seed);
  HostProblem p = make_problem(c, rng);
  run_reference(&p, false);
  const int b = static_cast<int>(p.batch);
  constexpr int kParts = 6;
  DeviceTensor q = to_device(p.q), k = to_device(p.k_cache), table = to_device(p.block_table);
  DeviceTensor seqlens = to_device(p.seqlens);
  HostTensor out = make_out(c, b), lse = make_lse(c, b);
  DeviceTensor out_d = poisoned_like(out), lse_d = poisoned_like(lse);
  const size_t ws_bytes =
      cuda::sm90::dense_decode_workspace_bytes(b, c.s_q, c.h_q, c.h_kv, kDimV, kParts);
  constexpr size_t kGuard = size_t{1} << 16;
  DeviceBuffer ws(ws_bytes + 2 * kGuard);  // [guard | workspace | guard]
  DeviceBuffer meta_d(sizeof(int32_t) * kParts * kScheduleMetadataInts);
  DeviceBuffer splits_d(sizeof(int32_t) * (b + 1));
  DenseDecodeArgs a = args_of(q.view, k.view, table.view, seqlens.view, out_d.view, lse_d.view,
                              false);
  a.workspace = {static_cast<char*>(ws.data()) + kGuard, ws_bytes};
  a.schedule.metadata = TensorView::contiguous(meta_d.data(), DType::kInt32,
                                               {kParts, kScheduleMetadataInts}, Device::cuda(0));
  a.schedule.num_splits = TensorView::contiguous(splits_d.data(), DType::kInt32, {b + 1},
                                                 Device::cuda(0));

  auto plan = [&](const std::vector<int32_t>& lens, int block_tokens, std::vector<int32_t>* meta,
                  std::vector<int32_t>* splits) {
    meta->assign(kParts * kScheduleMetadataInts, 0);
    splits->assign(b + 1, 0);
    core::plan_decode_schedule_host(lens.data(), b, kParts, block_tokens,
                                    core::kScheduleSplitOverheadBlocks,
                                    core::kScheduleCombineBlocks, meta->data(), splits->data());
  };
  // One call with this schedule; out and lse poisoned first, the guards checked after.
  auto run = [&](const std::vector<int32_t>& meta, const std::vector<int32_t>& splits,
                 const std::string& what) {
    SCOPED_TRACE(what);
    meta_d.copy_from_host(meta.data(), sizeof(int32_t) * meta.size());
    splits_d.copy_from_host(splits.data(), sizeof(int32_t) * splits.size());
    out_d.buffer.poison();
    lse_d.buffer.poison();
    ws.fill_bytes(0x5A);
    ASSERT_NO_FATAL_FAILURE(decode_to_host(a, out_d, &out, lse_d, &lse));
    EXPECT_EQ(count_written_gaps(out), 0) << "out written outside its view";
    EXPECT_EQ(count_written_gaps(lse), 0) << "lse written outside its view";
    const std::vector<uint8_t> bytes = to_host<uint8_t>(ws, ws.bytes());
    int64_t guard_changed = 0;
    for (size_t i = 0; i < kGuard; ++i) {
      guard_changed += bytes[i] != 0x5A;
      guard_changed += bytes[kGuard + ws_bytes + i] != 0x5A;
    }
    EXPECT_EQ(guard_changed, 0) << "bytes written outside the workspace";
  };

  std::vector<int32_t> lens(c.seqlens.begin(), c.seqlens.end()), meta, splits;
  plan(lens, 64, &meta, &splits);
  const std::vector<int32_t> true_meta = meta, true_splits = splits;
  run(true_meta, true_splits, "the true plan");
  expect_close(compare(p, out, lse), "the true plan");

  plan({900, 1000, 1200, 1100, 800}, 16, &meta, &splits);
  run(meta, splits, "a stale plan of longer lengths at 16-key splits");

  const int32_t kMin = std::numeric_limits<int32_t>::min();
  const int32_t kMax = std::numeric_limits<int32_t>::max();
  const std::vector<int32_t> extremes = {kMin, kMin + 1, -64, -1, 0, 1, b - 1, b, b + 1,
                                         kParts, 2 * kParts, 4096, kMax - 1, kMax};
  auto wild = [&]() -> int32_t {
    if (rng.coin()) return extremes[rng.randint(0, static_cast<int64_t>(extremes.size()) - 1)];
    return static_cast<int32_t>(rng.randint(-2000, 2000));
  };
  for (int trial = 0; trial < 24; ++trial) {
    meta = true_meta;
    splits = true_splits;
    const bool everything = trial % 4 == 3;  // every field, else a few
    const int changes = everything ? 0 : static_cast<int>(rng.randint(1, 4));
    for (int f = 0; f < kParts * 5; ++f) {  // the five fields a worker reads
      if (everything) meta[(f / 5) * kScheduleMetadataInts + f % 5] = wild();
    }
    for (size_t i = 0; everything && i < splits.size(); ++i) splits[i] = wild();
    for (int n = 0; n < changes; ++n) {
      if (rng.coin(0.6)) {
        meta[rng.randint(0, kParts - 1) * kScheduleMetadataInts + rng.randint(0, 4)] = wild();
      } else {
        splits[rng.randint(0, b)] = wild();
      }
    }
    run(meta, splits, "corrupted schedule " + std::to_string(trial));
    if (::testing::Test::HasFatalFailure()) return;
  }

  run(true_meta, true_splits, "the true plan again");
  expect_close(compare(p, out, lse), "the true plan again");
}

// Scores ~8x wider than unit-variance data: tile maxima differ by more than the lazy max's
// threshold (2^8), so the running max moves inside requests, in either warpgroup first, and O's
// rescales (skipped while a warp's factors are all 1) must run (attention/softmax.cuh lazy_max,
// rescale_rows_if).
TEST(DenseDecode, WideScoresMoveTheRunningMax) {
  uint64_t seed = 70;
  for (DType dtype : {DType::kBF16, DType::kFP16}) {
    run_case({.dtype = dtype, .h_q = 128, .seqlens = {1000, 777, 64, 3000}, .seed = seed++,
              .q_sigma = 8.0});
    run_case({.dtype = dtype, .h_q = 16, .seqlens = {2048, 5, 900}, .num_sm_parts = 5,
              .seed = seed++, .q_sigma = 8.0});
    run_case({.dtype = dtype, .s_q = 2, .h_q = 64, .seqlens = {513, 1500}, .causal = true,
              .seed = seed++, .q_sigma = 8.0});
  }
}

TEST(DenseDecode, PipelineBoundaries) {
  uint64_t seed = 50;
  run_case({.h_q = 128, .seqlens = {1000, 64, 1, 257, 0}, .seed = seed++});
  run_case({.s_q = 2, .h_q = 128, .page_size = 16, .seqlens = {300, 2, 129}, .causal = true,
            .seed = seed++});
  run_case({.dtype = DType::kFP16, .d_qk = 512, .s_q = 2, .h_q = 64, .page_size = 32,
            .seqlens = {515, 90}, .num_sm_parts = 3, .seed = seed++});
  run_case({.h_q = 128, .seqlens = {4000}, .num_sm_parts = 5, .seed = seed++});
  run_case({.h_q = 64, .seqlens = {128, 192, 64, 320, 1, 0, 63}, .num_sm_parts = 2, .seed = seed++});
  run_case({.d_qk = 512, .h_q = 128, .seqlens = {129, 255, 256, 2}, .num_sm_parts = 1, .seed = seed++});
}

// Q loaded every way (DenseDecodeTuning::q_tma, q_issuers): by TMA after the epilogue barrier
// from 8 compute warps (the default) or one, and by the compute threads' loads (q_tma 0).
// Several requests a CTA, empty ones and odd tile counts (a last pair without its odd tile)
// cross every request boundary.
TEST(DenseDecode, QLoadPaths) {
  TuningScope scope;
  auto& tuning = scope.tuning;
  uint64_t seed = 300;
  for (int mode : {8, 1, 0}) {
    tuning.q_tma = mode > 0 ? 1 : 0;
    tuning.q_issuers = mode > 0 ? mode : TuningScope::kDefaults.q_issuers;
    SCOPED_TRACE("q_tma " + std::to_string(tuning.q_tma) + ", q_issuers " +
                 std::to_string(tuning.q_issuers));
    run_case({.h_q = 16, .seqlens = {37, 200, 0, 129, 64, 1, 128}, .num_sm_parts = 2,
              .seed = seed++});
    run_case({.h_q = 128, .seqlens = {65, 0, 1, 192, 64, 640}, .num_sm_parts = 1, .seed = seed++});
    run_case({.dtype = DType::kFP16, .d_qk = 512, .s_q = 2, .h_q = 64, .page_size = 16,
              .seqlens = {300, 0, 129, 2}, .causal = true, .num_sm_parts = 2, .seed = seed++});
  }
}

// The combine's unit shapes: one slot a lane (one long request over every worker, 70001 keys)
// and eight (G = 1, 2, 4: 10 and 24 requests over the workers).
TEST(DenseDecode, CombineUnits) {
  Rng rng(339);
  std::vector<int> ten(10), many(24);
  for (int& l : ten) l = static_cast<int>(rng.randint(300, 2500));
  for (int& l : many) l = static_cast<int>(rng.randint(300, 2500));
  uint64_t seed = 340;
  run_case({.h_q = 16, .seqlens = {70001}, .seed = seed++});
  run_case({.dtype = DType::kFP16, .d_qk = 512, .h_q = 128, .seqlens = {40000}, .seed = seed++});
  run_case({.s_q = 2, .h_q = 40, .h_kv = 2, .seqlens = ten, .causal = true, .seed = seed++});
  run_case({.h_q = 24, .seqlens = many, .seed = seed++, .out_gap = 2});
  run_case({.s_q = 2, .h_q = 128, .page_size = 32, .seqlens = {0, 300, 129, 700},
            .causal = true, .num_sm_parts = 5, .seed = seed++});
}

// The output of unsplit requests every way: through shared memory and TMA stores (out_tma, the
// default where a map fits), 16-byte stores after a transpose inside each quad (output_stores 2;
// only where out's strides are multiples of 8 elements) and 4-byte stores (1, and always for out
// strides of 2 elements).
TEST(DenseDecode, OutputStores) {
  TuningScope scope;
  auto& tuning = scope.tuning;
  uint64_t seed = 320;
  for (int mode : {3, 2, 1}) {  // 3: out_tma over the 16-byte stores
    tuning.output_stores = mode == 3 ? 2 : mode;
    tuning.out_tma = mode == 3 ? 1 : 0;
    SCOPED_TRACE("output_stores " + std::to_string(tuning.output_stores) + ", out_tma " +
                 std::to_string(tuning.out_tma));
    run_case({.h_q = 128, .seqlens = {65, 0, 300}, .seed = seed++});
    run_case({.s_q = 2, .h_q = 24, .seqlens = {100, 1}, .causal = true, .seed = seed++});
    run_case({.dtype = DType::kFP16, .d_qk = 512, .h_q = 16, .seqlens = {200, 64}, .seed = seed++,
              .out_gap = 2});
    run_case({.h_q = 64, .seqlens = {129, 7}, .strided = false, .seed = seed++});
  }
}

// Unsplit requests' output staged in Q's shared memory and stored by TMA (out_tma), the next Q
// prefetched into L2 (q_prefetch): rows past the request's clipped by the map (s_q x group
// short of 64 rows, partial m-blocks), several requests a CTA (the next Q loads only once the
// stores have read the buffer), split requests beside unsplit ones, and outputs no map can
// describe (4-byte row strides, a group that neither divides nor is divided by 64) falling back
// to the register stores.
void run_out_tma_cases(uint64_t seed, bool small) {
  TuningScope scope;
  auto& tuning = scope.tuning;
  tuning.out_tma = 1;
  for (int prefetch : {0, 1}) {
    tuning.q_prefetch = prefetch;
    SCOPED_TRACE("q_prefetch " + std::to_string(prefetch));
    run_case({.h_q = 16, .seqlens = {37, 0, 200, 1, 129}, .num_sm_parts = 2, .seed = seed++});
    run_case({.s_q = 2, .h_q = 4, .seqlens = {1, 45, 80}, .causal = true, .num_sm_parts = 1,
              .seed = seed++});
    run_case({.h_q = 128, .seqlens = {65, 0, 300, 64}, .num_sm_parts = 1, .seed = seed++});
    run_case({.dtype = DType::kFP16, .d_qk = 512, .h_q = 16, .seqlens = {900, 30, 64},
              .num_sm_parts = 3, .seed = seed++});
    run_case({.h_q = 16, .seqlens = {200, 64}, .seed = seed++, .out_gap = 2});
    if (small) continue;
    run_case({.s_q = 3, .h_q = 64, .seqlens = {333, 70, 1000, 0}, .causal = true,
              .num_sm_parts = 2, .seed = seed++});
    run_case({.s_q = 2, .h_q = 128, .seqlens = {700, 1, 2048}, .causal = true, .seed = seed++});
    run_case({.h_q = 32, .h_kv = 2, .seqlens = {500, 64, 3}, .num_sm_parts = 2, .seed = seed++});
    run_case({.h_q = 1, .seqlens = {300, 5}, .seed = seed++});
    run_case({.s_q = 2, .h_q = 48, .seqlens = {100, 513}, .causal = true, .seed = seed++});
    run_case({.h_q = 128, .page_size = 16, .seqlens = {1000, 4000, 17, 64, 2500},
              .strided = false, .seed = seed++});
  }
}
TEST(DenseDecodeSmall, OutputThroughTma) { run_out_tma_cases(340, true); }
TEST(DenseDecode, OutputThroughTma) { run_out_tma_cases(360, false); }

// --- dtype x head dim ---------------------------------------------------------------------------
TEST(DenseDecode, DtypesAndHeadDims) {
  int seed = 10;
  for (DType dtype : {DType::kBF16, DType::kFP16}) {
    for (int d : {576, 512}) {
      run_case({.dtype = dtype, .d_qk = d, .h_q = 32, .seqlens = {513, 64, 1000, 7},
                .seed = static_cast<uint64_t>(seed++)});
      run_case({.dtype = dtype, .d_qk = d, .s_q = 2, .h_q = 128, .seqlens = {700, 129},
                .causal = true, .seed = static_cast<uint64_t>(seed++)});
    }
  }
}

// --- page sizes -----------------------------------------------------------------------------
TEST(DenseDecode, PageSizes) {
  int seed = 20;
  for (int page : {8, 16, 32, 64, 128, 256}) {
    run_case({.h_q = 16, .page_size = page, .seqlens = {1, 255, 256, 257, 900, 0, 63},
              .seed = static_cast<uint64_t>(seed++)});
    run_case({.dtype = DType::kFP16, .s_q = 3, .h_q = 64, .page_size = page,
              .seqlens = {333, 70}, .causal = true, .seed = static_cast<uint64_t>(seed++)});
  }
}

// Block ids outside the cache (a corrupted block table): the GPU reads zeros for those pages (the
// TMA map's bounds) and nothing outside the cache (compute-sanitizer, a Small test). The other
// requests' results stay right. (The CPU backend refuses such a table while validating; the GPU
// cannot read it before the launch.)
TEST(DenseDecodeSmall, BlockIdsOutsideTheCache) {
  const DecodeCase c{.h_q = 16, .page_size = 16, .seqlens = {100, 70, 40}};
  LauncherCase lc(c, 390, workspace_bytes(c, 3));
  HostProblem& p = lc.p;
  run_reference(&p, false);
  // Request 1's pages: past the end, negative, the largest id, and one past the last block.
  const int32_t num_blocks = static_cast<int32_t>(p.k_cache.size(0));
  const int32_t ids[] = {num_blocks, -3, std::numeric_limits<int32_t>::max(), num_blocks + 1000};
  for (int j = 0; j < 4; ++j) p.block_table.set({1, j}, ids[j]);  // (the reference is taken)
  const DeviceTensor table = to_device(p.block_table);
  lc.args.block_table = table.view;
  HostTensor out = make_out(c, p.batch), lse = make_lse(c, p.batch);
  ASSERT_NO_FATAL_FAILURE(decode_to_host(lc.args, lc.out, &out, lc.lse, &lse));
  EXPECT_EQ(count_written_gaps(out), 0);
  EXPECT_EQ(count_written_gaps(lse), 0);
  // Requests 0 and 2 against the reference: [b, s_q, h_q, 512] and [b, h_q, s_q] row-major.
  const std::vector<double> got = out.values(), ref = p.out_ref.values();
  const std::vector<double> got_lse = lse.values(), ref_lse = p.lse_ref.values();
  const size_t per_out = static_cast<size_t>(c.s_q) * c.h_q * kDimV;
  const size_t per_lse = static_cast<size_t>(c.s_q) * c.h_q;
  for (size_t r : {size_t{0}, size_t{2}}) {
    auto slice = [](const std::vector<double>& v, size_t at, size_t n) {
      return std::vector<double>(v.begin() + at * n, v.begin() + (at + 1) * n);
    };
    EXPECT_LT(relative_l2_error(slice(got, r, per_out), slice(ref, r, per_out)), 1e-2)
        << "request " << r;
    EXPECT_LT(max_lse_error(slice(got_lse, r, per_lse), slice(ref_lse, r, per_lse)), 1e-3)
        << "request " << r;
  }
}

// --- heads: h_q 1..128 with h_kv 1, and grouped kv heads --------------------------------------
TEST(DenseDecode, HeadCounts) {
  int seed = 40;
  for (int h_q : {1, 2, 3, 8, 16, 24, 32, 48, 64, 100, 128}) {
    run_case({.h_q = h_q, .seqlens = {400, 77}, .seed = static_cast<uint64_t>(seed++)});
  }
}

TEST(DenseDecode, GroupedKvHeads) {
  run_case({.h_q = 16, .h_kv = 2, .seqlens = {300, 65}, .seed = 60});
  run_case({.s_q = 2, .h_q = 128, .h_kv = 4, .seqlens = {200, 500}, .causal = true, .seed = 61});
  run_case({.dtype = DType::kFP16, .d_qk = 512, .h_q = 8, .h_kv = 8, .page_size = 32,
            .seqlens = {99, 0, 150}, .seed = 62});
}

// --- query tokens, causal and not ------------------------------------------------------------
TEST(DenseDecode, QueryTokensCausal) {
  int seed = 70;
  for (int s_q : {1, 2, 3, 4, 5, 8}) {
    for (bool causal : {false, true}) {
      // L < s_q gives lonely queries (out 0, lse +inf) when causal.
      run_case({.s_q = s_q, .h_q = 16, .seqlens = {s_q > 1 ? s_q - 1 : 0, 64 + s_q, 190},
                .causal = causal, .seed = static_cast<uint64_t>(seed++)});
    }
  }
  run_case({.s_q = 8, .h_q = 128, .seqlens = {260, 3}, .causal = true, .seed = 90});
  run_case({.s_q = 4, .h_q = 100, .seqlens = {129, 4}, .causal = true, .seed = 91});
}

// --- lengths: zeros, a batch padded with empty requests, a long sequence ------------------------
TEST(DenseDecode, PaddedBatchOfEmptyRequests) {
  run_case({.h_q = 32, .seqlens = {0, 0, 0, 0}, .seed = 100});
  run_case({.h_q = 64, .seqlens = {0, 500, 0, 0, 1, 64, 0, 0, 0, 0, 0, 0}, .seed = 101});
  run_case({.s_q = 2, .h_q = 16, .seqlens = {1000, 0, 0, 0, 0, 0, 0, 0}, .causal = true,
            .seed = 102});
}

TEST(DenseDecode, LongSequence) {
  run_case({.h_q = 16, .seqlens = {70001}, .seed = 110});
  // The longest the issue asks for: 256k keys less 5 (a last tile of 59), s_q 2 causal, one
  // request split over every worker.
  run_case({.s_q = 2, .h_q = 16, .seqlens = {262144 - 5}, .causal = true, .seed = 113});
  run_case({.s_q = 2, .h_q = 32, .page_size = 128, .seqlens = {66000, 12}, .causal = true,
            .seed = 111});
}

TEST(DenseDecode, ManyRequestsUnstrided) {
  Rng rng(120);
  std::vector<int> lens(160);
  for (int& l : lens) l = static_cast<int>(rng.randint(0, 700));
  run_case({.h_q = 16, .seqlens = lens, .strided = false, .seed = 121});
}

// Few workers: every CTA walks several requests, requests split across workers and combined.
TEST(DenseDecode, ExplicitScheduleFewWorkers) {
  int seed = 130;
  for (int parts : {1, 2, 5, 17}) {
    run_case({.h_q = 16, .seqlens = {0, 900, 33, 0, 1200, 64, 5}, .num_sm_parts = parts,
              .seed = static_cast<uint64_t>(seed++)});
    run_case({.s_q = 2, .h_q = 128, .page_size = 32, .seqlens = {0, 300, 129, 700},
              .causal = true, .num_sm_parts = parts, .seed = static_cast<uint64_t>(seed++)});
  }
}

// The combine's shapes of work (combine.cu): 8 slots of a 16-row group a warp (few splits a
// request) or over 2-4 warps, 1 slot over 8 warps (one long request), the batch sizes picking
// them from the device's worker count; with grouped kv heads, partial m-blocks, 4-byte out.
TEST(DenseDecode, CombineWarpsPerRowPair) {
  uint64_t seed = 150;
  Rng rng(149);
  for (int batch : {1, 3, 10, 24}) {
    std::vector<int> lens(batch);
    for (int& l : lens) l = static_cast<int>(rng.randint(300, 2500));
    run_case({.h_q = 16, .seqlens = lens, .seed = seed++});
    run_case({.s_q = 2, .h_q = 40, .h_kv = 2, .seqlens = lens, .causal = true, .seed = seed++});
    run_case({.dtype = DType::kFP16, .h_q = 24, .seqlens = lens, .seed = seed++, .out_gap = 2});
  }
  run_case({.h_q = 128, .seqlens = {1500, 700, 2200, 900, 1300, 64, 1800, 1000, 2500, 10},
            .seed = seed++});
}

// One process, two GPUs: a kernel's opt-in to > 48 KB of shared memory holds for one device
// only (cuda/common/smem_opt_in.h). Before session 14 it was made once per process, and every
// decode on the second device failed. Splits over 10 requests: the decode kernel (~221 KB), the
// planner and the combine (four warps a unit, ~36 KB of shared memory) on each device, then
// device 0 again.
TEST(DenseDecodeMultiGpu, SecondDeviceInTheSameProcess) {
  int count = 0;
  check_cuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (count < 2) GTEST_SKIP() << "needs 2 GPUs (nvidia-h200-x2); this machine has " << count;
  Rng rng(179);
  std::vector<int> lens(10);
  for (int& l : lens) l = static_cast<int>(rng.randint(300, 2500));
  uint64_t seed = 180;
  for (int device : {0, 1, 0, 1}) {
    run_case({.h_q = 16, .seqlens = lens, .seed = seed++, .device = device});
    run_case({.h_q = 64, .seqlens = lens, .num_sm_parts = 200, .seed = seed++, .device = device});
  }
}

// --- the GPU planner, bit for bit ---------------------------------------------------------------
TEST(DenseDecodeSchedule, GpuPlannerMatchesHost) {
  Rng rng(140);
  // Equal lengths at or above the worker count take the whole-request plan; the rest split.
  std::vector<std::vector<int>> sets = {{0}, {5}, {131072}, {0, 0, 0}, {64, 64, 64, 64},
                                        std::vector<int>(128, 4096), std::vector<int>(128, 1024),
                                        std::vector<int>(128, 32768), std::vector<int>(200, 8191)};
  for (int n : {7, 128, 300, 1500}) {
    std::vector<int> lens(n);
    for (int& l : lens) l = static_cast<int>(rng.randint(0, rng.coin(0.1) ? 100000 : 5000));
    sets.push_back(lens);
  }
  // Lines of cost units past 2^31 (block_tokens 1): the GPU deal's 64-bit walk.
  sets.push_back({2147483000, 5, 2147483000, 77777});
  for (const auto& lens : sets) {
    for (int parts : {1, 3, 66, 132, 200, cuda::kMaxPlannerSmParts}) {
      for (int block_tokens : {64, 16, 1}) {
        const int batch = static_cast<int>(lens.size());
        std::vector<int32_t> host_meta(parts * kScheduleMetadataInts), host_splits(batch + 1);
        core::plan_decode_schedule_host(lens.data(), batch, parts, block_tokens,
                                        core::kScheduleSplitOverheadBlocks,
                                        core::kScheduleCombineBlocks, host_meta.data(),
                                        host_splits.data());
        DeviceBuffer seq = to_device(std::vector<int32_t>(lens.begin(), lens.end()));
        DeviceSchedule s;
        {
          DecodeScheduleArgs a;
          s.metadata = DeviceBuffer(sizeof(int32_t) * parts * kScheduleMetadataInts);
          s.num_splits = DeviceBuffer(sizeof(int32_t) * (batch + 1));
          s.metadata.poison();
          s.num_splits.poison();
          a.seqlens = TensorView::contiguous(seq.data(), DType::kInt32, {batch}, Device::cuda(0));
          a.metadata = TensorView::contiguous(s.metadata.data(), DType::kInt32,
                                              {parts, kScheduleMetadataInts}, Device::cuda(0));
          a.num_splits = TensorView::contiguous(s.num_splits.data(), DType::kInt32, {batch + 1},
                                                Device::cuda(0));
          a.block_tokens = block_tokens;
          const Status st = plan_decode_schedule(a);
          ASSERT_TRUE(st.ok()) << st.message();
        }
        synchronize();
        EXPECT_EQ(to_host<int32_t>(s.metadata, host_meta.size()), host_meta)
            << "batch " << batch << " parts " << parts << " block_tokens " << block_tokens;
        EXPECT_EQ(to_host<int32_t>(s.num_splits, host_splits.size()), host_splits)
            << "batch " << batch << " parts " << parts << " block_tokens " << block_tokens;
      }
    }
  }
}

// --- CUDA graph: schedule + decode for two layers, captured once, replayed ---------------------
TEST(DenseDecodeGraph, ScheduleAndTwoLayersReplayed) {
  const DecodeCase c{.s_q = 2, .h_q = 64, .page_size = 64,
                     .seqlens = {0, 1500, 77, 4000, 1, 640}, .causal = true, .seed = 150};
  Rng rng(c.seed);
  HostProblem layer[2] = {make_problem(c, rng), make_problem(c, rng)};
  // Layer 1 reads the same lengths with its own cache and block table (make_problem drew both).
  const int64_t b = layer[0].batch;
  DeviceTensor seqlens = to_device(layer[0].seqlens);
  DeviceTensor q[2] = {to_device(layer[0].q), to_device(layer[1].q)};
  DeviceTensor k[2] = {to_device(layer[0].k_cache), to_device(layer[1].k_cache)};
  DeviceTensor table[2] = {to_device(layer[0].block_table), to_device(layer[1].block_table)};
  HostTensor out[2] = {make_out(c, b), make_out(c, b)}, lse[2] = {make_lse(c, b), make_lse(c, b)};
  DeviceTensor out_d[2] = {poisoned_like(out[0]), poisoned_like(out[1])};
  DeviceTensor lse_d[2] = {poisoned_like(lse[0]), poisoned_like(lse[1])};
  int parts = 0;
  ASSERT_TRUE(decode_num_sm_parts(Device::cuda(0), c.s_q, c.h_q, c.h_kv, &parts).ok());
  DeviceBuffer workspace(dense_decode_workspace_size(Device::cuda(0), static_cast<int>(b), c.s_q,
                                                     c.h_q, c.h_kv, kDimV));
  workspace.poison();

  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  DeviceSchedule schedule;
  schedule.metadata = DeviceBuffer(sizeof(int32_t) * parts * kScheduleMetadataInts);
  schedule.num_splits = DeviceBuffer(sizeof(int32_t) * (b + 1));
  schedule.view.metadata = TensorView::contiguous(schedule.metadata.data(), DType::kInt32,
                                                  {parts, kScheduleMetadataInts}, Device::cuda(0));
  schedule.view.num_splits = TensorView::contiguous(schedule.num_splits.data(), DType::kInt32,
                                                    {b + 1}, Device::cuda(0));
  cudaGraph_t graph;
  check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
  {
    DecodeScheduleArgs sa;
    sa.seqlens = seqlens.view;
    sa.s_q = c.s_q, sa.h_q = c.h_q, sa.h_kv = c.h_kv;
    sa.metadata = schedule.view.metadata;
    sa.num_splits = schedule.view.num_splits;
    const Status st = plan_decode_schedule(sa, stream);
    EXPECT_TRUE(st.ok()) << st.message();
    for (int l = 0; l < 2; ++l) {
      DenseDecodeArgs a = args_of(q[l].view, k[l].view, table[l].view, seqlens.view, out_d[l].view,
                                  lse_d[l].view, c.causal);
      a.schedule = schedule.view;
      a.workspace = {workspace.data(), workspace.bytes()};
      const Status dst = dense_decode(a, stream);
      EXPECT_TRUE(dst.ok()) << dst.message();
    }
  }
  check_cuda(cudaStreamEndCapture(stream, &graph), "end capture");
  cudaGraphExec_t exec;
  check_cuda(cudaGraphInstantiate(&exec, graph, 0), "instantiate");

  for (int replay = 0; replay < 2; ++replay) {
    if (replay == 1) {
      // New queries in the same buffers: the replay must compute with them.
      for (int l = 0; l < 2; ++l) {
        layer[l].q.fill_normal(rng);
        q[l].buffer.copy_from_host(layer[l].q.view().data, storage_bytes(layer[l].q));
        out_d[l].buffer.poison();
        lse_d[l].buffer.poison();
      }
    }
    for (int l = 0; l < 2; ++l) run_reference(&layer[l], c.causal);
    check_cuda(cudaGraphLaunch(exec, stream), "graph launch");
    check_cuda(cudaStreamSynchronize(stream), "sync");
    for (int l = 0; l < 2; ++l) {
      copy_to_host(out_d[l], &out[l]);
      copy_to_host(lse_d[l], &lse[l]);
      expect_close(compare(layer[l], out[l], lse[l]),
                   "replay " + std::to_string(replay) + " layer " + std::to_string(l));
    }
  }
  check_cuda(cudaGraphExecDestroy(exec), "exec destroy");
  check_cuda(cudaGraphDestroy(graph), "graph destroy");
  check_cuda(cudaStreamDestroy(stream), "stream destroy");
}

// --- what the launcher refuses ------------------------------------------------------------------
// The launcher's answer names the argument at fault.
void expect_refused(const DenseDecodeArgs& a, StatusCode code, const std::string& argument) {
  const Status st = dense_decode(a);
  EXPECT_EQ(st.code(), code) << st.message();
  EXPECT_NE(st.message().find(argument), std::string::npos) << st.message();
}

TEST(DenseDecodeErrors, KCacheStrideNotMultipleOf16Bytes) {
  const DecodeCase c{.h_q = 16, .seqlens = {10}};
  LauncherCase lc(c, 160, workspace_bytes(c, 1));
  // A page stride of d_qk + 4 elements (8 bytes past a 16-byte multiple).
  HostTensor k(c.dtype, {lc.p.k_cache.size(0), 64, 1, 576}, {64 * 580, 580, 580, 1});
  DeviceTensor kd = to_device(k);
  lc.args.k_cache = kd.view;
  expect_refused(lc.args, StatusCode::kInvalidArgument, "k_cache");
}

// One CTA a schedule worker on the grid's z (at most 65535): a longer metadata is refused by
// name before anything is read.
TEST(DenseDecodeErrors, ScheduleOfMoreRowsThanTheGrid) {
  const DecodeCase c{.h_q = 16, .seqlens = {100, 3}};
  LauncherCase lc(c, 163, workspace_bytes(c, 2));
  DeviceBuffer splits(sizeof(int32_t) * 3), meta(64);
  // (The view claims more than its buffer holds: the launcher must refuse it unread.)
  lc.args.schedule.metadata = TensorView::contiguous(
      meta.data(), DType::kInt32, {65536, kScheduleMetadataInts}, Device::cuda(0));
  lc.args.schedule.num_splits =
      TensorView::contiguous(splits.data(), DType::kInt32, {3}, Device::cuda(0));
  expect_refused(lc.args, StatusCode::kInvalidArgument, "schedule.metadata");
}

TEST(DenseDecodeErrors, UnsupportedPageSizeIsNotImplemented) {
  const DecodeCase c{.h_q = 16, .page_size = 48, .seqlens = {100}};
  LauncherCase lc(c, 161, workspace_bytes(c, 1));
  expect_refused(lc.args, StatusCode::kNotImplemented, "page_size");
}

TEST(DenseDecodeErrors, ShortWorkspace) {
  const DecodeCase c{.h_q = 16, .seqlens = {100, 3}};
  LauncherCase lc(c, 162, 64);
  expect_refused(lc.args, StatusCode::kInvalidArgument, "workspace");
}

// Sizes no decode accepts get 0 bytes, not a wrapped-around size_t (dense_decode then names the
// bad argument); a real shape gets its partials' room.
TEST(DenseDecodeErrors, WorkspaceSizeOfImpossibleShapes) {
  const Device gpu = Device::cuda(0);
  EXPECT_EQ(dense_decode_workspace_size(gpu, -1, 1, 16, 1, kDimV), 0u);
  EXPECT_EQ(dense_decode_workspace_size(gpu, 4, 0, 16, 1, kDimV), 0u);
  EXPECT_EQ(dense_decode_workspace_size(gpu, 4, 1, 16, 3, kDimV), 0u);
  EXPECT_EQ(dense_decode_workspace_size(gpu, 4, 1, 0, 1, kDimV), 0u);
  EXPECT_GT(dense_decode_workspace_size(gpu, 4, 1, 16, 1, kDimV), size_t{4} * 16 * kDimV * 4);
}

}  // namespace
}  // namespace openmla::testing
