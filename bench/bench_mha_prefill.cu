// Dense MHA prefill forward on the GPU (src/cuda/sm90/mha_prefill): the two orders of the kernel's
// compute loop (plain and pipelined: NOTES.md, idea 1) side by side on issue 51's shapes, in
// TFLOP/s (2 · visible pairs · h · (d_qk + d_v) / time). 16k tokens a row (b = 16384 / s
// sequences of s tokens), bf16, random data; median of 10 timed calls after 2 warm-ups, CUDA
// events. The comparison with torch is bench/mha_prefill_vs_torch.py.
//
//   openmla_bench_mha_prefill [--quick]   (--quick: s 8192 only)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/validate_mha.h"
#include "cuda/sm90/mha_prefill/launch.h"
#include "openmla/openmla.h"

namespace {

using namespace openmla;

#define CHECK_CUDA(call)                                                                   \
  do {                                                                                     \
    cudaError_t err_ = (call);                                                             \
    if (err_ != cudaSuccess) {                                                             \
      std::fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(err_));                   \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

__global__ void fill_random(__nv_bfloat16* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    x[i] = __float2bfloat16((h & 0xffff) / 32768.f - 1.f);  // uniform in [-1, 1)
  }
}

struct Buffer {
  void* p = nullptr;
  explicit Buffer(size_t bytes) { CHECK_CUDA(cudaMalloc(&p, bytes)); }
  ~Buffer() { cudaFree(p); }
};

// Median µs of `calls` launches of one order.
float time_order(const MhaPrefillArgs& a, const core::MhaPrefillShape& shape, int pipelined) {
  cuda::sm90::MhaFwdTuning tuning;
  tuning.pipelined = pipelined;
  std::vector<float> us;
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < 12; ++i) {
    CHECK_CUDA(cudaEventRecord(start));
    const Status st = cuda::sm90::mha_prefill_forward(a, shape, nullptr, tuning);
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.message().c_str());
      std::exit(1);
    }
    CHECK_CUDA(cudaEventRecord(stop));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0.f;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    if (i >= 2) us.push_back(ms * 1e3f);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

void row(int64_t s, int64_t h, int64_t d_qk, bool causal) {
  const int64_t b = 16384 / s, total = b * s, d_v = 128;
  Buffer q(total * h * d_qk * 2), k(total * h * d_qk * 2), v(total * h * d_v * 2);
  Buffer out(total * h * d_v * 2), lse(total * h * 4), cu((b + 1) * 4);
  fill_random<<<1024, 256>>>(static_cast<__nv_bfloat16*>(q.p), total * h * d_qk, 1);
  fill_random<<<1024, 256>>>(static_cast<__nv_bfloat16*>(k.p), total * h * d_qk, 2);
  fill_random<<<1024, 256>>>(static_cast<__nv_bfloat16*>(v.p), total * h * d_v, 3);
  std::vector<int32_t> offsets(b + 1);
  for (int64_t i = 0; i <= b; ++i) offsets[i] = static_cast<int32_t>(i * s);
  CHECK_CUDA(cudaMemcpy(cu.p, offsets.data(), offsets.size() * 4, cudaMemcpyHostToDevice));
  const Device dev = Device::cuda(0);
  MhaPrefillArgs a;
  a.q = TensorView::contiguous(q.p, DType::kBF16, {total, h, d_qk}, dev);
  a.k = TensorView::contiguous(k.p, DType::kBF16, {total, h, d_qk}, dev);
  a.v = TensorView::contiguous(v.p, DType::kBF16, {total, h, d_v}, dev);
  a.cu_seqlens_q = a.cu_seqlens_kv = TensorView::contiguous(cu.p, DType::kInt32, {b + 1}, dev);
  a.max_seqlen_q = a.max_seqlen_kv = s;
  a.causal = causal;
  a.out = TensorView::contiguous(out.p, DType::kBF16, {total, h, d_v}, dev);
  a.lse = TensorView::contiguous(lse.p, DType::kFP32, {total, h}, dev);
  core::MhaPrefillShape shape;
  if (const Status st = core::validate_mha_prefill(a, &shape); !st.ok()) {
    std::fprintf(stderr, "%s\n", st.message().c_str());
    std::exit(1);
  }
  const double pairs = static_cast<double>(b) * (causal ? s * (s + 1) / 2.0 : double(s) * s);
  const double flops = 2.0 * pairs * h * (d_qk + d_v);
  const float plain = time_order(a, shape, 0), piped = time_order(a, shape, 1);
  std::printf("s %5lld b %2lld h %3lld d %lld/%lld %s  plain %8.1f us %6.1f TFLOP/s   "
              "pipelined %8.1f us %6.1f TFLOP/s   x%.3f\n",
              static_cast<long long>(s), static_cast<long long>(b), static_cast<long long>(h),
              static_cast<long long>(d_qk), static_cast<long long>(d_v),
              causal ? "causal" : "full  ", plain, flops / plain * 1e-6, piped,
              flops / piped * 1e-6, plain / piped);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("dense MHA prefill forward, %s: plain vs pipelined order (bf16, 16k tokens)\n",
              prop.name);
  const std::vector<int64_t> seqlens =
      quick ? std::vector<int64_t>{8192} : std::vector<int64_t>{1024, 4096, 8192, 16384};
  const int64_t shapes[4][2] = {{128, 192}, {128, 128}, {32, 128}, {16, 128}};
  for (const auto& hd : shapes) {
    for (bool causal : {false, true}) {
      for (int64_t s : seqlens) row(s, hd[0], hd[1], causal);
    }
  }
  return 0;
}
