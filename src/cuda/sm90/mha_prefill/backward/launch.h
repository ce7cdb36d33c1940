// Host side of SM90 dense MHA prefill backward (NOTES.md): the workspace it needs and the launch
// of its three kernels (preprocess: D and the zeroed dQ accumulator; main; postprocess: dq).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/validate_mha.h"
#include "cuda/sm90/mha_prefill/backward/params.h"
#include "openmla/ops.h"
#include "openmla/status.h"

namespace openmla::cuda::sm90 {

// Bytes of workspace a call needs: dQ in fp32 [h_q, total_q, d_qk] and D [h_q, total_q], each
// region 256 B aligned.
size_t mha_prefill_backward_workspace_size(int64_t total_q, int64_t h_q, int64_t d_qk);

// Validated arguments (core::validate_mha_prefill_backward) on an SM90 device.
Status mha_prefill_backward(const MhaPrefillBackwardArgs& args,
                            const core::MhaPrefillShape& shape, cudaStream_t stream);

namespace mha_bwd {

// One instantiation per (element, d_qk) in instantiations/: the main kernel over a grid of
// (key blocks, h_kv, batch).
template <class Element, int kDqk>
cudaError_t launch_main(const MhaBwdParams& p, cudaStream_t stream);

// prepost.cu: D = rowsum(dout * out) into the workspace; dq = scale * dQ accumulator.
template <class Element>
cudaError_t launch_preprocess(const MhaBwdParams& p, cudaStream_t stream);
template <class Element>
cudaError_t launch_postprocess(const MhaBwdParams& p, int d_qk, cudaStream_t stream);

}  // namespace mha_bwd
}  // namespace openmla::cuda::sm90
