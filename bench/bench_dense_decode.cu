// Dense MLA decode on the GPU: the same-run ceilings (device-to-device copy bandwidth, bf16 GEMM
// rate through cuBLAS), then the grid of FlashMLA's published figures (b 128, s_q 1|2, h_q 16..128, seqlen 1k..32k),
// a varlen batch and b = 1 at 128k, printed as markdown rows for bench/RESULTS.md.
//
// Timing as FlashMLA 9241ae3's reference figures were measured: GPU time of one schedule-less decode (the schedule is
// planned once outside the timed region; timed = decode kernel + combine) between CUDA events,
// L2 flushed by an 8 GiB memset before each of 15 runs (the reference's flush; it also lets a
// power-capped GPU recover between runs, as it did for FlashMLA's figures), median; and the
// median of 15 back-to-back runs without the flush. OPENMLA_BENCH_FLUSH_MB sets the flush size;
// OPENMLA_BENCH_FLUSH_CLEAN=1 follows the memset by a 512 MB read, so the timed run starts with no
// dirty lines in the L2 (a diagnostic: what the memset's dirty lines cost; l2_state.cuh).
// bf16, d_qk 576, d_v 512, page 64 (OPENMLA_BENCH_KNOBS page=N for another), non-causal.
// TFLOP/s = 2 * s_q * h_q * (keys) * (576 + 512); GB/s = keys * 1152 bytes (KV read once).
// Last column: the SM clock NVML reports during the flushed runs, and how often the power cap
// held it down (compute-heavy shapes can be capped; compare timings at like clocks).
#include <cuda_runtime.h>
#ifdef OPENMLA_BENCH_HAVE_CUBLAS
#include <cublas_v2.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda/sm90/dense_decode/launch.h"
#include "cuda/sm90/dense_decode/tuning.h"
#include "gpu_clock_sampler.h"
#include "l2_state.cuh"
#include "openmla/ops.h"

namespace {

using namespace openmla;

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "CUDA error in %s: %s\n", what, cudaGetErrorString(err));
    std::exit(1);
  }
}
void check(const Status& st, const char* what) {
  if (!st.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, st.message().c_str());
    std::exit(1);
  }
}

// Uniform values in [-1, 1) as bf16 bits, from a hash of the index (never zeros).
__global__ void fill_random_bf16(uint16_t* data, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint64_t z = i * 0x9E3779B97F4A7C15ull + seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f) * 2.f - 1.f;
    data[i] = static_cast<uint16_t>(__float_as_uint(u) >> 16);
  }
}

void fill(void* p, size_t elements, uint64_t seed) {
  fill_random_bf16<<<1024, 256>>>(static_cast<uint16_t*>(p), elements, seed);
  check(cudaGetLastError(), "fill");
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Timer {
  cudaEvent_t start, stop;
  Timer() {
    check(cudaEventCreate(&start), "event");
    check(cudaEventCreate(&stop), "event");
  }
  ~Timer() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  // Milliseconds of f() on the default stream.
  template <typename F>
  double time(F&& f) {
    check(cudaEventRecord(start), "record");
    f();
    check(cudaEventRecord(stop), "record");
    check(cudaEventSynchronize(stop), "sync");
    float ms = 0.f;
    check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    return ms;
  }
};

// An 8 GiB memset (OPENMLA_BENCH_FLUSH_MB), and with OPENMLA_BENCH_FLUSH_CLEAN a read after it.
bench::L2Flush g_l2_flush{nullptr, size_t{8} << 30};
void flush_l2() {
  g_l2_flush.run();
  check(cudaGetLastError(), "flush");
}
// SM clock and power-cap state during each shape's flushed runs (the last column).
bench::GpuClockSampler g_clock;
bench::GpuClockSampler::Summary g_last_clock;

// --- ceilings --------------------------------------------------------------------------------
double copy_bandwidth_gbs() {
  const size_t bytes = size_t{2} << 30;
  void *a, *b;
  check(cudaMalloc(&a, bytes), "malloc");
  check(cudaMalloc(&b, bytes), "malloc");
  check(cudaMemset(a, 1, bytes), "memset");
  Timer t;
  std::vector<double> ms;
  for (int i = 0; i < 13; ++i) {
    const double m = t.time([&] { check(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice), "copy"); });
    if (i >= 3) ms.push_back(m);
  }
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes / (median(ms) * 1e-3) / 1e9;  // bytes read + written
}

