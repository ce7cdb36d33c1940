// Diagnostic settings of the SM90 dense decode launch, for the benchmarks' same-run A/Bs and the
// GPU tests of the kernel's other paths (Q by the compute threads, 4-byte output stores, the
// staged combine). The production entry (launch.h dense_decode, behind openmla::dense_decode)
// never reads these: it launches with the defaults, fixed at compile time. Some settings leave
// outputs unwritten (output_stores 0, skip_combine): only a benchmark's timing may use them.
#pragma once

#include <cuda_runtime.h>

#include "cuda/sm90/dense_decode/launch.h"
#include "openmla/ops.h"

namespace openmla::cuda::sm90 {

// The kernel's launch settings. The defaults are the measured best (NOTES.md) and are what the
// production launch (launch.h dense_decode) always uses; anything else is for measurement.
struct DenseDecodeTuning {
  // KV loads' L2 hint: 1 evict-first, 0 normal, -1 by m-blocks and request length: evict-first
  // where several m-blocks read each tile (session 11: h_q 128 L 1024 -5.5%, longer -0.5-0.8%);
  // with one, evict-first for requests shorter than evict_normal_from keys and normal for the
  // others (same-run A/B, NOTES.md, idea 20).
  int evict_first = -1;
  int evict_normal_from = 2048;
  // Diagnostics: nonzero replaces both KV hints above by this L2 policy (an opaque createpolicy
  // value; bench/l2_state.cuh makes them, the benchmark's knob kv_policy picks one).
  unsigned long long kv_cache_hint = 0;
  // The cache map's L2 promotion in bytes: 0 (none), 64, 128, 256; -1: 128 where one m-block
  // reads each tile (memory-bound: 1-3% faster), 256 where several do (2% faster at s_q 2,
  // h_q 128), as the sweep measured (NOTES.md, idea 15).
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
  // device buffer: 3 x trace_pairs x 16 clock64 stamps of CTA 0, then kTraceMaxCtas x 6 CTA spans,
  // then 3 x kTraceRequests x kTraceRequestEvents request stamps of CTA 0 (params.h)
  long long* trace = nullptr;
  int trace_pairs = 0;
};

// dense_decode with `tuning` instead of the production settings: validates `args` (core), checks
// that their device is an SM90 GPU and makes it current for the call, then plans and launches
// exactly as the production entry does. For bench/ and tests/gpu only.
Status dense_decode_with_tuning(const DenseDecodeArgs& args, const DenseDecodeTuning& tuning,
                                cudaStream_t stream = nullptr);

}  // namespace openmla::cuda::sm90
