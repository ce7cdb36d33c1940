// Host side of the SM90 sparse attention family, shared by its three entries (sparse_decode/,
// sparse_prefill/, dense_decode_kv_cache/): the checks the kernel adds to core validation, a
// cache's descriptor, the split plan and workspace, the form, and the launches of the kernel and
// the combine.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "openmla/ops.h"

namespace openmla::cuda::sm90 {

struct SparseAttentionParams;
struct SparseCacheParams;

// A/B settings of a launch, for the benchmarks' same-run comparisons and the GPU tests of every
// form. The production entries never read these: they launch with the defaults below, which are
// the form table (core/sparse_kernel_plan.h) and the split plan.
struct SparseTuning {
  int cluster = -1;             // -1 the form table; 0 no cluster; 1 a cluster wherever one fits
                                // (every cache quantised, an even count of m-blocks)
  int seesaw = -1;              // -1 the form table; 0 the standard order for bf16 tiles too
  int split_overhead_tiles = 1; // a CTA's fixed cost in the split plan's model, in tiles
  int tiles_per_split = 0;      // > 0: splits of this many tiles (sparse mode), in place of
                                // the plan (never more splits than the workspace holds)
  bool l2_prefetch = true;      // the producer prefetches the next tile's records into L2
};

// q 16-byte rows and out bf16 pairs (NotImplemented naming the argument otherwise).
Status check_q_out(const char* op, const TensorView& q, const TensorView& out);
// q [b, s_q, h_q, d], out [b, s_q, h_q, 512] and lse [b, h_q, s_q]: pointers and strides.
void set_q_out_lse(const TensorView& q, const TensorView& out, const TensorView& lse,
                   SparseAttentionParams* p);
// A cache's descriptor for the producer; NotImplemented for formats the kernel does not read.
Status sparse_cache_params(const char* op, const KVCache& cache, const char* arg,
                           SparseCacheParams* c);
// Workspace for `tokens` query tokens of h_q heads when the grid has `ctas` CTAs unsplit.
size_t sparse_workspace_bytes(int device_index, int64_t tokens, int64_t ctas, int h_q);
// Plans the splits of `p` (q/out/lse, caches, indices, tokens, h_q and scales filled), lays out
// the partials in `workspace`, picks the form, launches the kernel and, split, the combine.
// batch_invariant: one split a problem, its keys in list order. prefill: sparse prefill's kv.
Status launch_sparse_attention(SparseAttentionParams& p, int d_qk, int64_t max_tiles,
                               const Workspace& workspace, int device_index, cudaStream_t stream,
                               const char* op, bool batch_invariant, bool prefill,
                               const SparseTuning& tuning);

// The combine of split partials (combine.cu), launched with programmatic dependent launch.
cudaError_t launch_sparse_combine(const SparseAttentionParams& params, cudaStream_t stream);

}  // namespace openmla::cuda::sm90
