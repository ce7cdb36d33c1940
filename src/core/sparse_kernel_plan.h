// Which form of the SM90 sparse kernel a launch runs (sparse decode, sparse prefill, dense decode
// over a KVCache): the producer's fill, the compute warpgroups' order and their settings, chosen
// on the host from the grid's shape and caches (SparseTuning's overrides serve tests and
// benchmarks only). src/cuda/sm90/sparse_decode/launch.cu applies the plan; CPU tests pin the
// defaults here, each of which was measured faster than the alternatives on an H100
// (sparse_decode/NOTES.md).
#pragma once

#include <cstdint>

namespace openmla::core {

// The token fill's quantised formats (the kernel builds its fill once per format).
enum class SparseFillFormat { kNone, kFP8_V32, kFP8_Model1, kFP8_MX, kFP4 };

struct SparseKernelShape {
  bool prefill = false;     // sparse prefill's bf16 kv (one query token a problem)
  bool dense_mode = false;  // keys through a block table (dense decode over a KVCache)
  int d_qk = 576;
  int m_blocks = 1;         // 64-row blocks a problem
  int rows = 64;            // rows a problem (heads times packed query tokens)
  // Every cache the grid reads is quantised with parts aligned for the token fill; `format` is
  // their one format (kNone when the main and extra caches differ).
  bool by_token = false;
  SparseFillFormat format = SparseFillFormat::kNone;
  // Every cache the grid reads is bf16 with 16-byte rows (keys by cp.async).
  bool bf16_async = false;
  int tiles_per_split = 0;  // the most 64-key tiles a CTA walks (the split plan's)
};

// Settings of the sparse family's launch for tests and benchmarks (the internal entries of
// cuda/sm90/sparse_decode/tuning.h); the production path always passes the defaults, where -1
// means the plan's measured choice and 0 / 1 force a form off / on where the grid allows it.
// Every form a setting can pick is compiled (the instantiations listed in sparse_decode/NOTES.md).
struct SparseTuning {
  int stagger = -1;  // the seesaw's staggered maxima (the sparse mode's bf16 grids)
  int seesaw = -1;   // the seesaw order of the compute warpgroups (bf16 keys by cp.async)
  int groups = -1;   // bf16 rows by 8-lane groups
  int stream = -1;   // the streamed token fill (quantised, a register fill)
  int pair = -1;     // 2-CTA clusters decoding each tile once (two m-blocks)
  int ring = -1;     // the ring fill (raw bytes by cp.async, decoded from shared memory)
  int slots = -1;    // the ring's form: 0 one stage (sparse mode, d 576), 1 three round slots
  int fp16 = -1;     // the slots' keys staged as fp16 (the dense mode, fp8 formats)
  bool generic_fill = false;  // the token fill that reads the format at run time
  // Cache reading (launch.cu's cache descriptor):
  bool key_fill = false;        // quantised keys by the warp-per-key fill, not the token fill
  bool no_prefetch = false;     // no one-tile-ahead L2 prefetch
  bool bf16_registers = false;  // bf16 keys through registers, not by cp.async
  // The split plan (core/sparse_split_plan.h): a CTA's fixed cost in tiles (-1: the plan's 1),
  // and a forced split length in tiles (0: the plan's; the sparse mode only).
  int split_overhead = -1;
  int tiles_per_split = 0;
  // Sparse prefill from a quantised cache: each named slot dequantised once (1, where the
  // workspace holds the rows), the direct path (0), or the plan (-1).
  int dequant_once = -1;
};

struct SparseKernelPlan {
  bool fill_for_format = false;  // the token fill built for `format` (else it reads the format)
  bool pair = false;             // a 2-CTA cluster decodes each tile once
  int stream = 0;                // the token fill's rounds: 0 one by one, 1 streamed
  int ring = 0;                  // 1 the ring fill's kernel (raw bytes by cp.async, one
                                 // bf16 stage; sparse mode, d 576), 2 with three round slots,
                                 // 3 the slots with the keys staged as fp16 (dense mode); 0 not
  bool seesaw = false;           // compute warpgroups in the seesaw order
  bool stagger = false;          // ... with staggered maxima
  bool group_fill = false;       // bf16 rows by 8-lane groups
};

SparseKernelPlan plan_sparse_kernel(const SparseKernelShape& shape, const SparseTuning& tuning);

// Sparse prefill straight from a paged cache: whether to dequantise each slot the indices name
// once into compact bf16 rows and run the bf16 prefill on them, rather than decode every key in
// each query token's CTAs (each CTA of a 64-head block decodes its own copy).
struct PrefillFromCacheShape {
  int64_t s_q = 0, topk = 0, h_q = 0;
  int64_t num_slots = 0;      // the cache's slots
  bool quantised = false;     // fp8_v32, fp8_model1, fp8_mx or fp4 (bf16 rows need no decode)
  bool workspace_fits = false;  // the caller's workspace holds the rows (workspace size overload)
};
// The rows the compacting path reserves: one a distinct slot at most.
int64_t prefill_compact_rows(int64_t s_q, int64_t topk, int64_t num_slots);
// `forced`: SparseTuning::dequant_once (-1 the plan, 0 off, 1 on wherever the workspace fits).
bool prefill_dequantizes_once(const PrefillFromCacheShape& shape, int forced);

}  // namespace openmla::core