double gemm_tflops() {
#ifdef OPENMLA_BENCH_HAVE_CUBLAS
  const int n = 8192;
  void *a, *b, *c;
  const size_t elems = size_t{n} * n;
  check(cudaMalloc(&a, elems * 2), "malloc");
  check(cudaMalloc(&b, elems * 2), "malloc");
  check(cudaMalloc(&c, elems * 2), "malloc");
  fill(a, elems, 11);
  fill(b, elems, 12);
  cublasHandle_t handle;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) return 0.0;
  const float alpha = 1.f, beta = 0.f;
  Timer t;
  std::vector<double> ms;
  for (int i = 0; i < 13; ++i) {
    const double m = t.time([&] {
      cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a, CUDA_R_16BF, n, b,
                   CUDA_R_16BF, n, &beta, c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                   CUBLAS_GEMM_DEFAULT);
    });
    if (i >= 3) ms.push_back(m);
  }
  check(cudaGetLastError(), "gemm");
  cublasDestroy(handle);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return 2.0 * n * double(n) * n / (median(ms) * 1e-3) / 1e12;
#else
  return 0.0;
#endif
}

// --- FlashMLA 9241ae3 on an H200 (2026-12-02), µs, for the speedup column -------------------------
double flashmla_us(int s_q, int h_q, int seqlen) {
  struct Row { int s_q, h_q; double us[5]; };  // seqlen 1024, 2048, 4096, 8192, 32768
  static const Row rows[] = {
      {1, 16, {49.5, 87.3, 162.2, 307.6, 1129.4}},  {1, 32, {49.1, 87.9, 162.7, 307.7, 1136.8}},
      {2, 16, {49.4, 87.7, 162.0, 307.2, 1140.1}},  {1, 64, {50.5, 89.1, 165.0, 310.2, 1155.9}},
      {2, 64, {72.1, 125.1, 228.6, 448.2, 1688.7}}, {1, 128, {72.2, 124.4, 229.4, 448.0, 1688.9}},
      {2, 128, {131.6, 226.9, 428.0, 812.0, 3144.7}}};
  const int lens[] = {1024, 2048, 4096, 8192, 32768};
  for (const Row& r : rows) {
    if (r.s_q != s_q || r.h_q != h_q) continue;
    for (int i = 0; i < 5; ++i) {
      if (lens[i] == seqlen) return r.us[i];
    }
  }
  return 0.0;
}

// --- one decode shape ----------------------------------------------------------------------------
struct Shape {
  int batch, s_q, h_q;
  std::vector<int> seqlens;
  std::string label;  // seqlen column
  double anchor_us;   // FlashMLA's figure, 0 if none
};

double g_last_plan_us = 0;  // run_shape: the schedule planner's back-to-back median
// The cache's page size (keys a block): 64 unless OPENMLA_BENCH_KNOBS says page=8|16|32|128|...
// (the same bytes in blocks of page keys; engines ask for small pages, FlashMLA's is 64).
int g_page = 64;
// The launch settings of every decode below (tuning.h): the production defaults unless
// OPENMLA_BENCH_KNOBS or a sweep column changes them; launched through
// cuda::sm90::dense_decode_with_tuning, the diagnostic entry (the production one takes none).
cuda::sm90::DenseDecodeTuning g_tuning;
Status decode(const DenseDecodeArgs& a) { return cuda::sm90::dense_decode_with_tuning(a, g_tuning); }

struct Buffers {
  void* kv = nullptr;
  size_t kv_blocks = 0;
  // > 0: every request's table points into the first `resident_blocks` blocks, so the KV stays
  // in L2 (a diagnostic: separates the loads' cost from the compute's).
  int64_t resident_blocks = 0;
};

