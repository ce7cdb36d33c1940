// Host side of the SM90 dense decode family: what cuda::dense_decode and
// cuda::dense_decode_workspace_size call (src/cuda/backend.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "core/validate.h"
#include "openmla/ops.h"

namespace openmla::cuda::sm90 {

constexpr int kTraceMaxCtas = 4096;  // CTAs whose spans a trace records (DenseDecodeParams::trace)
constexpr int kTraceRequests = 8;    // requests of CTA 0 whose boundaries a trace records
constexpr int kTraceRequestEvents = 8;

// Validated arguments in, kernels out: plans the split-KV schedule into the workspace when
// args.schedule is empty, then launches the decode kernel and (PDL) the combine. Returns
// InvalidArgument / NotImplemented naming what it cannot serve (k_cache strides not multiples of
// 16 bytes, q strides not multiples of 8 elements, an unsupported page size, a short workspace).
Status dense_decode(const DenseDecodeArgs& args, const core::DenseDecodeShape& shape,
                    cudaStream_t stream);

// Bytes of workspace dense_decode needs on device `device_index`: a schedule (when the caller
// passes none) and fp32 partials for batch + num_sm_parts splits.
size_t dense_decode_workspace_size(int device_index, int batch, int s_q, int h_q, int h_kv,
                                   int d_v);

// The same for a given number of schedule workers (a caller-made schedule may use any number).
size_t dense_decode_workspace_bytes(int batch, int s_q, int h_q, int h_kv, int d_v,
                                    int num_sm_parts);

// Process-wide knobs of the kernel, read at each launch (benchmarks sweep them; defaults are the
// measured best, NOTES.md).
struct DenseDecodeTuning {
  // KV loads' L2 hint: 1 evict-first, 0 normal, -1 by m-blocks and request length: evict-first
  // where several m-blocks read each tile (session 11: h_q 128 L 1024 -5.5%, longer -0.5-0.8%);
  // with one, evict-first for requests shorter than evict_normal_from keys and normal for the
  // others (same-run A/B, NOTES.md session 6).
  int evict_first = -1;
  int evict_normal_from = 2048;
  // Diagnostics: nonzero replaces both KV hints above by this L2 policy (an opaque createpolicy
  // value; bench/l2_state.cuh makes them, the benchmark's knob kv_policy picks one).
  unsigned long long kv_cache_hint = 0;
  // The cache map's L2 promotion in bytes: 0 (none), 64, 128, 256; -1: 128 where one m-block
  // reads each tile (memory-bound: 1-3% faster), 256 where several do (2% faster at s_q 2,
  // h_q 128), as the sweep measured (NOTES.md v10).
  int l2_promotion = -1;
  // Q by TMA (one thread, issued for the next request during the current one's epilogue) where
  // the head group divides 64 or 64 divides it (1), or always by the compute threads' loads (0).
  int q_tma = 1;
  // Output of unsplit requests by 16-byte stores where out's data and strides allow (2), by 4-byte
  // stores (1), or not written at all (0: timing diagnostics only, the output is garbage).
  int output_stores = 2;
  // Compute warps issuing Q's TMA boxes (1-8): one thread streams only ~32 GB/s into an SM.
  int q_issuers = 8;
  // Output of unsplit requests staged in Q's shared memory (stmatrix) and stored by TMA (1),
  // where Q comes by TMA and out's data and strides allow a tensor map; the next request's Q then
  // loads once the stores have read the buffer. 0: the register stores (output_stores). Same
  // binary, session 16: 1,128,1024 74.0 -> 72.5 µs, others -0.5 to +0.3% (NOTES.md).
  int out_tma = 1;
  // 1: the next request's Q prefetched into L2 (TMA prefetch) at a request's start. Measured
  // 0.2-0.8% slower with out_tma (session 16); kept for A/Bs.
  int q_prefetch = 0;
  // Diagnostics only (the benchmark's "main kernel alone" time): launch no combine, so split
  // requests' outputs are left unwritten.
  int skip_combine = 0;
  // Diagnostics only: 0 launches the combine without programmatic dependent launch (it starts
  // once the decode kernel has ended), so its own time shows apart from its wait for the decode.
  int combine_pdl = 1;
  // 1: each combine warp stages 8 (one slot a lane) or 2 (eight slots) splits at a time in
  // shared memory by cp.async, all in flight together (session 14); 0: one split's loads at a
  // time. Same-run A/B (session 16): -3.5 to +2.2 µs by shape, no clear win, so 0 stays.
  int combine_batched = 0;
  // device buffer: 3 x trace_pairs x 16 clock64 stamps of CTA 0, then kTraceMaxCtas x 6 CTA spans,
  // then 3 x kTraceRequests x kTraceRequestEvents request stamps of CTA 0 (params.h)
  long long* trace = nullptr;
  int trace_pairs = 0;
};
DenseDecodeTuning& dense_decode_tuning();

// Explicit instantiations (instantiations/*.cu): one kernel per element type x d_qk.
struct DenseDecodeParams;
template <typename Element, int kHeadDimQK>
cudaError_t launch_dense_decode_kernel(const DenseDecodeParams& params, int num_m_blocks,
                                       int h_kv, int num_sm_parts, cudaStream_t stream);

}  // namespace openmla::cuda::sm90
