// Host side of the SM90 sparse decode family: what cuda::sparse_decode and
// cuda::sparse_decode_workspace_size call (src/cuda/backend.cc).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "core/sparse_kernel_plan.h"
#include "core/validate.h"
#include "openmla/ops.h"

namespace openmla::cuda::sm90 {

// Validated arguments in, kernels out: picks the number of splits from the shapes alone (so a
// captured CUDA graph replays the same plan, and a request's result depends on the batch only
// through that count), launches the decode kernel and, with more than one split, the combine.
// Returns InvalidArgument / NotImplemented naming what it cannot serve. `tuning`: the defaults
// in production (tests and benchmarks reach others through tuning.h).
Status sparse_decode(const SparseDecodeArgs& args, const core::SparseDecodeShape& shape,
                     cudaStream_t stream, const core::SparseTuning& tuning = {});

// Bytes of workspace sparse_decode needs on device `device_index` (fp32 split partials).
size_t sparse_decode_workspace_size(int device_index, int batch, int s_q, int h_q, int d_v);

// --- shared with sparse prefill (src/cuda/sm90/sparse_prefill), which runs this kernel with one
// query token per problem ---
struct SparseDecodeParams;
struct SparseCacheParams;
// q 16-byte rows and out bf16 pairs (NotImplemented naming the argument otherwise).
Status check_q_out(const char* op, const TensorView& q, const TensorView& out);
// q [b, s_q, h_q, d], out [b, s_q, h_q, 512] and lse [b, h_q, s_q]: pointers and strides.
void set_q_out_lse(const TensorView& q, const TensorView& out, const TensorView& lse,
                   SparseDecodeParams* p);
// A cache's descriptor for the producer; NotImplemented for formats the kernel does not read.
Status sparse_cache_params(const KVCache& cache, const char* arg, SparseCacheParams* c,
                           const core::SparseTuning& tuning = {});
// Key list c of `p` (0: the main cache, 1: the extra one): its indices (`stride_b` between
// requests, `stride_s` between a request's tokens, `stride_k` between entries), its optional
// lengths [b] and topk.
void set_key_list(SparseDecodeParams* p, int c, const int32_t* indices, int64_t stride_b,
                  int64_t stride_s, int64_t stride_k, const TensorView& lengths, int64_t topk);
// Workspace for `problems` problems of s_pack query tokens x h_q heads whose grid has at least
// `ctas` CTAs unsplit (the bound on their splits).
size_t sparse_workspace_bytes(int device_index, int64_t problems, int64_t s_pack, int64_t ctas,
                              int h_q);
// Plans the splits of `p` (q/out/lse, caches, indices, tokens, h_q and scales filled), lays out
// the partials in `workspace`, launches the kernel and the combine. `prefill` (sparse prefill's
// bf16 kv) picks the staggered compute orders, measured faster there (sparse_decode/NOTES.md).
Status launch_sparse_attention(SparseDecodeParams& p, int d_qk, int64_t max_tiles,
                               const Workspace& workspace, int device_index, cudaStream_t stream,
                               const char* op, bool batch_invariant = false,
                               bool prefill = false, const core::SparseTuning& tuning = {});

template <int kHeadDimQK, bool kDense>
cudaError_t launch_sparse_decode_kernel(const SparseDecodeParams& params, cudaStream_t stream);

}  // namespace openmla::cuda::sm90
