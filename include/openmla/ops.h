// The operations of OpenMLA (docs/semantics.md). Every operation takes a plain arguments struct of views
// and caller-owned buffers, and a stream; it validates everything first and returns a Status naming
// the argument on bad input. The backend is chosen from where the tensors live (all must agree):
// CPU tensors run on the CPU backend (the stream is ignored), CUDA tensors on the GPU backend.
//
// Optional arguments are empty views (`TensorView{}` / `KVCache{}`).
// `softmax_scale <= 0` means the default 1/sqrt(d_qk).
#pragma once

#include <cstddef>
#include <cstdint>

#include "openmla/kv_format.h"
#include "openmla/status.h"
#include "openmla/tensor.h"

namespace openmla {

// A cudaStream_t, without making this header depend on CUDA. nullptr is the default stream.
using Stream = void*;

// Caller-owned scratch memory on the operation's device; size from the *_workspace_size functions.
struct Workspace {
  void* data = nullptr;
  size_t bytes = 0;
};

// ---------------------------------------------------------------------------------------------
// Split-KV schedule (dense and sparse decode).
//
// The keys of each request are cut into splits and the splits dealt over `num_sm_parts` workers
// so every worker gets about the same number of key blocks (plus a fixed cost per split). The
// schedule depends only on the per-request key counts, so one schedule serves every layer of a
// decode step. Layout (int32, row-major):
//   metadata  [num_sm_parts, kScheduleMetadataInts]: per worker
//             {begin_request, begin_token, end_request, end_token, begin_split, 0, 0, 0}:
//             the worker walks requests begin_request ..= end_request (end_request
//             inclusive), request r over tokens [r == begin_request ? begin_token : 0,
//             r == end_request ? end_token : seqlen_r) (end_token exclusive), one split each,
//             numbered from begin_split; an idle worker has begin_request > end_request.
//   num_splits [batch + 1]: exclusive prefix sum of splits per request (num_splits[batch] = total).
// Tokens are counted in units of `block_tokens` (split boundaries fall on multiples of it).
constexpr int kScheduleMetadataInts = 8;

struct DecodeScheduleArgs {
  TensorView seqlens;  // [batch] int32: keys per request (cache_seqlens, or topk/topk_length)
  int s_q = 1;         // query tokens per request
  int h_q = 128;       // query heads
  int h_kv = 1;        // kv heads
  int num_sm_parts = 0;     // 0: derive from the device (CPU: one per thread)
  int block_tokens = 64;    // split granularity in keys
  TensorView metadata;      // out [num_sm_parts, kScheduleMetadataInts] int32
  TensorView num_splits;    // out [batch + 1] int32
};

// How many workers a schedule for these shapes uses on `device` (the metadata's first dim).
Status decode_num_sm_parts(Device device, int s_q, int h_q, int h_kv, int* num_sm_parts);
Status plan_decode_schedule(const DecodeScheduleArgs& args, Stream stream = nullptr);

// A computed schedule passed to decode. Empty: the operation plans on its own (CPU: always fine;
// CUDA: planned into the workspace, still graph-capturable, but a planner kernel runs before
// every call: 10-27 µs on an H200, launch included). A serving step plans once with
// plan_decode_schedule and passes the result to every layer, as flash_mla's get_mla_metadata does.
struct DecodeSchedule {
  TensorView metadata;    // [num_sm_parts, kScheduleMetadataInts] int32
  TensorView num_splits;  // [batch + 1] int32
};

// ---------------------------------------------------------------------------------------------
// Dense decode (docs/semantics.md, dense decode): V3/V3.1 MLA in its absorbed (MQA) form.
struct DenseDecodeArgs {
  TensorView q;              // [b, s_q, h_q, d_qk] bf16|fp16, last dim contiguous
  TensorView k_cache;        // [num_blocks, page_size, h_kv, d_qk] q's dtype, last dim contiguous
  // Instead of k_cache: a paged cache of any format (KVCache, one kv head), e.g. fp8_v32 for V3.2
  // attending densely while a context is shorter than its top-k, or a V3 cache kept in FP8. The
  // same descriptor sparse decode takes. CUDA: bf16 q, d_v 512; bf16, fp8_v32, fp8_model1, fp8_mx
  // and fp4 caches; `schedule` is not used (the split count comes from the block table's
  // capacity, each request's own keys spread over the splits on the device), and a used block id
  // outside the cache names no key (those positions are skipped, never read).
  KVCache kv_cache;
  TensorView block_table;    // [b, max_blocks] int32
  TensorView cache_seqlens;  // [b] int32, 0 allowed, <= max_blocks * page_size
                             // (CPU: checked, with the used block ids; GPU: not checked, no sync:
                             // < 0 counts as 0, above the capacity as the capacity, a used block
                             // id outside the cache reads zero keys; docs/errors.md)
  int d_v = 512;
  float softmax_scale = 0.f;
  bool causal = false;       // query j of request i sees keys t <= L_i - s_q + j
  DecodeSchedule schedule;   // optional
  TensorView out;            // [b, s_q, h_q, d_v] q's dtype
  TensorView lse;            // [b, h_q, s_q] fp32 (natural log; +inf for a lonely query)
  Workspace workspace;       // dense_decode_workspace_size bytes
};
// 0 on the CPU, and for sizes no decode accepts (batch < 0, s_q < 1, h_kv not dividing h_q, ...).
size_t dense_decode_workspace_size(Device device, int batch, int s_q, int h_q, int h_kv, int d_v);
Status dense_decode(const DenseDecodeArgs& args, Stream stream = nullptr);

// ---------------------------------------------------------------------------------------------
// Sparse decode (docs/semantics.md, sparse decode): V3.2 DSA, V4, V4.1. One kv head; indices address cache slots
// `block * page_size + offset` directly; an index < 0 or >= num_blocks * page_size is ignored.
struct SparseDecodeArgs {
  TensorView q;                 // [b, s_q, h_q, d_qk] bf16, last dim contiguous
  KVCache k_cache;              // any format; d_qk must match q
  TensorView indices;           // [b, s_q, topk] int32
  TensorView topk_length;       // optional [b] int32: only the first topk_length[i] entries count
                                // (clamped to [0, topk])
  KVCache extra_k_cache;        // optional second cache, attended in the same softmax
  TensorView extra_indices;     // [b, s_q, extra_topk] int32 (with extra_k_cache)
  TensorView extra_topk_length; // optional [b] int32
  TensorView attn_sink;         // optional [h_q] fp32: out *= 1 / (1 + exp(sink - lse))
  int d_v = 512;
  float softmax_scale = 0.f;
  DecodeSchedule schedule;      // optional
  TensorView out;               // [b, s_q, h_q, d_v] bf16
  TensorView lse;               // [b, h_q, s_q] fp32 (without the sink)
  TensorView max_logits;        // optional [b, h_q, s_q] fp32: max scaled logit (-inf: lonely)
  // Batch-invariant: a query token's result does not depend on the batch it is in (reproducible
  // serving). CUDA: no split-KV (one CTA walks the token's keys in order), so small batches use
  // fewer SMs; the CPU backend is always batch-invariant.
  bool batch_invariant = false;
  Workspace workspace;
};
size_t sparse_decode_workspace_size(Device device, int batch, int s_q, int h_q, int d_v);
Status sparse_decode(const SparseDecodeArgs& args, Stream stream = nullptr);

// ---------------------------------------------------------------------------------------------
// Sparse prefill (docs/semantics.md, sparse prefill). The keys come either from `kv` (bf16 rows)
// or, straight from an engine's paged cache in any format (dequantised on load, no upconversion
// pass), from `kv_cache`: then `kv` is empty, h_kv is 1 and indices [s_q, 1, topk] name cache
// slots block * page_size + offset (invalid: < 0 or >= num_blocks * page_size).
struct SparsePrefillArgs {
  TensorView q;            // [s_q, h_q, d_qk] bf16, last dim contiguous
  TensorView kv;           // [s_kv, h_kv, d_qk] bf16, last dim contiguous (or empty, see kv_cache)
  KVCache kv_cache;        // optional: the keys' paged cache instead of kv
  TensorView indices;      // [s_q, h_kv, topk] int32; invalid: < 0 or >= s_kv
  TensorView topk_length;  // optional [s_q] int32 (clamped to [0, topk])
  TensorView attn_sink;    // optional [h_q] fp32
  int d_v = 512;
  float softmax_scale = 0.f;
  // Opt-in, with a quantised kv_cache only (d_qk 576 or 512, d_v 512): both products on FP8
  // tensor cores, q and P rounded to e4m3 and each key re-quantised to one power-of-two scale.
  // Its error is about 10-40x the bf16 path's, and on an H100 it is not yet faster than the
  // default (docs/semantics.md, sparse prefill; bench/RESULTS.md).
  bool fp8_tensor_cores = false;
  TensorView out;          // [s_q, h_q, d_v] bf16
  TensorView max_logits;   // [s_q, h_q] fp32 (max scaled logit; -inf for a lonely query)
  TensorView lse;          // [s_q, h_q] fp32 (+inf for a lonely query)
  Workspace workspace;
};
size_t sparse_prefill_workspace_size(Device device, int s_q, int h_q, int d_v);
// The workspace of a call with `kv_cache` of a quantised format (fp8_v32, fp8_model1, fp8_mx,
// fp4) and `topk` indices a query token. Given at least this much, the CUDA backend dequantises
// each slot the indices name once into bf16 rows inside the workspace (min(slots, s_q * topk)
// rows of d_qk, plus s_q * topk int32 row numbers) and runs the bf16 prefill on them, where the
// keys repeat enough across query tokens (on average 8 decodes a row saved or more); given only
// the overload above's, it decodes each key in every query token's blocks that gather it. The
// same operation either way (results agree to rounding); no host sync (graph-safe).
size_t sparse_prefill_workspace_size(Device device, int s_q, int h_q, int d_v, int64_t topk,
                                     const KVCache& kv_cache);
Status sparse_prefill(const SparsePrefillArgs& args, Stream stream = nullptr);

// ---------------------------------------------------------------------------------------------
// Merge of partial attention states (docs/semantics.md, merge): lse = log Σ exp(lse_i),
// out = Σ exp(lse_i - lse) · out_i. A part whose lse is ±inf or NaN holds no keys and is skipped
// (decode reports a lonely query as lse = +inf); when no part holds keys, out = 0 and lse = +inf.
struct MergeStatesArgs {
  TensorView part_out;  // [n, tokens, heads, d_v] fp32|bf16|fp16, last dim contiguous
  TensorView part_lse;  // [n, tokens, heads] fp32 (any strides: a [n, b, h, s] lse fits as a view)
  TensorView out;       // [tokens, heads, d_v] fp32|bf16|fp16
  TensorView lse;       // optional [tokens, heads] fp32
};
Status merge_attention_states(const MergeStatesArgs& args, Stream stream = nullptr);

// ---------------------------------------------------------------------------------------------
// KV-cache write (docs/semantics.md, KV-cache write): quantise `kv[i]` into slot `slot_mapping[i]` = block * page_size +
// offset. -1 skips; like every index, a slot outside [0, num_blocks * page_size) is skipped (never
// written), on every backend. Two rows naming one slot: which one lands is unspecified.
struct KVCacheWriteArgs {
  TensorView kv;            // [n, d_qk] bf16 (fp32 also accepted), last dim contiguous
  TensorView slot_mapping;  // [n] int32|int64
  KVCache cache;            // any format
};
Status kv_cache_write(const KVCacheWriteArgs& args, Stream stream = nullptr);

// Dequantises the tokens at `slots` into `out` (an invalid slot gives a row of zeros).
struct KVCacheGatherArgs {
  KVCache cache;
  TensorView slots;  // [n] int32|int64
  TensorView out;    // [n, d_qk] fp32|bf16
};
Status kv_cache_gather(const KVCacheGatherArgs& args, Stream stream = nullptr);

// ---------------------------------------------------------------------------------------------
// Dense MHA prefill (docs/semantics.md, dense MHA prefill): MLA in its non-absorbed form, ordinary
// multi-head attention over variable-length sequences packed along the token dim (FlashMLA's
// flash_attn_varlen_func). Sequence i holds query tokens [cu_seqlens_q[i], cu_seqlens_q[i+1])
// and keys [cu_seqlens_kv[i], cu_seqlens_kv[i+1]); with `causal`, its query t (of s_q) sees key
// u (of s_kv) iff u <= t + s_kv - s_q (bottom-right aligned). A query that sees no key gets
// out = 0 and lse = -inf. Query head h uses kv head h / (h_q / h_kv).
// cu_seqlens values are checked on the CPU (0 first, non-decreasing, last = total, lengths <=
// the max). CUDA: no kernel yet (NotImplemented).
struct MhaPrefillArgs {
  TensorView q;              // [total_q, h_q, d_qk] bf16|fp16, last dim contiguous; d_qk 192|128
  TensorView k;              // [total_kv, h_kv, d_qk] q's dtype, last dim contiguous
  TensorView v;              // [total_kv, h_kv, d_v] q's dtype, last dim contiguous; d_v 128
  TensorView cu_seqlens_q;   // [b + 1] int32
  TensorView cu_seqlens_kv;  // [b + 1] int32
  int64_t max_seqlen_q = 0;  // >= every query length
  int64_t max_seqlen_kv = 0; // >= every key length
  bool causal = false;
  float softmax_scale = 0.f;
  TensorView out;            // [total_q, h_q, d_v] q's dtype, last dim contiguous
  // [total_q, h_q] fp32, natural log, any strides. FlashMLA's layout is contiguous along the
  // tokens: strides (1, total_q), the memory of a row-major [h_q, total_q].
  TensorView lse;
};
Status mha_prefill(const MhaPrefillArgs& args, Stream stream = nullptr);

// The gradients of mha_prefill's out with respect to q, k and v, given dout and the forward's
// out and lse. Sums in float32 or better; with GQA, dk and dv sum over the query heads of each kv
// head. Every element of dq, dk and dv is written (keys no query sees: 0).
// CUDA (SM90): d_qk 128|192, d_v 128; q, k, v, dout rows 16-byte aligned (strides multiples of 8
// elements); dq is accumulated in float32 inside `workspace`, dk and dv without atomics (the
// query heads of a kv head are summed in order: deterministic).
struct MhaPrefillBackwardArgs {
  TensorView dout;           // [total_q, h_q, d_v] q's dtype, last dim contiguous
  TensorView q, k, v;        // as in MhaPrefillArgs
  TensorView out;            // [total_q, h_q, d_v] q's dtype (the forward's), last dim contiguous
  TensorView lse;            // [total_q, h_q] fp32 (the forward's), any strides
  TensorView cu_seqlens_q;   // as in MhaPrefillArgs
  TensorView cu_seqlens_kv;
  int64_t max_seqlen_q = 0;
  int64_t max_seqlen_kv = 0;
  bool causal = false;
  float softmax_scale = 0.f;
  TensorView dq;             // [total_q, h_q, d_qk] q's dtype or fp32, last dim contiguous
  TensorView dk;             // [total_kv, h_kv, d_qk] q's dtype or fp32, last dim contiguous
  TensorView dv;             // [total_kv, h_kv, d_v] q's dtype or fp32, last dim contiguous
  Workspace workspace;       // CUDA: mha_prefill_backward_workspace_size bytes (CPU: none)
};
// Bytes of workspace a call of this shape needs on `device` (0 on the CPU): on CUDA, the fp32 dq
// accumulator and D = rowsum(dout * out), 4 * total_q * h_q * (d_qk + 1) bytes and alignment.
size_t mha_prefill_backward_workspace_size(Device device, int64_t total_q, int64_t total_kv,
                                           int64_t h_q, int64_t h_kv, int64_t d_qk, int64_t d_v);
Status mha_prefill_backward(const MhaPrefillBackwardArgs& args, Stream stream = nullptr);

// ---------------------------------------------------------------------------------------------
// What this build can run: the CUDA backend compiled in, and a device's SM arch (e.g. 90).
bool cuda_backend_available();
Status cuda_device_arch(int device_index, int* sm_arch);

}  // namespace openmla
