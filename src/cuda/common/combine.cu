// Split-KV decode combine (combine.h). A block of 8 warps merges 8 / G query rows of one request,
// G warps a row (G = params.warps_per_row, 1 when requests have few splits): each warp takes
// every G-th split of its row, each lane 16 of the 512 dims (4 x 16 B coalesced loads a split).
// With 8 warps a row (one long request split over every worker: few rows, many splits) a block
// takes a quarter of the row's dims, each lane 4, so 4x the blocks share the work.
// Every warp computes its row's softmax weights itself (the lse of all splits, a warp reduction),
// so with G = 1 a row needs no barrier at all; with G > 1 the G partial sums meet once in shared
// memory. (The first version looped over a block's 16 rows one after another, 6 barriers and two
// dependent global round trips each, with 2 of 8 warps busy at 2 splits a row.)
#include "cuda/common/combine.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

namespace openmla::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kDimV = 512;

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

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Four dims (one float4 of a row) as Element into `out` (16-byte aligned up to the row stride's
// 4-byte alignment, so two 4-byte stores).
template <typename Element>
__device__ __forceinline__ void store4(char* out, float4 v, float inv) {
  uint32_t* dst = reinterpret_cast<uint32_t*>(out);
  dst[0] = pack2<Element>(v.x * inv, v.y * inv);
  dst[1] = pack2<Element>(v.z * inv, v.w * inv);
}

// kVec float4s a lane: 4 (a block covers whole rows) or 1 (a quarter of a row: blockIdx.x
// % 4 picks which).
template <typename Element, int kVec>
__global__ void __launch_bounds__(kThreads) decode_combine_kernel(const DecodeCombineParams p) {
  const int r = blockIdx.y;
  const int first = p.num_splits[r * p.num_splits_stride];
  const int n = p.num_splits[(r + 1) * p.num_splits_stride] - first;
  // One split: the decode kernel wrote this request itself. (num_splits comes from the planner,
  // which finished before the decode kernel, our primary, started.)
  if (n <= 1) return;
  asm volatile("griddepcontrol.wait;" ::: "memory");

  __shared__ float4 part[kWarps][32 * kVec];  // G > 1: each warp's partial sums
  constexpr int kChunks = 4 / kVec;             // blocks a row's dims are dealt over
  const int G = p.warps_per_row;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rows = p.s_q * p.h_q;
  const int chunk = blockIdx.x % kChunks;       // this block's float4s: chunk * 32 * kVec + ...
  const int row = (blockIdx.x / kChunks) * (kWarps / G) + warp / G;
  const int g = warp % G;
  const bool live = row < rows;

  float4 acc[kVec];
#pragma unroll
  for (int q = 0; q < kVec; ++q) acc[q] = make_float4(0.f, 0.f, 0.f, 0.f);
  float mx = -INFINITY, sum = 0.f;
  if (live) {
    const float* lse = p.lse_accum + static_cast<int64_t>(first) * rows + row;
    for (int i = lane; i < n; i += 32) mx = fmaxf(mx, lse[static_cast<int64_t>(i) * rows]);
    mx = warp_max(mx);
    if (mx != -INFINITY) {
      for (int i = lane; i < n; i += 32) sum += __expf(lse[static_cast<int64_t>(i) * rows] - mx);
    }
    sum = warp_sum(sum);
    const float4* o = reinterpret_cast<const float4*>(
                          p.o_accum + (static_cast<int64_t>(first) * rows + row) * kDimV) +
                      chunk * 32 * kVec;
    const int64_t split_stride = static_cast<int64_t>(rows) * (kDimV / 4);
    // Loads unconditional (a split that saw no key, lse -inf, weighs 0 by a select after its
    // load), so the unrolled iterations' loads are all in flight at once: with one long request
    // a warp walks ~17 splits, and a branch around each load made that a chain of round trips.
    constexpr int kUnroll = kVec == 1 ? 8 : 4;  // 8 x 4 float4s a lane spilled
#pragma unroll kUnroll
    for (int i = g; i < n; i += G) {
      const float l = lse[static_cast<int64_t>(i) * rows];
      const float w = l == -INFINITY ? 0.f : __expf(l - mx);
#pragma unroll
      for (int q = 0; q < kVec; ++q) {
        float4 v = __ldg(o + i * split_stride + lane + 32 * q);
        if (l == -INFINITY) v = make_float4(0.f, 0.f, 0.f, 0.f);
        acc[q].x += w * v.x;
        acc[q].y += w * v.y;
        acc[q].z += w * v.z;
        acc[q].w += w * v.w;
      }
    }
  }
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  const int s = row / p.h_q, h = row % p.h_q;
  char* out = static_cast<char*>(p.out) +
              (r * p.out_stride_b + s * p.out_stride_s + h * p.out_stride_h) * 2 +
              chunk * 32 * kVec * 8;
  if (live && g == 0 && lane == 0 && chunk == 0) {
    p.lse[r * p.lse_stride_b + h * p.lse_stride_h + s * p.lse_stride_s] =
        mx == -INFINITY ? INFINITY : mx + logf(sum);
  }
  if (G == 1) {
    if (live) {
#pragma unroll
      for (int q = 0; q < kVec; ++q) store4<Element>(out + (lane + 32 * q) * 8, acc[q], inv);
    }
    return;
  }
#pragma unroll
  for (int q = 0; q < kVec; ++q) part[warp][lane + 32 * q] = acc[q];
  __syncthreads();
  if (!live) return;
  // The row's G warps share its 32 * kVec float4s; each sums them over the G partials.
  const int first_warp = warp - g;
  for (int k = g * 32 + lane; k < 32 * kVec; k += 32 * G) {
    float4 v = part[first_warp][k];
    for (int j = 1; j < G; ++j) {
      const float4 u = part[first_warp + j][k];
      v.x += u.x;
      v.y += u.y;
      v.z += u.z;
      v.w += u.w;
    }
    store4<Element>(out + k * 8, v, inv);
  }
}

}  // namespace

int decode_combine_warps_per_row(int batch, int num_sm_parts) {
  // Splits a request typically has: its share of the workers, plus the one it shares with a
  // neighbour. Few: a warp a row (no barrier); many (one long request): up to the 8 warps.
  const int typical = (num_sm_parts + batch - 1) / (batch > 0 ? batch : 1) + 1;
  if (typical <= 4) return 1;
  if (typical <= 8) return 2;
  if (typical <= 16) return 4;
  return 8;
}

cudaError_t launch_decode_combine(const DecodeCombineParams& params, DType out_dtype,
                                  cudaStream_t stream) {
  if (params.batch == 0 || params.s_q * params.h_q == 0) return cudaSuccess;
  const int G = params.warps_per_row;
  if (G != 1 && G != 2 && G != 4 && G != 8) return cudaErrorInvalidValue;
  const int rows = params.s_q * params.h_q;
  const int rows_per_block = kWarps / G;
  const bool quarter_rows = G == kWarps;  // few rows with many splits: more, smaller blocks
  const bool bf16 = out_dtype == DType::kBF16;
  auto kernel = quarter_rows ? (bf16 ? decode_combine_kernel<__nv_bfloat16, 1>
                                     : decode_combine_kernel<__half, 1>)
                             : (bf16 ? decode_combine_kernel<__nv_bfloat16, 4>
                                     : decode_combine_kernel<__half, 4>);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3((rows + rows_per_block - 1) / rows_per_block * (quarter_rows ? 4 : 1),
                        params.batch);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, params);
}

}  // namespace openmla::cuda
