// Host side of the SM90 dense MHA prefill forward: what cuda::mha_prefill calls (launch.cu), and
// the per-instantiation launches it picks from (instantiations/*.cu, kernel.cuh).
#pragma once

#include <cuda_runtime.h>

#include "core/validate_mha.h"
#include "cuda/sm90/mha_prefill/params.h"
#include "openmla/ops.h"

namespace openmla::cuda::sm90 {

// Validated arguments on an SM90 device that is current: checks what the kernel's loads need
// (16-byte aligned strides and bases of q, k, v, out), encodes the TMA maps and launches on
// `stream`. Every failure names the argument.
Status mha_prefill_forward(const MhaPrefillArgs& args, const core::MhaPrefillShape& shape,
                           cudaStream_t stream);

// One instantiation's launch: grid (m_blocks, h_q, batch). Element is cute::bfloat16_t or
// cute::half_t; kHeadDimQK 128 or 192 (d_v 128).
template <typename Element, int kHeadDimQK>
cudaError_t launch_mha_fwd_kernel(const MhaFwdParams& params, int m_blocks, int h_q, int batch,
                                  cudaStream_t stream);

}  // namespace openmla::cuda::sm90
