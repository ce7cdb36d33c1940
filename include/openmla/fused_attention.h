// Fused DeepSeek V4/V4.1 attention (docs/semantics.md, fused norm-rope-attention-rope-cast):
// the segment between the q_b projection and the grouped output projection in one operation,
// with FlashMLA's interface (flash_mla.fused_norm_rope_attn_rope_cast):
//   1. Q norm (V4; off for V4.1): r = rsqrt(Σ q² / d_qk + eps) per (token, head), fp32, no weight,
//      folded into the softmax scale;
//   2. Q RoPE: the last rope_dim dims of each head, interleaved pairs, cos/sin from
//      cos_sin_cache[token_positions[s]]; the rotated dims rounded to bf16;
//   3. sparse attention (sinks, topk_length; decode: paged caches and the extra cache);
//   4. O RoPE: the inverse rotation of the output's last rope_dim dims, fp32;
//   5. the cast of the output to e4m3 with one UE8M0 power-of-two scale per 32 values, in the
//      layout the grouped output projection (DeepGEMM fp8_einsum "bhr,hdr->bhd") reads.
// q comes in the layout of permute_q_b_proj (16-dim chunks interleaved across heads) and
// out_fp8 goes out in the layout permute_wv_proj's weight expects (32-dim chunks interleaved
// across the heads of a group); docs/semantics.md gives both index maps.
//
// Backends: the CPU backend implements the definition; on CUDA tensors (SM90) the sparse
// attention kernel runs the steps itself: Q's norm and RoPE in shared memory after Q's load,
// the output's RoPE, cast and scales in its epilogue (or in the combine of a split key list).
// d_qk = d_v = 512 on CUDA (FlashMLA's kernel's only size). token_positions are not read on the
// host for CUDA tensors: a position outside [0, num_positions) is never used to read the
// cos/sin cache; that token's out_fp8 is all 0x7F (e4m3 NaN), its scale bytes 0xFF, its lse
// and max_logits unspecified.
#pragma once

#include <cstdint>

#include "openmla/kv_format.h"
#include "openmla/ops.h"
#include "openmla/status.h"
#include "openmla/tensor.h"

