// Host side of SM90 dense decode over a paged cache of any format (DenseDecodeArgs::kv_cache):
// what cuda::dense_decode calls when the keys come from a KVCache. It runs the sparse decode
// kernel family (src/cuda/sm90/sparse_decode) in its dense mode: a request's keys are its first
// L cache positions through its block table, its s_q query tokens packed into the MMA rows, each
// tile gathered and dequantised once for all of them. NOTES.md beside this.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "core/validate.h"
#include "openmla/ops.h"

namespace openmla::cuda::sm90 {

Status dense_decode_kv_cache(const DenseDecodeArgs& args, const core::DenseDecodeShape& shape,
                             cudaStream_t stream);
// Bytes of workspace the kv_cache path needs (fp32 split partials); 0 where it needs none.
size_t dense_decode_kv_cache_workspace_size(int device_index, int batch, int s_q, int h_q);

}  // namespace openmla::cuda::sm90
