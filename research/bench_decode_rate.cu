// How fast can a warp turn e4m3 codes into 16-bit MMA operands on this GPU? (GPU diagnostic for
// sparse_decode/NOTES.md "keys staged as fp16".) Times, in SM clocks, a 16-code chunk (4 words
// in, 8 words out, times a scale) decoded three ways, with 1, 2 and 8 warps a scheduler:
//   bf16      the kernels' fast decode today (e4m3_decode.cuh e4m3x16_to_bf16_fast: byte permutes,
//             shifts and masks into bf16 bits, one bf16x2 multiply by scale * 2^120 a pair)
//   fp16      cvt.rn.f16x2.e4m3x2 (F2FP on SM90) and one f16x2 multiply by the scale a pair
//   fp16 raw  the cvt alone (the scales applied elsewhere)
// Each warp runs 8 independent chunks an iteration (a producer thread's 8 chunks of a key), so
// one warp a scheduler shows what a producer warp sees; 8 warps a scheduler, the pipes' rate.
//   build-device/bench/openmla_bench_decode_rate (built with the benchmarks when CUDA is on)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstdio>

#include "cuda/sm90/sparse_decode/e4m3_decode.cuh"

namespace {

using openmla::cuda::sm90::sparse_decode_detail::e4m3x16_to_bf16_fast;

constexpr int kChunks = 8;     // independent chunks an iteration
constexpr int kIters = 4096;

__device__ __forceinline__ uint32_t mul_f16x2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ uint32_t cvt_e4m3x2(uint32_t w16) {
  uint32_t r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(static_cast<uint16_t>(w16)));
  return r;
}

template <int kMode>
__device__ __forceinline__ void decode(const uint32_t (&w)[4], uint32_t mul, uint32_t (&o)[8]) {
  if constexpr (kMode == 0) {  // bf16: the kernels' fast path itself
    e4m3x16_to_bf16_fast(w, mul, o);
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if constexpr (kMode == 1) {  // fp16: cvt, then the scale
        o[2 * k] = mul_f16x2(cvt_e4m3x2(w[k]), mul);
        o[2 * k + 1] = mul_f16x2(cvt_e4m3x2(w[k] >> 16), mul);
      } else {  // the cvt alone
        o[2 * k] = cvt_e4m3x2(w[k]);
        o[2 * k + 1] = cvt_e4m3x2(w[k] >> 16);
      }
    }
  }
}

template <int kMode>
__global__ void probe(uint32_t seed, uint32_t mul, uint32_t* sink, long long* clocks) {
  uint32_t w[kChunks][4];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
#pragma unroll
    for (int i = 0; i < 4; ++i) w[c][i] = (seed + threadIdx.x) * (2654435761u + 97u * (4 * c + i));
  }
  uint32_t acc = 0;
  __syncthreads();
  const long long t0 = clock64();
#pragma unroll 1
  for (int it = 0; it < kIters; ++it) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      uint32_t o[8];
      decode<kMode>(w[c], mul, o);
      // feed the outputs back (a dependence an iteration, as a producer's next key's chunk)
      w[c][0] ^= o[0] ^ o[4];
      w[c][1] ^= o[1] ^ o[5];
      w[c][2] ^= o[2] ^ o[6];
      w[c][3] ^= o[3] ^ o[7];
    }
  }
  const long long t1 = clock64();
#pragma unroll
  for (int c = 0; c < kChunks; ++c) acc ^= w[c][0] ^ w[c][1] ^ w[c][2] ^ w[c][3];
  sink[blockIdx.x * blockDim.x + threadIdx.x] = acc;
  if (threadIdx.x == 0) clocks[blockIdx.x] = t1 - t0;
}

template <int kMode>
double clocks_per_chunk(int warps_per_sm, int sms, uint32_t* sink, long long* clocks) {
  probe<kMode><<<sms, 32 * warps_per_sm>>>(1u, 0x3c003c00u, sink, clocks);
  cudaDeviceSynchronize();
  long long h[1024];
  cudaMemcpy(h, clocks, sizeof(long long) * sms, cudaMemcpyDeviceToHost);
  double mean = 0;
  for (int i = 0; i < sms; ++i) mean += static_cast<double>(h[i]) / sms;
  return mean / (static_cast<double>(kIters) * kChunks);  // clocks a chunk, per warp
}

}  // namespace

int main() {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::printf("no CUDA device\n");
    return 1;
  }
  const int sms = prop.multiProcessorCount;
  uint32_t* sink;
  long long* clocks;
  cudaMalloc(&sink, sizeof(uint32_t) * sms * 1024);
  cudaMalloc(&clocks, sizeof(long long) * sms);
  std::printf("%s: SM clocks a 16-code chunk per warp (8 independent chunks an iteration; the "
              "feedback XORs included); lower is faster\n\n", prop.name);
  std::printf("| warps a scheduler | bf16 (today) | fp16 (cvt + mul) | fp16 cvt alone |\n");
  std::printf("|---|---|---|---|\n");
  for (int per_scheduler : {1, 2, 8}) {
    const int warps = 4 * per_scheduler;
    clocks_per_chunk<0>(warps, sms, sink, clocks);  // warm-up
    const double bf = clocks_per_chunk<0>(warps, sms, sink, clocks);
    const double f16 = clocks_per_chunk<1>(warps, sms, sink, clocks);
    const double raw = clocks_per_chunk<2>(warps, sms, sink, clocks);
    std::printf("| %d | %.1f | %.1f (%.2fx) | %.1f (%.2fx) |\n", per_scheduler, bf, f16, bf / f16,
                raw, bf / raw);
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) std::printf("CUDA error: %s\n", cudaGetErrorString(err));
  return err == cudaSuccess ? 0 : 1;
}
