// Split-KV decode combine (combine.h). The decode kernel leaves a split's partial as its CTA held
// it (combine.h, "o_accum"): a block per (partial slot, kv head, m-block), float4 (32 wg + k) *
// 32 G + t (G 16-row groups) holding rows r, r + 8 (r = 16 (t / 32) + (t % 32) / 4) x dims
// 256 wg + 8 k + 2 (t % 4), + 1. A warp here merges one such row pair of one block: lane (kk = lane / 4, q = lane % 4)
// reads the float4s (wg, k = kk + 8 m) of thread t = 32 (r / 16) + 4 (r % 16) + q, so each load
// instruction is 8 runs of 64 contiguous bytes, and sums them over the splits with each row's
// weight; a 4 x 4 transpose in each quad then gives every lane 8 contiguous dims of one n-block,
// and a row's 256 dims of a warpgroup half leave as one 512 B store per warp.
// When requests have many splits, G warps (params.warps_per_row) share a unit: each takes every
// G-th split and the partial sums meet once in shared memory; the unit is then a warpgroup half
// of the row pair (G = 2, 4) or an eighth (G = 8), so more blocks share one long request.
// Every warp computes its rows' softmax weights itself (the lse of all splits, warp reductions),
// so with G = 1 a unit needs no barrier at all. (The decode kernel wrote row-major partials with
// 8-byte stores before session 10: ~12 µs of b 32 x 4096's 89. The first combine looped over a
// block's 16 rows one after another, 6 barriers and two dependent round trips each.)
#include "cuda/common/combine.h"

#include "core/schedule.h"
#include "cuda/common/quad_transpose.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

namespace openmla::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

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

// Row pairs (r, r + 8) of an m-block that hold a query row: 8 per 16-row group.
__host__ __device__ inline int row_pairs(int rows_kv) { return 8 * core::partial_row_groups(rows_kv); }

