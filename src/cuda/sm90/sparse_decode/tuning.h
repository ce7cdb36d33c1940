// The sparse family's internal entries with SparseTuning (core/sparse_kernel_plan.h): the forms
// and plans the production path would not pick, for the GPU tests of every compiled form and the
// benchmarks' same-run A/Bs. The production entries (openmla::sparse_decode, sparse_prefill,
// dense_decode over a KVCache) never take settings: they launch with the defaults.
#pragma once

#include <cuda_runtime.h>

#include "core/sparse_kernel_plan.h"
#include "openmla/ops.h"

namespace openmla::cuda::sm90 {

// openmla::sparse_decode with `tuning`: validates `args` (core), checks that their device is an
// SM90 GPU and makes it current for the call, then plans and launches as the production entry
// does, with the settings `tuning` forces.
Status sparse_decode_with_tuning(const SparseDecodeArgs& args, const core::SparseTuning& tuning,
                                 cudaStream_t stream = nullptr);

// openmla::sparse_prefill with `tuning`, both forms: bf16 kv, and a paged cache (through sparse
// decode, or each named slot dequantised once where the plan or tuning.dequant_once takes it).
// The FP8 tensor-core path is not served here.
Status sparse_prefill_with_tuning(const SparsePrefillArgs& args, const core::SparseTuning& tuning,
                                  cudaStream_t stream = nullptr);

}  // namespace openmla::cuda::sm90
