// Which form of the SM90 sparse kernel a launch runs (sparse decode, sparse prefill, dense decode
// over a KVCache): the producer's fill, the compute warpgroups' order and their switches, chosen
// on the host from the grid's shape and caches, with the environment's A/B switches
// (docs/benchmarking.md) as overrides. src/cuda/sm90/sparse_decode/launch.cu reads the
// environment and applies the plan; CPU tests pin the defaults here, each of which was measured
// faster than the alternatives on an H100 (the NOTES.md of sparse_decode and sparse_prefill).
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

// An environment switch: unset, or forced off / on.
struct SparseKernelSwitches {
  int stagger = -1;   // OPENMLA_SPARSE_STAGGER
  int seesaw = -1;    // OPENMLA_SPARSE_SEESAW
  int groups = -1;    // OPENMLA_SPARSE_GROUPS
  int stream = -1;    // OPENMLA_SPARSE_STREAM
  int pair = -1;      // OPENMLA_SPARSE_PAIR
  int ring = -1;      // OPENMLA_SPARSE_RING
  int slots = -1;     // OPENMLA_SPARSE_SLOTS: the ring's form, 0 one stage, 1 three round slots
  int fp16 = -1;      // OPENMLA_SPARSE_FP16: the slots' keys staged as fp16 (fp8 formats)
  int wide = -1;      // OPENMLA_SPARSE_WIDE: the slots decoded by two producer warpgroups
  int pair_slots = -1;  // OPENMLA_SPARSE_PAIRSLOTS: the slots in a CTA pair (two m-blocks)
  bool generic_fill = false;  // OPENMLA_SPARSE_FILL=generic
};

struct SparseKernelPlan {
  bool fill_for_format = false;  // the token fill built for `format` (else it reads the format)
  bool pair = false;             // a 2-CTA cluster decodes each tile once
  int stream = 0;                // the token fill's rounds: 0 one by one, 1 streamed
  int ring = 0;                  // 1 the ring fill's kernel (raw bytes by cp.async, one
                                 // bf16 stage), 2 with three round slots, 3 the slots with
                                 // the keys staged as fp16, 4 the slots decoded by two
                                 // producer warpgroups, 5 the slots in a CTA pair; 0 not
  bool seesaw = false;           // compute warpgroups in the seesaw order
  bool stagger = false;          // ... with staggered maxima
  bool group_fill = false;       // bf16 rows by 8-lane groups
};

SparseKernelPlan plan_sparse_kernel(const SparseKernelShape& shape,
                                    const SparseKernelSwitches& switches);

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
// `forced`: OPENMLA_PREFILL_DEQUANT_ONCE (-1 unset, 0 off, 1 on wherever the workspace fits).
bool prefill_dequantizes_once(const PrefillFromCacheShape& shape, int forced);

}  // namespace openmla::core
