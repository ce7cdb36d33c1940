// The one door into the SM90 dense decode kernel: plain pointers, strides (in elements) and
// sizes, filled by launch.cu from validated DenseDecodeArgs.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace openmla::cuda::sm90 {

struct DenseDecodeParams {
  // The paged cache as a 4-D TMA tensor map (dims, token-in-page, kv head, block), box 64 dims x
  // min(page_size, 32) tokens, 128 B swizzle (first member: CUtensorMap is over-aligned).
  CUtensorMap tma_k;
  // q as a 5-D TMA tensor map (dim, head in group, kv head, token, request), box 64 dims x
  // min(group, 64) heads x 1 x 64 / min(group, 64) tokens: one box is one 64-row x 64-dim piece
  // of a CTA's Q (row = token * group + head in group). Only when the group divides 64 or 64
  // divides the group (q_tma = 1); otherwise the compute threads load Q (q_tma = 0).
  CUtensorMap tma_q;
  int q_tma;
  // out as a 5-D map of the same geometry as tma_q (d 512): a CTA's 64 output rows are 8 boxes
  // of 64 dims, stored by TMA from Q's shared memory (out_tma = 1; rows past the request's are
  // outside the map and not written), or by the compute threads' own stores (out_tma = 0).
  CUtensorMap tma_out;
  int out_tma;
  int q_prefetch;  // the next request's Q prefetched into L2 at a request's start

  const void* q;  // [b, s_q, h_q, d_qk]
  int64_t q_stride_b, q_stride_s, q_stride_h;
  void* out;  // [b, s_q, h_q, 512]
  int64_t out_stride_b, out_stride_s, out_stride_h;
  // How a request with one split writes out: 2 = 16-byte stores (out 16-byte aligned with strides
  // of 8 elements), 1 = 4-byte stores, 0 = not at all (timing diagnostics only).
  int output_stores;
  // Compute warps (1-8) issuing Q's TMA boxes.
  int q_issuers;
  float* lse;  // [b, h_q, s_q]
  int64_t lse_stride_b, lse_stride_h, lse_stride_s;
  const int32_t* block_table;  // [b, max_blocks]
  int64_t block_table_stride_b, block_table_stride_n;
  const int32_t* seqlens;  // [b]
  int64_t seqlens_stride;
  const int32_t* metadata;  // [num_sm_parts, 8]
  int64_t metadata_stride_part, metadata_stride_field;
  const int32_t* num_splits;  // [b + 1]
  int64_t num_splits_stride;
  // Split partials (fp32) of requests with more than one split: lse_accum [splits, s_q, h_q]
  // by global split (-inf: the split saw no key), o_accum [2 num_sm_parts, h_kv, m_blocks]
  // blocks of 16 row_groups rows x 512 in the accumulator's order, by partial_slot (combine.h).
  float* lse_accum;
  float* o_accum;
  // The workspace's room: global splits [0, max_splits) in lse_accum, partial slots
  // [0, max_slots) in o_accum. A caller's schedule is checked for shape only, so a split whose
  // index or slot falls outside (a corrupted schedule) is not stored.
  int max_splits, max_slots;

  int batch, s_q, h_q, h_kv;
  int group;         // h_q / h_kv: query heads per kv head (consecutive)
  int rows;          // s_q * group: query rows per (request, kv head)
  int m_blocks;      // ceil(rows / 64): the grid's x
  int row_groups;    // ceil(min(rows, 64) / 16): 16-row groups of an m-block holding a row
  int page_size;
  int page_shift;    // log2(page_size) for pages of 8, 16 or 32 keys
  int64_t capacity;  // max_blocks * page_size (0 with an empty cache): keys beyond are never read
  float scale;       // softmax scale
  float scale_log2;  // scale * log2(e)
  int causal;
  // L2 hints of the KV loads: cache_hint for requests of fewer than long_from keys,
  // cache_hint_long for the others (one m-block: evict-first is faster for short requests,
  // normal for long ones; NOTES.md, idea 20).
  uint64_t cache_hint, cache_hint_long;
  int long_from;
  // Timeline (clock64) of CTA (0,0,0)'s first trace_pairs pairs, [role][pair][event] with role
  // WG0, WG1, producers (both stages) and kTraceEvents events each; then, per CTA (linear block id below
  // kTraceMaxCtas), {globaltimer at start, at end, clock64 at start, at end, SM id, pairs}; then
  // CTA 0's first kTraceRequests requests, [role][request][event] (trace.cuh Tracer::mark_request).
  // Null: off (bench/profile only; a build with OPENMLA_DENSE_DECODE_TRACE).
  long long* trace;
  int trace_pairs;
};

}  // namespace openmla::cuda::sm90