namespace openmla {

// The norm, RoPE and cast settings shared by prefill and decode, under FlashMLA's names.
struct FusedNormRopeCast {
  bool enable_q_norm = false;     // V4: true; V4.1: false
  float rms_norm_eps = 1e-6f;     // > 0 (FlashMLA's tests use 1e-4)
  TensorView token_positions;     // [s_q] int32, each in [0, num_positions) (checked on the CPU)
  bool is_rope_neox_style = false;  // must be false (interleaved pairs)
  int rope_dim = 64;              // must be 64
  TensorView cos_sin_cache;       // [num_positions, rope_dim] fp32: cos in [:rope_dim/2], sin after
  int n_wv_group = 0;             // output groups; h_q % n_wv_group == 0
  int num_per_channels = 32;      // must be 32 (values per scale)
  bool use_tma_aligned_col_major_sf = true;  // must be true
  bool round_sf = true;           // must be true (power-of-two scales)
  bool use_packed_ue8m0 = true;   // must be true (4 scale bytes per int32)
};

// Prefill: bf16 keys, as sparse prefill. d_qk = d_v = 512 on FlashMLA's kernel; the CPU backend
// takes any d_qk >= d_v with d_qk % 16 == 0, d_v % 32 == 0, d_v >= rope_dim.
struct FusedPrefillArgs {
  FusedNormRopeCast fused;
  TensorView q;            // [s_q, h_q, d_qk] bf16, permute_q_b_proj layout; each token's
                           // h_q * d_qk values contiguous (stride(1) == d_qk, stride(2) == 1)
  TensorView kv;           // [s_kv, 1, d_qk] bf16, last dim contiguous
  TensorView indices;      // [s_q, 1, topk] int32; invalid: < 0 or >= s_kv
  TensorView topk_length;  // optional [s_q] int32 (clamped to [0, topk])
  TensorView attn_sink;    // optional [h_q] fp32 (±inf allowed)
  int d_v = 512;
  float softmax_scale = 0.f;  // <= 0: 1/sqrt(d_qk)
  TensorView out_fp8;      // out [s_q, n_wv_group, wv_group_size * d_v] uint8 (e4m3 bits),
                           // last dim contiguous
  TensorView out_sf;       // out [s_q, n_wv_group, wv_group_size * d_v / 128] int32, with the
                           // strides of fused_out_sf_layout (token dim contiguous)
  TensorView max_logits;   // out [s_q, h_q] fp32 (-inf: lonely query)
  TensorView lse;          // out [s_q, h_q] fp32 (+inf: lonely query; without the sink)
  Workspace workspace;     // CUDA: fused_norm_rope_attn_rope_cast_workspace_size bytes
};

// Decode: paged caches of the V4 (fp8_model1, 584 B) or V4.1 (fp8_mx, 528 B) format, and an
// extra cache of the same format or V4.1 fp4 (288 B). Batch 1: each query token has its own
// index row and lengths, as FlashMLA's fused decode.
struct FusedDecodeArgs {
  FusedNormRopeCast fused;
  TensorView q;                  // [s_q, h_q, d_qk] bf16, as FusedPrefillArgs::q
  KVCache k_cache;               // d_qk of q
  TensorView indices;            // [s_q, topk] int32 slots block * page_size + offset
  TensorView topk_length;        // optional [s_q] int32
  KVCache extra_k_cache;         // optional
  TensorView extra_indices;      // [s_q, extra_topk] int32 (with extra_k_cache)
  TensorView extra_topk_length;  // optional [s_q] int32
  TensorView attn_sink;          // optional [h_q] fp32
  int d_v = 512;
  float softmax_scale = 0.f;
  TensorView out_fp8;            // as FusedPrefillArgs
  TensorView out_sf;             // as FusedPrefillArgs
  TensorView lse;                // out [s_q, h_q] fp32 (+inf: lonely query; without the sink)
  Workspace workspace;           // CUDA: fused_norm_rope_attn_rope_cast_workspace_size bytes
  // CUDA: each token's key list walked by one CTA in its order, so a token's result does not
  // depend on the other tokens of the call (as SparseDecodeArgs::batch_invariant).
  bool batch_invariant = false;
};

// The scale factors' layout (FlashMLA's / DeepGEMM's TMA-aligned column-major packed UE8M0):
// out_sf[s, g, k] lives at int32 element  g * (k_per_group * aligned_s_q) + k * aligned_s_q + s
// of a buffer of storage_ints int32, aligned_s_q = s_q rounded up to a multiple of 4. Element
// [s, g, k] packs the scale bytes of chunks 4k .. 4k+3 of group g (little-endian: chunk 4k in the
// low byte). Rows s_q .. aligned_s_q - 1 are padding, never written.
struct FusedOutSfLayout {
  int64_t shape[3];
  int64_t strides[3];   // in int32 elements
  int64_t aligned_s_q;
  int64_t storage_ints; // n_wv_group * k_per_group * aligned_s_q
};
// InvalidArgument unless s_q >= 0, n_wv_group >= 1 and wv_group_size * d_v % 128 == 0.
Status fused_out_sf_layout(int64_t s_q, int64_t n_wv_group, int64_t wv_group_size, int64_t d_v,
                           FusedOutSfLayout* layout);

// Bytes of workspace either fused operation needs for s_q query tokens of h_q heads on `device`
// (0 on the CPU): the fp32 partials of split key lists.
size_t fused_norm_rope_attn_rope_cast_workspace_size(Device device, int64_t s_q, int64_t h_q);

Status fused_norm_rope_attn_rope_cast_prefill(const FusedPrefillArgs& args,
                                              Stream stream = nullptr);
Status fused_norm_rope_attn_rope_cast_decode(const FusedDecodeArgs& args,
                                             Stream stream = nullptr);

}  // namespace openmla
