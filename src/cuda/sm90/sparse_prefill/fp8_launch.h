// Host side of sparse prefill's FP8 tensor-core path (fp8_kernel.cuh; docs/semantics.md): the
// kernel's parameters and its launch, one instantiation per d_qk (instantiations/fp8_*.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace openmla::cuda::sm90 {

namespace fp8_prefill {
constexpr int kRowBytes = 640;  // a key row: 512 e4m3 codes, 64 bf16 RoPE dims
}  // namespace fp8_prefill

struct Fp8PrefillParams {
  const uint16_t* q;  // [s_q, h_q, d_qk] bf16
  int64_t q_stride_t, q_stride_h;
  uint16_t* out;  // [s_q, h_q, 512] bf16
  int64_t out_stride_t, out_stride_h;
  float* lse;
  int64_t lse_stride_t, lse_stride_h;
  float* max_logits;
  int64_t max_logits_stride_t, max_logits_stride_h;
  const uint8_t* rows;       // [n, 640]: e4m3 codes of dims 0-511, then 64 bf16 RoPE dims
  const float* row_scales;   // [n]: s_k
  const int32_t* row_index;  // [s_q, topk]: each key's row, -1 for none
  const int32_t* lengths;    // optional topk_length [s_q]
  int64_t lengths_stride;
  const float* sink;  // optional [h_q]
  int64_t sink_stride;
  int h_q, topk;
  int64_t token0;  // the grid's first query token (grids of at most 65535 tokens)
  float scale;     // softmax scale
};

// Grid (m_blocks, tokens): a CTA a 64-head block and query token.
template <int kDqk>
cudaError_t launch_sparse_prefill_fp8(const Fp8PrefillParams& params, int m_blocks, int tokens,
                                      cudaStream_t stream);
extern template cudaError_t launch_sparse_prefill_fp8<576>(const Fp8PrefillParams&, int, int,
                                                           cudaStream_t);
extern template cudaError_t launch_sparse_prefill_fp8<512>(const Fp8PrefillParams&, int, int,
                                                           cudaStream_t);

}  // namespace openmla::cuda::sm90
