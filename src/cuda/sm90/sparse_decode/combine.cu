// The sparse decode combine: merges a query token's split partials (params.h: row-major fp32
// o_partial and lse_partial) into out and lse, applying the attention sink. One 128-thread block
// per (head, token), four output dims a thread; launched with programmatic dependent launch, so
// it is resident before the decode grid ends and waits for it with griddepcontrol.wait.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "cuda/sm90/sparse_decode/launch.h"
#include "cuda/sm90/sparse_decode/params.h"

namespace openmla::cuda::sm90 {
namespace {

__global__ void __launch_bounds__(128) sparse_decode_combine_kernel(
    const __grid_constant__ SparseDecodeParams p) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const int h = blockIdx.x, token = p.token0 + blockIdx.y;
  const int i = token / p.s_q, j = token - i * p.s_q;
  const int64_t row = static_cast<int64_t>(token) * p.h_q + h;
  const int64_t split_stride = static_cast<int64_t>(p.tokens) * p.h_q;
  float mx = -INFINITY;
  for (int s = 0; s < p.num_splits; ++s) mx = fmaxf(mx, p.lse_partial[s * split_stride + row]);
  float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
  float lse = INFINITY;  // no split saw a key: a lonely query
  if (mx != -INFINITY) {
    float sum = 0.f;
    for (int s = 0; s < p.num_splits; ++s) sum += expf(p.lse_partial[s * split_stride + row] - mx);
    lse = mx + logf(sum);
    for (int s = 0; s < p.num_splits; ++s) {
      const float w = expf(p.lse_partial[s * split_stride + row] - lse);  // 0 for an empty split
      if (w == 0.f) continue;
      const float4 v =
          reinterpret_cast<const float4*>(p.o_partial + (s * split_stride + row) * 512)[threadIdx.x];
      o.x += w * v.x, o.y += w * v.y, o.z += w * v.z, o.w += w * v.w;
    }
    if (p.sink != nullptr) {
      const float f = 1.f / (1.f + expf(p.sink[h * p.sink_stride] - lse));
      o.x *= f, o.y *= f, o.z *= f, o.w *= f;
    }
  }
  __nv_bfloat162 lo = __floats2bfloat162_rn(o.x, o.y), hi = __floats2bfloat162_rn(o.z, o.w);
  char* out = static_cast<char*>(p.out) +
              (i * p.out_stride_b + j * p.out_stride_s + h * p.out_stride_h + 4 * threadIdx.x) * 2;
  reinterpret_cast<__nv_bfloat162*>(out)[0] = lo;
  reinterpret_cast<__nv_bfloat162*>(out)[1] = hi;
  if (threadIdx.x == 0) {
    p.lse[i * p.lse_stride_b + h * p.lse_stride_h + j * p.lse_stride_s] = lse;
    if (p.max_logits != nullptr) {
      float m = -INFINITY;
      for (int s = 0; s < p.num_splits; ++s) m = fmaxf(m, p.max_partial[s * split_stride + row]);
      p.max_logits[i * p.max_logits_stride_b + h * p.max_logits_stride_h +
                   j * p.max_logits_stride_s] = m;
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
  return cudaLaunchKernelEx(&config, sparse_decode_combine_kernel, params);
}

}  // namespace openmla::cuda::sm90
