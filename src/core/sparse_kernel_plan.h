// Which form of the SM90 sparse attention kernel a launch runs (sparse decode, sparse prefill,
// dense decode over a KVCache): one small table, chosen on the host from the grid's shape and
// caches (src/cuda/sm90/sparse_attention/launch.cu applies it; CPU tests pin every row). The
// forms themselves: src/cuda/sm90/sparse_attention/NOTES.md.
#pragma once

#include <cstdint>

namespace openmla::core {

struct SparseKernelShape {
  bool prefill = false;     // sparse prefill's bf16 kv (one query token a problem)
  bool dense_mode = false;  // keys through a block table (dense decode over a KVCache)
  int d_qk = 576;
  int m_blocks = 1;         // 64-row blocks a problem
  bool quantised = false;   // every cache the grid reads is fp8_v32, fp8_model1, fp8_mx or fp4
  bool bf16_aligned = false;  // every cache the grid reads is bf16 with 16-byte aligned rows
};

struct SparseKernelForm {
  bool seesaw = false;  // the seesaw order of the compute warpgroups (bf16 tiles)
  int cluster = 1;      // 2: the CTAs of m-blocks 2c, 2c + 1 share each tile's decoding
};

SparseKernelForm plan_sparse_kernel(const SparseKernelShape& shape);

// Sparse prefill straight from a paged cache: whether to dequantise each slot the indices name
// once into compact bf16 rows and run the bf16 prefill on them, rather than decode every key in
// each query token's CTAs (each CTA of a 64-head block decodes its own copy).
struct PrefillFromCacheShape {
  int64_t s_q = 0, topk = 0, h_q = 0;
  int64_t num_slots = 0;        // the cache's slots
  bool quantised = false;       // fp8_v32, fp8_model1, fp8_mx or fp4 (bf16 rows need no decode)
  bool workspace_fits = false;  // the caller's workspace holds the rows (workspace size overload)
};
// The rows the compacting path reserves: one a distinct slot at most.
int64_t prefill_compact_rows(int64_t s_q, int64_t topk, int64_t num_slots);
bool prefill_dequantizes_once(const PrefillFromCacheShape& shape);

}  // namespace openmla::core