// Returns the flushed median in µs; prints a markdown row unless `quiet`.
double run_shape(const Shape& s, Buffers& buf, double copy_gbs, double gemm, std::mt19937& rng,
                 bool quiet = false) {
  const int b = s.batch, d = 576, dv = 512, page = g_page;
  std::vector<int> need(b);
  int64_t blocks = 0, max_need = 1, keys = 0;
  for (int i = 0; i < b; ++i) {
    need[i] = (s.seqlens[i] + page - 1) / page;
    blocks += need[i];
    max_need = std::max<int64_t>(max_need, need[i]);
    keys += s.seqlens[i];
  }
  // buf.kv_blocks counts 64-key blocks; this shape's blocks have `page` keys.
  const int64_t cache_blocks = static_cast<int64_t>(buf.kv_blocks) * 64 / page;
  if (blocks > cache_blocks) {
    std::fprintf(stderr, "kv buffer too small\n");
    std::exit(1);
  }
  // Physical blocks: a random permutation of the first `blocks` blocks of the cache.
  std::vector<int32_t> perm(blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> table(static_cast<size_t>(b) * max_need, 0);
  int64_t next = 0;
  for (int i = 0; i < b; ++i) {
    for (int j = 0; j < need[i]; ++j) {
      const int32_t block = perm[next++];
      table[static_cast<size_t>(i) * max_need + j] =
          buf.resident_blocks > 0
              ? static_cast<int32_t>(block % (buf.resident_blocks * 64 / page))
              : block;
    }
  }
  void *q, *out, *lse, *table_d, *seq_d, *meta_d, *splits_d, *ws;
  int parts = 0;
  check(decode_num_sm_parts(Device::cuda(0), s.s_q, s.h_q, 1, &parts), "num_sm_parts");
  const size_t ws_bytes = dense_decode_workspace_size(Device::cuda(0), b, s.s_q, s.h_q, 1, dv);
  check(cudaMalloc(&q, size_t{2} * b * s.s_q * s.h_q * d), "malloc");
  check(cudaMalloc(&out, size_t{2} * b * s.s_q * s.h_q * dv), "malloc");
  check(cudaMalloc(&lse, size_t{4} * b * s.s_q * s.h_q), "malloc");
  check(cudaMalloc(&table_d, table.size() * 4), "malloc");
  check(cudaMalloc(&seq_d, size_t{4} * b), "malloc");
  check(cudaMalloc(&meta_d, size_t{4} * parts * kScheduleMetadataInts), "malloc");
  check(cudaMalloc(&splits_d, size_t{4} * (b + 1)), "malloc");
  check(cudaMalloc(&ws, std::max<size_t>(ws_bytes, 16)), "malloc");
  fill(q, static_cast<size_t>(b) * s.s_q * s.h_q * d, rng());
  check(cudaMemcpy(table_d, table.data(), table.size() * 4, cudaMemcpyHostToDevice), "h2d");
  check(cudaMemcpy(seq_d, s.seqlens.data(), size_t{4} * b, cudaMemcpyHostToDevice), "h2d");

  const Device dev = Device::cuda(0);
  DecodeScheduleArgs sa;
  sa.seqlens = TensorView::contiguous(seq_d, DType::kInt32, {b}, dev);
  sa.s_q = s.s_q, sa.h_q = s.h_q, sa.h_kv = 1;
  sa.metadata = TensorView::contiguous(meta_d, DType::kInt32, {parts, kScheduleMetadataInts}, dev);
  sa.num_splits = TensorView::contiguous(splits_d, DType::kInt32, {b + 1}, dev);
  check(plan_decode_schedule(sa), "plan");
  {  // the planner's own time, back to back (once per decode step in a serving engine)
    Timer plan_timer;
    std::vector<double> plan_ms;
    for (int i = 0; i < 15; ++i) {
      plan_ms.push_back(plan_timer.time([&] { check(plan_decode_schedule(sa), "plan"); }));
    }
    g_last_plan_us = median(plan_ms) * 1e3;
  }

  DenseDecodeArgs a;
  a.q = TensorView::contiguous(q, DType::kBF16, {b, s.s_q, s.h_q, d}, dev);
  a.k_cache = TensorView::contiguous(buf.kv, DType::kBF16,
                                     {cache_blocks, page, 1, d}, dev);
  a.block_table = TensorView::contiguous(table_d, DType::kInt32, {b, max_need}, dev);
  a.cache_seqlens = sa.seqlens;
  a.out = TensorView::contiguous(out, DType::kBF16, {b, s.s_q, s.h_q, dv}, dev);
  a.lse = TensorView::contiguous(lse, DType::kFP32, {b, s.h_q, s.s_q}, dev);
  a.schedule.metadata = sa.metadata;
  a.schedule.num_splits = sa.num_splits;
  a.workspace = {ws, ws_bytes};

  Timer t;
  for (int i = 0; i < 3; ++i) check(decode(a), "dense_decode");
  check(cudaDeviceSynchronize(), "warm-up");
  std::vector<double> flushed, b2b;
  g_clock.start();
  for (int i = 0; i < 15; ++i) {
    flush_l2();
    flushed.push_back(t.time([&] { check(decode(a), "dense_decode"); }));
  }
  g_last_clock = g_clock.stop();
  for (int i = 0; i < 15; ++i) b2b.push_back(t.time([&] { check(decode(a), "dense_decode"); }));
  // The decode kernel alone (flushed; no combine, so split requests' outputs stay unwritten):
  // how much of the time the combine takes.
  std::vector<double> main_only;
  auto& tuning = g_tuning;
  const int skip_before = tuning.skip_combine;
  tuning.skip_combine = 1;
  for (int i = 0; i < 15; ++i) {
    flush_l2();
    main_only.push_back(t.time([&] { check(decode(a), "dense_decode"); }));
  }
  tuning.skip_combine = skip_before;
  check(cudaDeviceSynchronize(), "bench");
  const double us = median(flushed) * 1e3, us_b2b = median(b2b) * 1e3;
  const double us_main = median(main_only) * 1e3;
  const double tflops = 2.0 * s.s_q * s.h_q * double(keys) * (d + dv) / (us * 1e-6) / 1e12;
  const double gbs = double(keys) * 1152.0 / (us * 1e-6) / 1e9;
  char anchor[64] = "";
  if (s.anchor_us > 0) std::snprintf(anchor, sizeof(anchor), "%.1f · %.2f×", s.anchor_us, s.anchor_us / us);
  if (!quiet) {
    std::printf("| %d | %d | %d | %s | %.1f | %.1f | %.1f | %.0f | %.0f | %.1f%% | %.1f%% | %s | %s |\n",
                b, s.s_q, s.h_q, s.label.c_str(), us, us_b2b, us_main, tflops, gbs,
                100.0 * gbs / copy_gbs, gemm > 0 ? 100.0 * tflops / gemm : 0.0, anchor,
                g_last_clock.text().c_str());
    std::fflush(stdout);
  }
  for (void* p : {q, out, lse, table_d, seq_d, meta_d, splits_d, ws}) cudaFree(p);
  return us;
}

// The timeline of CTA 0 (trace.cuh Tracer): per pair, each role's stamps in clocks after WG0
// began that pair; the first column is the pair's period (WG0 start to WG0 start).
void print_trace(const long long* trace_d, int pairs) {
  std::vector<long long> tr(static_cast<size_t>(3) * pairs * 16);
  check(cudaMemcpy(tr.data(), trace_d, tr.size() * sizeof(long long), cudaMemcpyDeviceToHost),
        "d2h trace");
  auto at = [&](int role, int pair, int ev) {
    return tr[(static_cast<size_t>(role) * pairs + pair) * 16 + ev];
  };
  std::printf("\ntimeline of CTA 0, clocks after WG0's pair start (0 = not reached)\n"
              "WG0: 1 P(2k-1) in + its PV_L issued, 2 S(2k) done, 3 P(2k) out, 4 PV(2k)_L done\n"
              "WG1: 0 start (S(2k+1) issued next), 1 P(2k) in + its PV_R issued, 2 S(2k+1) done, "
              "3 P(2k+1) out, 4 PV(2k+1)_R done\nproducers: 0 stage 0's pair start, 1-3 stage 0 parts issued "
              "(RoPE, L, R), 4-6 stage 1 parts issued (RoPE, R, L), 7-9 / 10-12 the same parts "
              "free (empty barrier passed; d 512: 7-8 / 9-10 free, 3-4 stage 1 issued)\n");
  for (int q = 0; q < pairs; ++q) {
    const long long base = at(0, q, 0);
    if (base == 0) break;
    const long long period = q + 1 < pairs && at(0, q + 1, 0) != 0 ? at(0, q + 1, 0) - base : 0;
    std::printf("pair %2d period %6lld | WG0", q, period);
    for (int e = 1; e <= 4; ++e) std::printf(" %6lld", at(0, q, e) ? at(0, q, e) - base : 0);
    std::printf(" | WG1");
    for (int e = 0; e <= 4; ++e) std::printf(" %6lld", at(1, q, e) ? at(1, q, e) - base : 0);
    std::printf(" | prod");
    for (int e = 0; e <= 12; ++e) std::printf(" %6lld", at(2, q, e) ? at(2, q, e) - base : 0);
    std::printf("\n");
  }
}

// Per-CTA spans of the last run (trace builds): how long each CTA ran against the whole kernel,
// so the steady-state pair period of CTA 0's timeline can be related to the measured time.
void print_spans(const long long* trace_d, int pairs) {
  using cuda::sm90::kTraceMaxCtas;
  std::vector<long long> sp(static_cast<size_t>(6) * kTraceMaxCtas);
  check(cudaMemcpy(sp.data(), trace_d + static_cast<size_t>(3) * pairs * 16,
                   sp.size() * sizeof(long long), cudaMemcpyDeviceToHost),
        "d2h spans");
  struct Cta { int id; long long start, end, clock_start, clock_end, sm, pairs; };
  std::vector<Cta> ctas;
  for (int c = 0; c < kTraceMaxCtas; ++c) {
    const long long* v = &sp[6 * static_cast<size_t>(c)];
    if (v[1] != 0) ctas.push_back({c, v[0], v[1], v[2], v[3], v[4], v[5]});
  }
  if (ctas.empty()) return;
  long long first = ctas[0].start, last = ctas[0].end, last_start = ctas[0].start;
  std::vector<double> us, us_per_pair, mhz;
  for (const Cta& c : ctas) {
    first = std::min(first, c.start);
    last = std::max(last, c.end);
    last_start = std::max(last_start, c.start);
    us.push_back((c.end - c.start) * 1e-3);
    if (c.pairs > 0) us_per_pair.push_back((c.end - c.start) * 1e-3 / c.pairs);
    if (c.end > c.start) mhz.push_back(1e3 * (c.clock_end - c.clock_start) / (c.end - c.start));
  }
  std::vector<double> sorted = us;
  std::sort(sorted.begin(), sorted.end());
  std::sort(us_per_pair.begin(), us_per_pair.end());
  std::sort(mhz.begin(), mhz.end());
  std::printf("\nCTA spans of the last run (globaltimer): %zu CTAs, first start to last end %.1f µs, "
              "starts spread over %.1f µs\nCTA µs: min %.1f, median %.1f, max %.1f; µs per pair: "
              "min %.3f, median %.3f, max %.3f\nSM clock over each CTA's run (clock64 / globaltimer): "
              "min %.0f, median %.0f, max %.0f MHz\nslowest CTAs (id, SM, pairs, µs):",
              ctas.size(), (last - first) * 1e-3, (last_start - first) * 1e-3, sorted.front(),
              sorted[sorted.size() / 2], sorted.back(), us_per_pair.empty() ? 0.0 : us_per_pair.front(),
              us_per_pair.empty() ? 0.0 : us_per_pair[us_per_pair.size() / 2],
              us_per_pair.empty() ? 0.0 : us_per_pair.back(), mhz.empty() ? 0.0 : mhz.front(),
              mhz.empty() ? 0.0 : mhz[mhz.size() / 2], mhz.empty() ? 0.0 : mhz.back());
  std::sort(ctas.begin(), ctas.end(),
            [](const Cta& a, const Cta& b) { return a.end - a.start > b.end - b.start; });
  for (size_t i = 0; i < std::min<size_t>(5, ctas.size()); ++i) {
    std::printf(" (%d, %lld, %lld, %.1f)", ctas[i].id, ctas[i].sm, ctas[i].pairs,
                (ctas[i].end - ctas[i].start) * 1e-3);
  }
  std::printf("\n");
}

// CTA 0's request boundaries (trace.cuh Tracer::mark_request), clocks after its kernel entry.
void print_requests(const long long* trace_d, int pairs) {
  using cuda::sm90::kTraceRequests;
  using cuda::sm90::kTraceRequestEvents;
  std::vector<long long> rq(static_cast<size_t>(3) * kTraceRequests * kTraceRequestEvents);
  check(cudaMemcpy(rq.data(),
                   trace_d + static_cast<size_t>(3) * pairs * 16 + 6 * cuda::sm90::kTraceMaxCtas,
                   rq.size() * sizeof(long long), cudaMemcpyDeviceToHost),
        "d2h requests");
  auto at = [&](int role, int req, int ev) {
    return rq[(static_cast<size_t>(role) * kTraceRequests + req) * kTraceRequestEvents + ev];
  };
  const long long entry = at(2, 0, 6);
  if (entry == 0) return;
  std::printf("\nrequests of CTA 0, clocks after its kernel entry (setup done at %lld)\n"
              "WG0/WG1: 4 pairs drained, 5 kBarEpilogue, 6 output stored; producers: 0/1 stage 0 "
              "request top / first part issued, 2/3 stage 1, 4/5 stage 0/1's seqlen and first "
              "block id arrived (marks before a request's first wgmma made ptxas serialize every "
              "wgmma: none there)\n", at(2, 0, 7) - entry);
  for (int r = 0; r < kTraceRequests; ++r) {
    if (at(0, r, 4) == 0) break;
    std::printf("request %d | WG0", r);
    for (int e = 4; e <= 6; ++e) std::printf(" %7lld", at(0, r, e) ? at(0, r, e) - entry : -1);
    std::printf(" | WG1");
    for (int e = 4; e <= 6; ++e) std::printf(" %7lld", at(1, r, e) ? at(1, r, e) - entry : -1);
    std::printf(" | prod");
    for (int e = 0; e <= 5; ++e) std::printf(" %7lld", at(2, r, e) ? at(2, r, e) - entry : -1);
    std::printf("\n");
  }
}

}  // namespace

