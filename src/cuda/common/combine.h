// The one merge of split-KV decode partials, for dense decode and the sparse family (sparse
// decode, the fused V4 op, dense decode over a quantised cache; docs/semantics.md, merge applied
// inside split-KV decode).
//
// A decode CTA whose request (sparse: problem) has one split writes out/lse itself; with n > 1
// splits each leaves an fp32 partial in the workspace, indexed by global split (dense:
// schedule.num_splits[r] .. num_splits[r + 1]; sparse: n r .. n r + n - 1):
//   lse_accum [splits, s_q, h_q]   natural-log partial lse, -inf where the split saw no key
//   o_accum   [slots, h_kv, m_blocks] blocks of 16 G query rows x 512 (m_blocks = ceil(s_q
//             group / 64), a kv head's rows row = token * group + head in group, G =
//             core::partial_row_groups(s_q group)), each as the decode CTA's two warpgroups hold
//             their accumulators: float4 (32 wg + k) * 32 G + t is rows r, r + 8 (r = 16 (t /
//             32) + (t % 32) / 4) x dims 256 wg + 8 k + 2 (t % 4), + 1 of the normalised
//             partial output (rows past the kv head's are filler). Dense: a split request's
//             pieces have slots core::partial_slot(split, first split, request), whole ones none;
//             sparse: slot = global split.
// and this kernel merges them: lse = log Σ exp(lse_i), out = Σ exp(lse_i - lse) o_i (out 0 and
// lse +inf when no split saw a key; merge_math.cuh, shared with merge_attention_states). It is
// launched with programmatic dependent launch: its blocks start while the decode kernel drains
// and wait (griddepcontrol.wait) for its results.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/sm90/sparse_decode/params.h"
#include "openmla/tensor.h"

namespace openmla::cuda {

struct DecodeCombineParams {
  const float* lse_accum = nullptr;
  const float* o_accum = nullptr;
  // Request r's splits: num_splits[r] .. num_splits[r + 1] (dense decode's schedule; slots
  // core::partial_slot), or, with uniform_splits = n > 0, n splits each (sparse decode: global
  // splits and slots n r .. n r + n - 1; num_splits unused).
  const int32_t* num_splits = nullptr;  // [batch + 1]
  int64_t num_splits_stride = 1;
  int uniform_splits = 0;
  int request0 = 0;  // the launch's first request (launch_decode_combine sets it)
  void* out = nullptr;  // [batch, s_q, h_q, d_v] bf16|fp16 (strides in elements)
  int64_t out_stride_b = 0, out_stride_s = 0, out_stride_h = 0;
  float* lse = nullptr;  // [batch, h_q, s_q]
  int64_t lse_stride_b = 0, lse_stride_h = 0, lse_stride_s = 0;
  bool out_16B = false;  // out 16-byte aligned with strides of multiples of 8 elements
  // Requests of s_q query tokens each; out's and lse's rows count s_q_out tokens (0: s_q): query
  // token s of request r is row (r s_q + s) / s_q_out, column (r s_q + s) % s_q_out there
  // (sparse decode: a request a token, s_q 1).
  int batch = 0, s_q = 0, h_q = 0, h_kv = 1, s_q_out = 0;
  // The workspace's room (as DenseDecodeParams): a request whose splits or partial slots fall
  // outside it (a corrupted caller's schedule) is left unwritten, never read out of bounds.
  int max_splits = 0, max_slots = 0;
  int warps_per_row = 1;  // 1, 2, 4 or 8 warps share a unit's splits (decode_combine_warps_per_row)
  // Optional (sparse decode): the attention sink [h_q] (out *= 1 / (1 + e^(sink - lse))), and
  // the max logit, max_accum laid out as lse_accum, merged into max_logits [batch, h_q, s_q].
  const float* sink = nullptr;
  int64_t sink_stride = 0;
  const float* max_accum = nullptr;
  float* max_logits = nullptr;
  int64_t max_logits_stride_b = 0, max_logits_stride_h = 0, max_logits_stride_s = 0;
  // The fused V4 op's output (fused.on; d_v 512, h_kv 1, s_q 1, warps_per_row <= 4): the merged
  // row's inverse RoPE, e4m3 cast and UE8M0 scales (sparse_decode/fused_out.cuh) instead of out.
  sm90::SparseFusedParams fused;
};

// The warps per row for a schedule of `num_sm_parts` workers over `batch` requests: 1 when a
// request has a few splits, up to 8 when one long request is split over every worker.
int decode_combine_warps_per_row(int batch, int num_sm_parts);

// d_v is 512. `out_dtype` is kBF16 or kFP16 (kBF16 with fused.on). Launched on `stream`, the
// first grid of 65535 requests PDL-attributed unless `programmatic` is false (then it starts
// after the decode kernel ends: a diagnostic that times the combine's own work apart from its
// wait); later grids wait for all earlier work of the stream.
cudaError_t launch_decode_combine(const DecodeCombineParams& params, DType out_dtype,
                                  cudaStream_t stream, bool programmatic = true);

}  // namespace openmla::cuda
