// What the host hands the SM90 dense MHA prefill forward (launch.cu fills it, kernel.cuh reads
// it): the TMA maps of q, k, v, the varlen offsets, the outputs and the softmax's constants.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace openmla::cuda::sm90 {

struct MhaFwdParams {
  // 3-D maps over [total, heads, dims] (dims innermost), 128 B swizzle, zero fill past the
  // tensor's rows: q boxes of 64 dims x 1 head x 64 rows, k and v boxes of 64 dims x 1 head x
  // 128 rows.
  CUtensorMap tma_q, tma_k, tma_v;
  const int32_t* cu_seqlens_q;  // [batch + 1], element stride below
  const int32_t* cu_seqlens_kv;
  int64_t cu_q_stride, cu_kv_stride;
  void* out;                   // [total_q, h_q, 128] Element, last dim contiguous
  int64_t out_stride_token, out_stride_head;  // elements (multiples of 8: 16-byte row stores)
  float* lse;                  // [total_q, h_q] fp32, any strides
  int64_t lse_stride_token, lse_stride_head;
  int h_q;
  int group;                   // h_q / h_kv (query heads per kv head)
  int causal;                  // bottom-right aligned when s_q < s_kv
  float softmax_scale;
  float scale_log2;            // softmax_scale * log2(e)
};

}  // namespace openmla::cuda::sm90
