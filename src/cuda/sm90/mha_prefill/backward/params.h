// The parameter block of SM90 dense MHA prefill backward (NOTES.md): one struct shared by the
// preprocess, main and postprocess kernels, filled once by launch.cu. Strides are in elements;
// every tensor's last dim is contiguous.
#pragma once

#include <cstdint>

namespace openmla::cuda::sm90::mha_bwd {

struct MhaBwdParams {
  // Inputs (q's dtype: bf16 or fp16), [tokens, heads, dim].
  const void* q;
  const void* k;
  const void* v;
  const void* dout;
  const void* out;
  int64_t q_stride_t, q_stride_h;
  int64_t k_stride_t, k_stride_h;
  int64_t v_stride_t, v_stride_h;
  int64_t do_stride_t, do_stride_h;
  int64_t o_stride_t, o_stride_h;
  const float* lse;  // [total_q, h_q] natural log, any strides
  int64_t lse_stride_t, lse_stride_h;
  const int* cu_seqlens_q;   // [batch + 1], on the device
  const int* cu_seqlens_kv;  // [batch + 1]

  // Outputs: q's dtype or fp32 each (the *_f32 flags).
  void* dq;
  void* dk;
  void* dv;
  int64_t dq_stride_t, dq_stride_h;
  int64_t dk_stride_t, dk_stride_h;
  int64_t dv_stride_t, dv_stride_h;
  bool dq_f32, dk_f32, dv_f32;

  // Workspace (launch.cu carves it): dQ accumulated in fp32 [h_q, total_q, d_qk] and
  // D = rowsum(dout * out) in fp32 [h_q, total_q].
  float* dq_accum;
  float* delta;

  int64_t total_q;
  int batch, h_q, h_kv, group;  // group = h_q / h_kv
  int max_seqlen_q, max_seqlen_kv;
  bool causal;
  float scale;       // softmax scale
  float scale_log2;  // scale * log2(e)
};

}  // namespace openmla::cuda::sm90::mha_bwd
