// The sparse decode combine: merges a query token's split partials (params.h: row-major fp32
// o_partial and lse_partial) into out and lse, applying the attention sink. One 128-thread block
// per (head, token), four output dims a thread, the splits' loads in flight together; launched
// with programmatic dependent launch, so it is resident before the decode grid ends and waits for
// it with griddepcontrol.wait.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "cuda/sm90/sparse_decode/fused_out.cuh"
#include "cuda/sm90/sparse_decode/launch.h"
#include "cuda/sm90/sparse_decode/params.h"

namespace openmla::cuda::sm90 {
namespace {

// The block's max (kMax) or sum of one value a thread.
template <bool kMax>
__device__ __forceinline__ float block_reduce(float v, float* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, other) : v + other;
  }
  __syncthreads();  // scratch is free (a previous reduction has been read)
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  v = scratch[0];
#pragma unroll
  for (int w = 1; w < 4; ++w) v = kMax ? fmaxf(v, scratch[w]) : v + scratch[w];
  return v;
}

// Every split's lse is read at once (a thread a split) and its weight kept in shared memory, so
// the weighted sum of O has kInFlight splits' loads in flight a step (walking the splits one at
// a time, each load a dependent round trip, measured slower: NOTES.md).
// kFused: the fused op's rows (its RoPE, e4m3 cast and scales) instead of bf16 out.
template <bool kFused>
__global__ void __launch_bounds__(128) sparse_decode_combine_kernel(
    const __grid_constant__ SparseDecodeParams p) {
  constexpr int kInFlight = 8;
  __shared__ float weight[kSparseMaxSplits];
  __shared__ float scratch[4];
  const int h = blockIdx.x, token = p.token0 + blockIdx.y;
  // The fused op's cos/sin: inputs, read while the decode grid still runs.
  sparse_decode_detail::FusedCombineRope rope = {};
  if constexpr (kFused) rope = sparse_decode_detail::fused_combine_rope(p, token);
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const int i = token / p.s_q, j = token - i * p.s_q;
  const int64_t row = static_cast<int64_t>(token) * p.h_q + h;
  const int64_t split_stride = static_cast<int64_t>(p.tokens) * p.h_q;
  const int n = p.num_splits;
  float mx = -INFINITY, max_logit = -INFINITY;
  for (int s = threadIdx.x; s < n; s += 128) {
    const float l = p.lse_partial[s * split_stride + row];
    weight[s] = l;
    mx = fmaxf(mx, l);
    if (p.max_logits != nullptr) {
      max_logit = fmaxf(max_logit, p.max_partial[s * split_stride + row]);
    }
  }
  mx = block_reduce<true>(mx, scratch);
  if (p.max_logits != nullptr) max_logit = block_reduce<true>(max_logit, scratch);
  float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
  float lse = INFINITY;  // no split saw a key: a lonely query
  if (mx != -INFINITY) {
    const float4* o_part = reinterpret_cast<const float4*>(p.o_partial + row * 512) + threadIdx.x;
    float sum = 0.f;
    for (int s = threadIdx.x; s < n; s += 128) sum += expf(weight[s] - mx);
    lse = mx + logf(block_reduce<false>(sum, scratch));
    for (int s = threadIdx.x; s < n; s += 128) weight[s] = expf(weight[s] - lse);  // 0: empty
    __syncthreads();
    for (int s0 = 0; s0 < n; s0 += kInFlight) {
      float4 v[kInFlight];
      float w[kInFlight];
#pragma unroll
      for (int e = 0; e < kInFlight; ++e) {
        const int s = s0 + e;
        w[e] = s < n ? weight[s] : 0.f;
        // An empty split's partial is never read (it may hold anything; 0 * NaN is NaN).
        v[e] = w[e] != 0.f ? o_part[s * split_stride * 128] : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int e = 0; e < kInFlight; ++e) {
        o.x += w[e] * v[e].x, o.y += w[e] * v[e].y, o.z += w[e] * v[e].z, o.w += w[e] * v[e].w;
      }
    }
    if (p.sink != nullptr) {
      const float f = 1.f / (1.f + expf(p.sink[h * p.sink_stride] - lse));
      o.x *= f, o.y *= f, o.z *= f, o.w *= f;
    }
  }
  if constexpr (kFused) {  // the fused op: the row's RoPE, e4m3 cast and scales (fused_out.cuh)
    sparse_decode_detail::fused_store_combined(p, token, h, o, rope);
  } else {
    __nv_bfloat162 lo = __floats2bfloat162_rn(o.x, o.y), hi = __floats2bfloat162_rn(o.z, o.w);
    char* out = static_cast<char*>(p.out) + (i * p.out_stride_b + j * p.out_stride_s +
                                             h * p.out_stride_h + 4 * threadIdx.x) * 2;
    reinterpret_cast<__nv_bfloat162*>(out)[0] = lo;
    reinterpret_cast<__nv_bfloat162*>(out)[1] = hi;
  }
  if (threadIdx.x == 0) {
    p.lse[i * p.lse_stride_b + h * p.lse_stride_h + j * p.lse_stride_s] = lse;
    if (p.max_logits != nullptr) {
      p.max_logits[i * p.max_logits_stride_b + h * p.max_logits_stride_h +
                   j * p.max_logits_stride_s] = max_logit;
    }
  }
}

}  // namespace

cudaError_t launch_sparse_decode_combine(const SparseDecodeParams& params, cudaStream_t stream) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(params.h_q, min(params.tokens - params.token0, 65535));
  config.blockDim = dim3(128);
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  return params.fused.on
             ? cudaLaunchKernelEx(&config, sparse_decode_combine_kernel<true>, params)
             : cudaLaunchKernelEx(&config, sparse_decode_combine_kernel<false>, params);
}

}  // namespace openmla::cuda::sm90
