// Merge of split-KV decode partials (docs/semantics.md, merge applied inside split-KV decode).
//
// The decode kernel writes a request that has one split straight to out/lse; a request with
// n > 1 splits leaves fp32 partials in the workspace, indexed by global split
// (schedule.num_splits[r] .. num_splits[r + 1]):
//   lse_accum [splits, s_q, h_q]   natural-log partial lse, -inf where the split saw no key
//   o_accum   [slots, h_kv, m_blocks] blocks of 16 G query rows x 512 (m_blocks = ceil(s_q
//             group / 64), a kv head's rows row = token * group + head in group, G =
//             core::partial_row_groups(s_q group)), each as the decode CTA's two warpgroups hold
//             their accumulators: float4 (32 wg + k) * 32 G + t is rows r, r + 8 (r = 16 (t /
//             32) + (t % 32) / 4) x dims 256 wg + 8 k + 2 (t % 4), + 1 of the normalised
//             partial output (rows past the kv head's are filler). A split request's pieces
//             have slots core::partial_slot(split, first split, request); whole ones none.
// and this kernel merges them: lse = log Σ exp(lse_i), out = Σ exp(lse_i - lse) o_i (out 0 and
// lse +inf when no split saw a key). It is launched with programmatic dependent launch: its
// blocks start while the decode kernel drains and wait (griddepcontrol.wait) for its results.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "openmla/tensor.h"

namespace openmla::cuda {

struct DecodeCombineParams {
  const float* lse_accum = nullptr;
  const float* o_accum = nullptr;
  const int32_t* num_splits = nullptr;  // [batch + 1]
  int64_t num_splits_stride = 1;
  void* out = nullptr;  // [batch, s_q, h_q, d_v] bf16|fp16 (strides in elements)
  int64_t out_stride_b = 0, out_stride_s = 0, out_stride_h = 0;
  float* lse = nullptr;  // [batch, h_q, s_q]
  int64_t lse_stride_b = 0, lse_stride_h = 0, lse_stride_s = 0;
  bool out_16B = false;  // out 16-byte aligned with strides of multiples of 8 elements
  int batch = 0, s_q = 0, h_q = 0, h_kv = 1;
  // The workspace's room (as DenseDecodeParams): a request whose splits or partial slots fall
  // outside it (a corrupted caller's schedule) is left unwritten, never read out of bounds.
  int max_splits = 0, max_slots = 0;
  int warps_per_row = 1;  // 1, 2, 4 or 8 warps share a unit's splits (decode_combine_warps_per_row)
};

// The warps per row for a schedule of `num_sm_parts` workers over `batch` requests: 1 when a
// request has a few splits, up to 8 when one long request is split over every worker.
int decode_combine_warps_per_row(int batch, int num_sm_parts);

// d_v is 512. `out_dtype` is kBF16 or kFP16. One launch on `stream`, PDL-attributed unless
// `programmatic` is false (then it starts after the decode kernel ends: a diagnostic that times
// the combine's own work apart from its wait).
cudaError_t launch_decode_combine(const DecodeCombineParams& params, DType out_dtype,
                                  cudaStream_t stream, bool programmatic = true);

}  // namespace openmla::cuda
