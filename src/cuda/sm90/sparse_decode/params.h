// The one door into the SM90 sparse decode kernel (docs/semantics.md): plain pointers, strides (in
// elements) and sizes, filled by launch.cu from validated SparseDecodeArgs.
#pragma once

#include <cstdint>

#include "core/sparse_split_plan.h"

namespace openmla::cuda::sm90 {

// One paged cache as the producer warps read it (all in bytes; kv_format.h's KVLayout).
struct SparseCacheParams {
  const uint8_t* base = nullptr;
  int64_t block_stride = 0;
  int64_t data_offset = 0, data_stride = 0;
  int64_t scale_offset = 0, scale_stride = 0;
  int64_t rope_offset = 0, rope_stride = 0;
  int64_t num_slots = 0;  // num_blocks * page_size: indices outside [0, num_slots) are never read
  int page_size = 1;
  int page_shift = -1;    // log2(page_size) when a power of two, else -1 (a division per key)
  int codec = 0;          // kvcodec::Codec of the format
  int prefetch_bytes = 0; // a token's data part rounded up to 16 B for the L2 bulk prefetch; 0: off
  bool async_copy = false;  // bf16 with 16 B aligned rows: keys go to shared memory by cp.async
  bool by_token = false;    // quantised, parts aligned for the token fill (fills.cuh)
};

// The fused V4 attention's steps around the kernel (include/openmla/fused_attention.h; sparse
// mode at d_qk = d_v = 512 only, every query token a problem of its own: Row::i is the token).
// Q: the RMS norm (optional) and the RoPE of its last 64 dims applied in shared memory after
// the load (fused_q.cuh); out: the inverse RoPE, the e4m3 cast and the UE8M0 scales in place of
// the bf16 store (fused_out.cuh), in the kernel's epilogue or in the combine.
struct SparseFusedParams {
  bool on = false;
  bool q_norm = false;
  float eps = 0.f;
  const int32_t* positions = nullptr;  // [tokens]
  int64_t positions_stride = 0;
  int64_t num_positions = 0;           // a position outside [0, num_positions) reads no cos/sin
  const float* cos_sin = nullptr;      // [num_positions, 64]: cos in [0, 32), sin in [32, 64)
  int64_t cos_sin_stride0 = 0, cos_sin_stride1 = 0;
  uint8_t* out_fp8 = nullptr;          // [tokens, n_wv_group, group_size * 512] (last dim dense)
  int64_t out_stride_s = 0, out_stride_g = 0;
  int32_t* out_sf = nullptr;           // [tokens, n_wv_group, group_size * 4] packed bytes
  int64_t sf_stride_s = 0, sf_stride_g = 0, sf_stride_k = 0;
  int group_size = 1;                  // heads of an output group
};

struct SparseDecodeParams {
  const void* q;  // [b, s_q, h_q, d_qk] bf16
  int64_t q_stride_b, q_stride_s, q_stride_h;
  // Between a head's 16-dim chunks of q: 16 (rows contiguous), h_q * 16 for the fused op's
  // permute_q_b_proj layout (chunks interleaved across heads).
  int64_t q_stride_c16 = 16;
  void* out;  // [b, s_q, h_q, 512] bf16
  int64_t out_stride_b, out_stride_s, out_stride_h;
  float* lse;  // [b, h_q, s_q]
  int64_t lse_stride_b, lse_stride_h, lse_stride_s;
  float* max_logits;  // optional [b, h_q, s_q]: the max scaled logit (sparse prefill's output)
  int64_t max_logits_stride_b, max_logits_stride_h, max_logits_stride_s;

  // The main cache (0) and the optional extra cache (1), each with its indices [b, s_q, topk]
  // and optional lengths [b]; topk[1] = 0 without an extra cache.
  SparseCacheParams cache[2];
  const int32_t* indices[2];
  int64_t indices_stride_b[2], indices_stride_s[2], indices_stride_k[2];
  const int32_t* lengths[2];  // null: all topk entries count
  int64_t lengths_stride[2];
  int topk[2];

  const float* sink;  // [h_q] or null
  int64_t sink_stride;

  SparseFusedParams fused;  // fused.on: the fused V4 attention (out and out_stride_* unused)

  // Split partials (num_splits > 1) in the split-KV combine's format (cuda/common/combine.h,
  // with problem q's split s the global split q num_splits + s, its slot too): o_partial its
  // "o_accum" blocks (normalised fp32 in the accumulators' order), lse_partial its "lse_accum"
  // [global split, s_pack, h_q] (-inf: the split saw no key), max_partial laid out as lse_partial
  // (with max_logits).
  float* o_partial;
  float* lse_partial;
  float* max_partial;

  // Dense mode (dense decode over a quantised cache; block_table non-null): request i's keys are
  // its first L_i cache positions through its block table instead of an index list (cache[0]
  // only), and its s_q query tokens share one problem, packed into the MMA rows (row f of the
  // problem = j * h_q + h), so a tile is gathered and dequantised once for all of them. Causal:
  // token j sees positions < L_i - s_q + 1 + j. A block id outside [0, num_blocks) names no key.
  const int32_t* block_table;  // [b, max_blocks]; null: sparse mode
  int64_t block_table_stride_b;
  const int32_t* seqlens;      // [b] (clamped to [0, max_blocks * page_size])
  int64_t seqlens_stride;
  int max_blocks;
  int num_blocks;
  bool causal;

  int batch, s_q, h_q;
  int tokens;           // batch * s_q query tokens (the combine's rows)
  int s_pack;           // query tokens per problem: 1 (sparse: own indices) or s_q (dense)
  int problems;         // tokens / s_pack: the decode grid's z
  int problem0;         // the first problem of a decode launch (grids of at most 65535)
  int m_blocks;         // ceil(s_pack * h_q / 64)
  int num_splits;       // the grid's y
  int tiles_per_split;  // 64-key tiles of a problem each split walks (sparse mode; dense mode
                        // divides each request's own tiles evenly over the splits in the kernel)
  float scale;          // softmax scale
  float scale_log2;     // scale * log2(e)
  bool by_token;        // every cache the grid reads takes the token fill (fills.cuh)
  int fill_codec;       // by_token: the caches' one kvcodec::Codec, for a fill built for it; -1:
                        // the fill reads each cache's codec at run time
  bool seesaw;          // every cache bf16 by cp.async, sparse mode, unpaired: the seesaw
                        // order of the compute warpgroups (kernel.cuh consume)
  bool pair;            // by_token, one codec, m_blocks even: 2-CTA clusters share the decoding
                        // (pair.cuh)
  bool stagger;         // seesaw: with staggered maxima (sparse prefill's order)
  bool group_fill;      // seesaw: bf16 rows by 8-lane groups, 4 keys a warp instruction
                        // (the bf16 grids' default; fill_rows.cuh)
  int stream;           // fill_codec >= 0: the streaming token fill 1, 0 off (fills.cuh)
  int ring;             // fill_codec >= 0, unpaired: 1 the ring fill's kernel (traits.h kRing;
                        // fill_ring.cuh produce_by_ring), 2 with three round slots, 3 the
                        // slots with fp16 keys (kFp16); 0 off
};

}  // namespace openmla::cuda::sm90
