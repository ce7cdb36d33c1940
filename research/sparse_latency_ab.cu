// Low-concurrency sparse decode (sparse_decode/NOTES.md, "Latency plan"): how does the time of
// b 1 / 4 / 8, h_q 16, s_q 1, topk 2048 move with the split plan? Each shape is timed with the
// production plan and with every forced tiles-per-split (SparseTuning, the internal entry), the
// variants interleaved round by round on identical tensors, the L2 flushed before every call
// (instruction caches warm). Prints the µs medians (decode and combine, between CUDA events).
//
//   nvcc -std=c++20 -O2 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -Isrc \
//     -Iinclude -I.deps/cutlass-4.2.0/include -I/usr/local/cuda/include/cccl \
//     research/sparse_latency_ab.cu build-device/libopenmla.a build-device/libopenmla_cuda.a \
//     build-device/libopenmla.a -lcuda -Xcompiler -fopenmp -o /tmp/latency_ab && /tmp/latency_ab
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "cuda/sm90/sparse_decode/tuning.h"
#include "openmla/openmla.h"

using namespace openmla;

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}
void check(const Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.message().c_str());
    std::exit(1);
  }
}

template <typename T>
T* upload(const std::vector<T>& v) {
  T* d = nullptr;
  check(cudaMalloc(&d, v.size() * sizeof(T)), "cudaMalloc");
  check(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  return d;
}

// A cache of `blocks` pages of 64 tokens, every slot written by kv_cache_write from random rows.
KVCache make_cache(KVFormat format, int64_t blocks, std::mt19937& rng) {
  KVCache c;
  c.layout = default_kv_layout(format, 64, 576);
  c.num_blocks = blocks;
  c.device = Device::cuda(0);
  check(cudaMalloc(&c.data, static_cast<size_t>(c.layout.block_stride * blocks)), "cache");
  const int d = kv_format_info(format, 576).d_qk;
  const int64_t n = c.num_tokens();
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> rows(static_cast<size_t>(n * d));
  for (float& x : rows) x = normal(rng);
  std::vector<int32_t> slots(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) slots[i] = static_cast<int32_t>(i);
  float* d_rows = upload(rows);
  int32_t* d_slots = upload(slots);
  KVCacheWriteArgs w;
  w.kv = TensorView::contiguous(d_rows, DType::kFP32, {n, d}, Device::cuda(0));
  w.slot_mapping = TensorView::contiguous(d_slots, DType::kInt32, {n}, Device::cuda(0));
  w.cache = c;
  check(kv_cache_write(w), "kv_cache_write");
  check(cudaDeviceSynchronize(), "write");
  cudaFree(d_rows);
  cudaFree(d_slots);
  return c;
}

}  // namespace

int main() {
  constexpr int kH = 16, kTopk = 2048, kRounds = 40;
  constexpr int64_t kBlocks = 1024;  // 65536 slots: 43 MB of fp8_v32, past L2 after the flush
  const int forced[] = {0, 1, 2, 4, 8, 16, 32};  // 0: the production plan
  std::mt19937 rng(7);
  char* flush = nullptr;
  const size_t flush_bytes = size_t{256} << 20;
  check(cudaMalloc(&flush, flush_bytes), "flush");
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (KVFormat format : {KVFormat::kFP8_V32, KVFormat::kFP8_Model1}) {
    const KVCache cache = make_cache(format, kBlocks, rng);
    const int d = kv_format_info(format, 576).d_qk;
    std::printf("\n%s, h_q %d, s_q 1, topk %d (µs, median of %d, L2 flushed)\n",
                format == KVFormat::kFP8_V32 ? "fp8_v32" : "fp8_model1", kH, kTopk, kRounds);
    std::printf("| b | plan |");
    for (int f : forced) {
      if (f > 0) std::printf(" %d tiles |", f);
    }
    std::printf("\n");
    for (int b : {1, 4, 8}) {
      std::normal_distribution<float> normal(0.f, 1.f);
      std::vector<__nv_bfloat16> q(static_cast<size_t>(b) * kH * d);
      for (auto& x : q) x = __float2bfloat16(normal(rng));
      std::vector<int32_t> idx(static_cast<size_t>(b) * kTopk);
      std::vector<int32_t> all(static_cast<size_t>(cache.num_tokens()));
      for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int32_t>(i);
      for (int i = 0; i < b; ++i) {  // distinct slots a token
        std::shuffle(all.begin(), all.end(), rng);
        std::copy(all.begin(), all.begin() + kTopk, idx.begin() + static_cast<size_t>(i) * kTopk);
      }
      SparseDecodeArgs a;
      a.q = TensorView::contiguous(upload(q), DType::kBF16, {b, 1, kH, d}, Device::cuda(0));
      a.k_cache = cache;
      a.indices = TensorView::contiguous(upload(idx), DType::kInt32, {b, 1, kTopk},
                                         Device::cuda(0));
      a.softmax_scale = 0.0625f;
      void *out = nullptr, *lse = nullptr, *ws = nullptr;
      check(cudaMalloc(&out, static_cast<size_t>(b) * kH * 512 * 2), "out");
      check(cudaMalloc(&lse, static_cast<size_t>(b) * kH * 4), "lse");
      a.out = TensorView::contiguous(out, DType::kBF16, {b, 1, kH, 512}, Device::cuda(0));
      a.lse = TensorView::contiguous(lse, DType::kFP32, {b, kH, 1}, Device::cuda(0));
      const size_t ws_bytes = sparse_decode_workspace_size(Device::cuda(0), b, 1, kH, 512);
      check(cudaMalloc(&ws, ws_bytes + 1), "workspace");
      a.workspace = {ws, ws_bytes};
      std::vector<std::vector<float>> times(std::size(forced));
      for (int r = 0; r < kRounds + 3; ++r) {
        for (size_t v = 0; v < std::size(forced); ++v) {
          core::SparseTuning t;
          t.tiles_per_split = forced[v];
          check(cudaMemsetAsync(flush, r & 0xFF, flush_bytes), "flush");
          cudaEventRecord(e0);
          check(cuda::sm90::sparse_decode_with_tuning(a, t), "sparse_decode");
          cudaEventRecord(e1);
          check(cudaEventSynchronize(e1), "sync");
          float ms = 0.f;
          cudaEventElapsedTime(&ms, e0, e1);
          if (r >= 3) times[v].push_back(1000.f * ms);  // three warm-up rounds
        }
      }
      std::printf("| %d |", b);
      for (auto& t : times) {
        std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
        std::printf(" %.1f |", t[t.size() / 2]);
      }
      std::printf("\n");
      cudaFree(out);
      cudaFree(lse);
      cudaFree(ws);
      cudaFree(const_cast<void*>(a.q.data));
      cudaFree(const_cast<void*>(a.indices.data));
    }
    cudaFree(cache.data);
  }
  return 0;
}
