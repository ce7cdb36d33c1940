// Host side of the SM90 sparse decode family: what cuda::sparse_decode and
// cuda::sparse_decode_workspace_size call (src/cuda/backend.cc).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "core/validate.h"
#include "openmla/ops.h"

namespace openmla::cuda::sm90 {

// Validated arguments in, kernels out: picks the number of splits from the shapes alone (so a
// captured CUDA graph replays the same plan, and a request's result depends on the batch only
// through that count), launches the decode kernel and, with more than one split, the combine.
// Returns InvalidArgument / NotImplemented naming what it cannot serve.
Status sparse_decode(const SparseDecodeArgs& args, const core::SparseDecodeShape& shape,
                     cudaStream_t stream);

// Bytes of workspace sparse_decode needs on device `device_index` (fp32 split partials).
size_t sparse_decode_workspace_size(int device_index, int batch, int s_q, int h_q, int d_v);

struct SparseDecodeParams;
template <int kHeadDimQK>
cudaError_t launch_sparse_decode_kernel(const SparseDecodeParams& params, cudaStream_t stream);
cudaError_t launch_sparse_decode_combine(const SparseDecodeParams& params, cudaStream_t stream);

}  // namespace openmla::cuda::sm90