// OPENMLA_BENCH_KNOBS="name=value,...": kernel knobs (tuning.h DenseDecodeTuning) for the whole
// run, so one binary serves a same-run A/B of knob settings (research/ab_dense_decode.sh knobs).
bool apply_knobs() {
  const char* knobs = std::getenv("OPENMLA_BENCH_KNOBS");
  if (knobs == nullptr) return true;
  auto& tuning = g_tuning;
  std::string list(knobs);
  size_t at = 0;
  while (at < list.size()) {
    size_t end = list.find(',', at);
    if (end == std::string::npos) end = list.size();
    const std::string item = list.substr(at, end - at);
    at = end + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    const std::string name = item.substr(0, eq);
    const int value = eq == std::string::npos ? 0 : std::atoi(item.c_str() + eq + 1);
    if (name == "evict_first") tuning.evict_first = value;
    else if (name == "l2_promotion") tuning.l2_promotion = value;
    else if (name == "evict_normal_from") tuning.evict_normal_from = value;
    else if (name == "skip_combine") tuning.skip_combine = value;
    else if (name == "combine_pdl") tuning.combine_pdl = value;
    else if (name == "q_tma") tuning.q_tma = value;
    else if (name == "output_stores") tuning.output_stores = value;
    else if (name == "q_issuers") tuning.q_issuers = value;
    else if (name == "out_tma") tuning.out_tma = value;
    else if (name == "q_prefetch") tuning.q_prefetch = value;
    else if (name == "page" && value > 0 && (value % 64 == 0 || 64 % value == 0)) g_page = value;
    else if (name == "kv_policy" && value >= 0 && value < bench::kPolicyCount) {
      // bench/l2_state.cuh's codes: 0 the kernel's own rule, else that policy on every KV load
      uint64_t values[bench::kPolicyCount];
      check(bench::l2_policy_table(values), "kv_policy");
      tuning.kv_cache_hint = value == 0 ? 0 : values[value];
      std::printf("kv_policy %d: %s (0x%016llx)\n", value,
                  value == 0 ? "the kernel's rule" : bench::l2_policy_name(value),
                  static_cast<unsigned long long>(tuning.kv_cache_hint));
    }
    else {
      std::fprintf(stderr, "OPENMLA_BENCH_KNOBS: unknown knob '%s'\n", name.c_str());
      return false;
    }
  }
  return true;
}