// kVec float4s a lane a split: 8 (a unit is a whole row pair), 4 (one warpgroup half of it: G 2,
// 4) or 1 (an eighth: G 8, one long request with few rows, so 8x the blocks share it).
template <typename Element, int kVec>
__global__ void __launch_bounds__(kThreads) decode_combine_kernel(const DecodeCombineParams p) {
  const int r = blockIdx.y;
  const int first = p.num_splits[r * p.num_splits_stride];
  const int n = p.num_splits[(r + 1) * p.num_splits_stride] - first;
  // One split: the decode kernel wrote this request itself. (num_splits comes from the planner,
  // which finished before the decode kernel, our primary, started.)
  if (n <= 1) return;
  asm volatile("griddepcontrol.wait;" ::: "memory");

  constexpr int kChunks = 8 / kVec;              // units a row pair is dealt over
  // G > 1 (kVec < 8): each warp's partial sums.
  __shared__ float4 part[kWarps][kVec < 8 ? kVec * 32 : 1];
  const int G = p.warps_per_row;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = warp % G;
  const int group = p.h_q / p.h_kv;
  const int rows_kv = p.s_q * group;             // query rows of a kv head
  const int m_blocks = (rows_kv + 63) / 64;
  const int pairs = row_pairs(rows_kv);
  int unit = blockIdx.x * (kWarps / G) + warp / G;
  const int chunk = unit % kChunks;
  unit /= kChunks;
  const int pair = unit % pairs;
  unit /= pairs;
  const int m_block = unit % m_blocks;
  const int kv_head = unit / m_blocks;           // h_kv or more: past the request's units
  const int grow0 = m_block * 64 + 16 * (pair / 8) + pair % 8, grow1 = grow0 + 8;
  const bool live = kv_head < p.h_kv && grow0 < rows_kv;
  const bool live1 = live && grow1 < rows_kv;
  const int rows = p.s_q * p.h_q;
  const int s0 = grow0 / group, h0 = kv_head * group + grow0 % group;
  const int s1 = grow1 / group, h1 = kv_head * group + grow1 % group;
  const int kk = lane / 4, q = lane % 4;

  float4 acc[kVec];
#pragma unroll
  for (int v = 0; v < kVec; ++v) acc[v] = make_float4(0.f, 0.f, 0.f, 0.f);
  float mx0 = -INFINITY, mx1 = -INFINITY, sum0 = 0.f, sum1 = 0.f;
  if (live) {
    // Row 1's lse reads row 0's where row 1 is past the request (its result is never stored).
    const float* lse0 = p.lse_accum + static_cast<int64_t>(first) * rows + s0 * p.h_q + h0;
    const float* lse1 = live1 ? p.lse_accum + static_cast<int64_t>(first) * rows + s1 * p.h_q + h1
                              : lse0;
    for (int i = lane; i < n; i += 32) {
      mx0 = fmaxf(mx0, lse0[static_cast<int64_t>(i) * rows]);
      mx1 = fmaxf(mx1, lse1[static_cast<int64_t>(i) * rows]);
    }
    mx0 = warp_max(mx0);
    mx1 = warp_max(mx1);
    for (int i = lane; i < n; i += 32) {
      if (mx0 != -INFINITY) sum0 += __expf(lse0[static_cast<int64_t>(i) * rows] - mx0);
      if (mx1 != -INFINITY) sum1 += __expf(lse1[static_cast<int64_t>(i) * rows] - mx1);
    }
    sum0 = warp_sum(sum0);
    sum1 = warp_sum(sum1);
    // This lane's float4s of the first piece's block (slot core::partial_slot(first, first, r)),
    // then one block stride per piece.
    const int lanes = 32 * core::partial_row_groups(rows_kv);  // a block's float4s of a column slot
    const int64_t block_float4s = 64 * lanes;
    const int64_t block =
        (static_cast<int64_t>(core::partial_slot(first, first, r)) * p.h_kv + kv_head) * m_blocks +
        m_block;
    const float4* o = reinterpret_cast<const float4*>(p.o_accum) + block * block_float4s +
                      32 * (pair / 8) + 4 * (pair % 8) + q;
    const int64_t split_stride = static_cast<int64_t>(p.h_kv) * m_blocks * block_float4s;
    int off[kVec];
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      const int slot = chunk * kVec + v;         // (wg, m) = (slot / 4, slot % 4)
      off[v] = (32 * (slot / 4) + kk + 8 * (slot % 4)) * lanes;
    }
    // Loads unconditional (a split that saw no key, lse -inf, weighs 0 by a select after its
    // load), so the unrolled iterations' loads are all in flight at once.
    constexpr int kUnroll = kVec == 1 ? 16 : 2;  // 16 or 8 float4 loads in flight (4 x 4 spilled)
#pragma unroll kUnroll
    for (int i = g; i < n; i += G) {
      const float l0 = lse0[static_cast<int64_t>(i) * rows], l1 = lse1[static_cast<int64_t>(i) * rows];
      const float w0 = l0 == -INFINITY ? 0.f : __expf(l0 - mx0);
      const float w1 = l1 == -INFINITY ? 0.f : __expf(l1 - mx1);
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        float4 x = __ldg(o + i * split_stride + off[v]);
        if (l0 == -INFINITY) x.x = x.y = 0.f;
        if (l1 == -INFINITY) x.z = x.w = 0.f;
        acc[v].x += w0 * x.x;
        acc[v].y += w0 * x.y;
        acc[v].z += w1 * x.z;
        acc[v].w += w1 * x.w;
      }
    }
  }
  if constexpr (kVec < 8) {  // G > 1: the unit's G warps meet, its first sums them
#pragma unroll
    for (int v = 0; v < kVec; ++v) part[warp][v * 32 + lane] = acc[v];
    __syncthreads();
    if (g != 0) return;
    for (int j = 1; j < G; ++j) {
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        const float4 u = part[warp + j][v * 32 + lane];
        acc[v].x += u.x;
        acc[v].y += u.y;
        acc[v].z += u.z;
        acc[v].w += u.w;
      }
    }
  }
  if (!live) return;

  const float inv0 = sum0 > 0.f ? 1.f / sum0 : 0.f, inv1 = sum1 > 0.f ? 1.f / sum1 : 0.f;
  if (chunk == 0 && lane == 0) {
    p.lse[r * p.lse_stride_b + h0 * p.lse_stride_h + s0 * p.lse_stride_s] =
        mx0 == -INFINITY ? INFINITY : mx0 + logf(sum0);
    if (live1) {
      p.lse[r * p.lse_stride_b + h1 * p.lse_stride_h + s1 * p.lse_stride_s] =
          mx1 == -INFINITY ? INFINITY : mx1 + logf(sum1);
    }
  }
  char* out0 = static_cast<char*>(p.out) + (r * p.out_stride_b + s0 * p.out_stride_s +
                                           h0 * p.out_stride_h) * 2;
  char* out1 = static_cast<char*>(p.out) + (r * p.out_stride_b + s1 * p.out_stride_s +
                                           h1 * p.out_stride_h) * 2;
  if constexpr (kVec >= 4) {
    if (p.out_16B) {
      // Per warpgroup half: n-blocks kk + 8 m (m = 0..3) transposed in the quad, so lane q
      // holds all 8 dims of n-block kk + 8 q.
#pragma unroll
      for (int half = 0; half < kVec / 4; ++half) {
        uint32_t a0[4], a1[4];
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const float4 x = acc[4 * half + m];
          a0[m] = pack2<Element>(x.x * inv0, x.y * inv0);
          a1[m] = pack2<Element>(x.z * inv1, x.w * inv1);
        }
        const uint4 v0 = quad_transpose(a0, q), v1 = quad_transpose(a1, q);
        const int dim = 256 * ((chunk * kVec) / 4 + half) + 8 * (kk + 8 * q);
        *reinterpret_cast<uint4*>(out0 + dim * 2) = v0;
        if (live1) *reinterpret_cast<uint4*>(out1 + dim * 2) = v1;
      }
      return;
    }
  }
