// The two small kernels around the backward main kernel (NOTES.md): the preprocess writes
// D = rowsum(dout * out) in fp32 (one warp a (token, head) row of d_v 128), the postprocess
// writes dq = scale * the fp32 dQ accumulator in dq's dtype (4 elements a thread).
#include <cute/numeric/numeric_types.hpp>

#include "cuda/sm90/mha_prefill/backward/launch.h"

namespace openmla::cuda::sm90::mha_bwd {
namespace {

constexpr int kRowsPerBlock = 8;  // warps of a preprocess block

template <class Element>
__global__ void __launch_bounds__(256) preprocess_kernel(const __grid_constant__ MhaBwdParams p) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= p.total_q * p.h_q) return;
  const int64_t token = row / p.h_q;
  const int64_t h = row % p.h_q;
  const Element* dout = static_cast<const Element*>(p.dout) + token * p.do_stride_t +
                        h * p.do_stride_h;
  const Element* out = static_cast<const Element*>(p.out) + token * p.o_stride_t +
                       h * p.o_stride_h;
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {  // d_v 128: columns lane + 32 j
    const int d = lane + 32 * j;
    sum += static_cast<float>(dout[d]) * static_cast<float>(out[d]);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) p.delta[h * p.total_q + token] = sum;
}

template <class Element>
__global__ void __launch_bounds__(256) postprocess_kernel(const __grid_constant__ MhaBwdParams p,
                                                          int d_qk) {
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int chunks_per_row = d_qk / 4;
  if (chunk >= p.total_q * p.h_q * chunks_per_row) return;
  const int64_t row = chunk / chunks_per_row;  // h * total_q + token
  const int d0 = static_cast<int>(chunk % chunks_per_row) * 4;
  const int64_t h = row / p.total_q;
  const int64_t token = row % p.total_q;
  const float4 a = *reinterpret_cast<const float4*>(p.dq_accum + row * d_qk + d0);
  const float v[4] = {a.x * p.scale, a.y * p.scale, a.z * p.scale, a.w * p.scale};
  const int64_t base = token * p.dq_stride_t + h * p.dq_stride_h + d0;
  if (p.dq_f32) {
    float* dq = static_cast<float*>(p.dq) + base;
#pragma unroll
    for (int j = 0; j < 4; ++j) dq[j] = v[j];
  } else {
    Element* dq = static_cast<Element*>(p.dq) + base;
#pragma unroll
    for (int j = 0; j < 4; ++j) dq[j] = Element(v[j]);
  }
}

unsigned blocks_for(int64_t items, int64_t per_block) {
  return static_cast<unsigned>((items + per_block - 1) / per_block);
}

}  // namespace

template <class Element>
cudaError_t launch_preprocess(const MhaBwdParams& p, cudaStream_t stream) {
  preprocess_kernel<Element>
      <<<blocks_for(p.total_q * p.h_q, kRowsPerBlock), 256, 0, stream>>>(p);
  return cudaGetLastError();
}

template <class Element>
cudaError_t launch_postprocess(const MhaBwdParams& p, int d_qk, cudaStream_t stream) {
  postprocess_kernel<Element>
      <<<blocks_for(p.total_q * p.h_q * (d_qk / 4), 256), 256, 0, stream>>>(p, d_qk);
  return cudaGetLastError();
}

template cudaError_t launch_preprocess<cute::bfloat16_t>(const MhaBwdParams&, cudaStream_t);
template cudaError_t launch_preprocess<cute::half_t>(const MhaBwdParams&, cudaStream_t);
template cudaError_t launch_postprocess<cute::bfloat16_t>(const MhaBwdParams&, int, cudaStream_t);
template cudaError_t launch_postprocess<cute::half_t>(const MhaBwdParams&, int, cudaStream_t);

}  // namespace openmla::cuda::sm90::mha_bwd
