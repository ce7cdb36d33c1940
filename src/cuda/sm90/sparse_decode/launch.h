// Host side of SM90 sparse decode (docs/semantics.md): what cuda::sparse_decode and its workspace
// size call (src/cuda/backend.cc). The kernel is the sparse attention family's
// (src/cuda/sm90/sparse_attention) with one query token a problem.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "core/validate.h"
#include "cuda/sm90/sparse_attention/launch.h"
#include "openmla/ops.h"

namespace openmla::cuda::sm90 {

// Validated arguments in, kernels out: the number of splits comes from the shapes alone (so a
// captured CUDA graph replays the same plan, and a request's result depends on the batch only
// through that count); the decode kernel and, with more than one split, the combine.
Status sparse_decode(const SparseDecodeArgs& args, const core::SparseDecodeShape& shape,
                     cudaStream_t stream, const SparseTuning& tuning = {});

// Bytes of workspace sparse_decode needs on device `device_index` (fp32 split partials).
size_t sparse_decode_workspace_size(int device_index, int batch, int s_q, int h_q, int d_v);

// sparse_decode with `tuning` instead of the production settings: validates `args` (core),
// checks that their device is an SM90 GPU and makes it current, then launches exactly as the
// production entry does. For bench/ and tests/gpu only.
Status sparse_decode_with_tuning(const SparseDecodeArgs& args, const SparseTuning& tuning,
                                 cudaStream_t stream = nullptr);

}  // namespace openmla::cuda::sm90