int main() {
  if (!apply_knobs()) return 2;
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "properties");
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%d", std::gmtime(&now));
  std::printf("## dense decode, %s, %s (%d SMs)\n\n", date, prop.name, prop.multiProcessorCount);
  if (const char* mb = std::getenv("OPENMLA_BENCH_FLUSH_MB")) {
    g_l2_flush.memset_bytes = std::max<size_t>(1, std::strtoull(mb, nullptr, 10)) << 20;
  }
  check(cudaMalloc(&g_l2_flush.memset_buf, g_l2_flush.memset_bytes), "malloc flush");
  const char* clean = std::getenv("OPENMLA_BENCH_FLUSH_CLEAN");
  if (clean != nullptr && std::atoi(clean) != 0) {
    g_l2_flush.read_buf = g_l2_flush.memset_buf;
    g_l2_flush.read_bytes = std::min(g_l2_flush.memset_bytes, size_t{512} << 20) & ~size_t{15};
    check(cudaMalloc(&g_l2_flush.sink, 4), "malloc sink");
  }
  std::printf("L2 flush before each timed run: %zu MiB memset", g_l2_flush.memset_bytes >> 20);
  if (g_l2_flush.read_buf != nullptr) {
    std::printf(", then a %zu MiB read (no dirty lines left)", g_l2_flush.read_bytes >> 20);
  }
  std::printf("\n\n");

  // OPENMLA_BENCH_SHAPE=s_q,h_q,seqlen: that one b = 128 shape only (for a profiler run);
  // b,s_q,h_q,seqlen: that batch size.
  if (const char* only = std::getenv("OPENMLA_BENCH_SHAPE")) {
    int b = 128, s_q = 1, h_q = 64, len = 4096;
    if (std::sscanf(only, "%d,%d,%d,%d", &b, &s_q, &h_q, &len) != 4) {
      b = 128;
      if (std::sscanf(only, "%d,%d,%d", &s_q, &h_q, &len) != 3) return 2;
    }
    Buffers one;
    one.kv_blocks = static_cast<size_t>(b) * len / 64;
    check(cudaMalloc(&one.kv, one.kv_blocks * 64 * 576 * 2), "malloc kv");
    fill(one.kv, one.kv_blocks * 64 * 576, 7);
    // OPENMLA_BENCH_L2_RESIDENT=n: all requests read the first n blocks (n = 256: 18 MB, in L2).
    if (const char* resident = std::getenv("OPENMLA_BENCH_L2_RESIDENT")) {
      one.resident_blocks = std::atoll(resident);
    }
    std::mt19937 rng(5);
    std::printf("| b | s_q | h_q | seqlen | µs | µs b2b | µs main | TFLOP/s | GB/s | of copy | of GEMM | |\n");
    // OPENMLA_BENCH_TRACE=n: the timeline of CTA 0's first n pairs (a build with
    // -DOPENMLA_DENSE_DECODE_TRACE=ON; elsewhere the stamps stay 0).
    long long* trace_d = nullptr;
    int trace_pairs = 0;
    if (const char* tr = std::getenv("OPENMLA_BENCH_TRACE")) {
      trace_pairs = std::atoi(tr);
      const size_t bytes =
          sizeof(long long) * (3 * trace_pairs * 16 + 6 * cuda::sm90::kTraceMaxCtas +
                               3 * cuda::sm90::kTraceRequests * cuda::sm90::kTraceRequestEvents);
      check(cudaMalloc(&trace_d, bytes), "malloc trace");
      check(cudaMemset(trace_d, 0, bytes), "memset trace");
      g_tuning.trace = trace_d;
      g_tuning.trace_pairs = trace_pairs;
    }
    const Shape shape{b, s_q, h_q, std::vector<int>(b, len), std::to_string(len), 0.0};
    run_shape(shape, one, 4200.0, 780.0, rng);
    std::printf("schedule planner (GPU, back to back): %.1f µs\n", g_last_plan_us);
    if (trace_d != nullptr) {
      print_trace(trace_d, trace_pairs);
      print_spans(trace_d, trace_pairs);
      print_requests(trace_d, trace_pairs);
    }
    return 0;
  }

  const double copy_gbs = copy_bandwidth_gbs();
  const double gemm = gemm_tflops();
  std::printf("ceilings (same run): device-to-device copy %.0f GB/s (2 GiB, read + write, median); "
              "bf16 GEMM 8192^3 (cuBLAS) %.0f TFLOP/s (median)\n\n", copy_gbs, gemm);

  Buffers buf;
  buf.kv_blocks = size_t{128} * 32768 / 64;  // the largest grid point: 4.8 GB of bf16 KV
  check(cudaMalloc(&buf.kv, buf.kv_blocks * 64 * 576 * 2), "malloc kv");
  fill(buf.kv, buf.kv_blocks * 64 * 576, 7);
  check(cudaDeviceSynchronize(), "fill");

  // Knob sweep (tuning.h DenseDecodeTuning) on a few shapes, then the grid at the defaults.
  // OPENMLA_BENCH_NO_SWEEP=1: the grid alone.
  const bool sweep = std::getenv("OPENMLA_BENCH_NO_SWEEP") == nullptr;
  std::mt19937 sweep_rng(99);
  auto& tuning = g_tuning;
  const int sweep_shapes[][3] = {{1, 16, 8192}, {1, 64, 4096}, {1, 128, 4096}, {1, 16, 1024},
                                 {1, 128, 1024}, {2, 128, 8192}};
  // Columns: the defaults, then the KV loads' L2 hint flipped (evict-first is the default where
  // one m-block reads each tile of a request shorter than 2048 keys, normal elsewhere), then the
  // cache map's L2 promotion flipped (128 B is the default where one m-block reads each tile,
  // 256 B where several do).
  if (sweep) {
    std::printf("knob sweep, µs (b 128; same binary, one knob changed per column)\n");
    std::printf("| s_q | h_q | seqlen | defaults | L2 hint flipped | L2 promotion flipped | SM clock (defaults) |\n");
    std::printf("|---|---|---|---|---|---|---|\n");
    for (const auto& sh : sweep_shapes) {
      auto time = [&] {
        return run_shape({128, sh[0], sh[1], std::vector<int>(128, sh[2]), "", 0.0}, buf, copy_gbs,
                         gemm, sweep_rng, true);
      };
      std::printf("| %d | %d | %d | %.1f |", sh[0], sh[1], sh[2], time());
      const std::string clock_defaults = g_last_clock.text();
      const bool one_m_block = sh[0] * sh[1] <= 64;
      // The default hint is evict-first only for one m-block and requests shorter than
      // evict_normal_from keys: flip whichever applies here.
      const bool first_by_default = one_m_block && sh[2] < tuning.evict_normal_from;
      tuning.evict_first = first_by_default ? 0 : 1;
      std::printf(" %.1f (%s) |", time(), first_by_default ? "normal" : "evict-first");
      tuning.evict_first = -1;
      tuning.l2_promotion = one_m_block ? 256 : 128;
      std::printf(" %.1f (%d B) |", time(), tuning.l2_promotion);
      tuning.l2_promotion = -1;
      std::printf(" %s |\n", clock_defaults.c_str());
    }
    std::printf("\ngrid at the defaults\n\n");
  }
  std::printf("| b | s_q | h_q | seqlen | µs | µs b2b | µs main | TFLOP/s | GB/s | of copy | of GEMM | FlashMLA µs · speedup | SM clock (flushed runs) |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::mt19937 rng(1234);
  for (int s_q : {1, 2}) {
    for (int h_q : {16, 32, 64, 128}) {
      for (int len : {1024, 4096, 8192, 32768}) {
        Shape s{128, s_q, h_q, std::vector<int>(128, len), std::to_string(len),
                flashmla_us(s_q, h_q, len)};
        run_shape(s, buf, copy_gbs, gemm, rng);
      }
    }
  }
  // Varlen: lengths uniform in [1, 2 * mean - 1].
  for (int mean : {4096, 8192}) {
    for (int h_q : {16, 128}) {
      std::uniform_int_distribution<int> dist(1, 2 * mean - 1);
      std::vector<int> lens(128);
      for (int& l : lens) l = dist(rng);
      const double anchor = h_q == 128 ? (mean == 4096 ? 249.3 : 457.2) : 0.0;
      run_shape({128, 1, h_q, lens, "varlen mean " + std::to_string(mean), anchor}, buf, copy_gbs,
                gemm, rng);
    }
  }
  for (int h_q : {16, 128}) {
    run_shape({1, 1, h_q, {131072}, "131072", h_q == 16 ? 76.8 : 82.1}, buf, copy_gbs, gemm, rng);
  }
  cudaFree(buf.kv);
  cudaFree(g_l2_flush.memset_buf);
  cudaFree(g_l2_flush.sink);
  return 0;
}
