// Split-KV decode combine (combine.h): one block of 256 threads merges `rows_per_block` query
// rows of one request; its 8 warps take every 8th split, each lane 16 of the 512 dims (4 x 16 B
// coalesced loads a split), so a block keeps 8 splits x 2 KB in flight.
#include "cuda/common/combine.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

namespace openmla::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kDimV = 512;

__device__ __forceinline__ float block_reduce(float v, bool is_max, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, other) : v + other;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // `red` is free (the previous reduction's readers are done)
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = red[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) v = is_max ? fmaxf(v, red[w]) : v + red[w];
  return v;
}

template <typename Element>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

template <typename Element>
__global__ void __launch_bounds__(kThreads) decode_combine_kernel(const DecodeCombineParams p) {
  const int r = blockIdx.y;
  const int first = p.num_splits[r * p.num_splits_stride];
  const int n = p.num_splits[(r + 1) * p.num_splits_stride] - first;
  // One split: the decode kernel wrote this request itself. (num_splits comes from the planner,
  // which finished before the decode kernel, our primary, started.)
  if (n <= 1) return;
  asm volatile("griddepcontrol.wait;" ::: "memory");

  extern __shared__ float smem[];
  float* red = smem;                      // [kWarps]
  float* part = smem + kWarps;            // [kWarps][512] per-warp partial sums
  float* weight = part + kWarps * kDimV;  // [n]
  const int rows = p.s_q * p.h_q;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row_end = min(rows, (blockIdx.x + 1) * p.rows_per_block);
  for (int row = blockIdx.x * p.rows_per_block; row < row_end; ++row) {
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < n; i += kThreads) {
      const float v = p.lse_accum[static_cast<int64_t>(first + i) * rows + row];
      weight[i] = v;
      mx = fmaxf(mx, v);
    }
    mx = block_reduce(mx, true, red);
    float sum = 0.f;
    for (int i = threadIdx.x; i < n; i += kThreads) {
      const float e = mx == -INFINITY ? 0.f : __expf(weight[i] - mx);
      weight[i] = e;
      sum += e;
    }
    sum = block_reduce(sum, false, red);  // its barriers also publish weight[]

    float4 acc[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[q] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 2
    for (int i = warp; i < n; i += kWarps) {
      const float w = weight[i];
      if (w == 0.f) continue;  // a split that saw no key (its partial is 0)
      const float4* src = reinterpret_cast<const float4*>(
          p.o_accum + (static_cast<int64_t>(first + i) * rows + row) * kDimV);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float4 v = __ldg(src + lane + 32 * q);
        acc[q].x += w * v.x;
        acc[q].y += w * v.y;
        acc[q].z += w * v.z;
        acc[q].w += w * v.w;
      }
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      reinterpret_cast<float4*>(part + warp * kDimV)[lane + 32 * q] = acc[q];
    }
    __syncthreads();
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    const int d = threadIdx.x * 2;
    float o0 = 0.f, o1 = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      o0 += part[w * kDimV + d];
      o1 += part[w * kDimV + d + 1];
    }
    const int s = row / p.h_q, h = row % p.h_q;
    char* out = static_cast<char*>(p.out) +
                (r * p.out_stride_b + s * p.out_stride_s + h * p.out_stride_h + d) * 2;
    *reinterpret_cast<uint32_t*>(out) = pack2<Element>(o0 * inv, o1 * inv);
    if (threadIdx.x == 0) {
      p.lse[r * p.lse_stride_b + h * p.lse_stride_h + s * p.lse_stride_s] =
          mx == -INFINITY ? INFINITY : mx + logf(sum);
    }
    __syncthreads();  // part[] and weight[] are reused by the next row
  }
}

}  // namespace

cudaError_t launch_decode_combine(const DecodeCombineParams& params, DType out_dtype,
                                  cudaStream_t stream) {
  if (params.batch == 0 || params.s_q * params.h_q == 0) return cudaSuccess;
  const int rows = params.s_q * params.h_q;
  const size_t smem_bytes = sizeof(float) * (kWarps + kWarps * kDimV + params.max_splits);
  auto kernel = out_dtype == DType::kBF16 ? decode_combine_kernel<__nv_bfloat16>
                                          : decode_combine_kernel<__half>;
  if (smem_bytes > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_bytes));
    if (err != cudaSuccess) return err;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3((rows + params.rows_per_block - 1) / params.rows_per_block, params.batch);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, params);
}

}  // namespace openmla::cuda