#pragma unroll
  for (int v = 0; v < kVec; ++v) {  // 4-byte stores (out's strides not multiples of 8)
    const int slot = chunk * kVec + v;
    const int dim = 256 * (slot / 4) + 8 * (kk + 8 * (slot % 4)) + 2 * q;
    *reinterpret_cast<uint32_t*>(out0 + dim * 2) = pack2<Element>(acc[v].x * inv0, acc[v].y * inv0);
    if (live1) {
      *reinterpret_cast<uint32_t*>(out1 + dim * 2) = pack2<Element>(acc[v].z * inv1, acc[v].w * inv1);
    }
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
  if (params.h_kv < 1 || params.h_q % params.h_kv != 0) return cudaErrorInvalidValue;
  // A row pair a warp (G 1), a warpgroup half of it over G warps (2, 4), an eighth (8).
  const int vec = G == 1 ? 8 : (G == 8 ? 1 : 4);
  const int rows_kv = params.s_q * (params.h_q / params.h_kv);
  const int64_t units = static_cast<int64_t>(params.h_kv) * ((rows_kv + 63) / 64) *
                        row_pairs(rows_kv) * (8 / vec);
  const int units_per_block = kWarps / G;
  const bool bf16 = out_dtype == DType::kBF16;
  auto kernel = vec == 8   ? (bf16 ? decode_combine_kernel<__nv_bfloat16, 8>
                                   : decode_combine_kernel<__half, 8>)
                : vec == 4 ? (bf16 ? decode_combine_kernel<__nv_bfloat16, 4>
                                   : decode_combine_kernel<__half, 4>)
                           : (bf16 ? decode_combine_kernel<__nv_bfloat16, 1>
                                   : decode_combine_kernel<__half, 1>);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>((units + units_per_block - 1) / units_per_block),
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
