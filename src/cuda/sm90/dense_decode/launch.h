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
// args.schedule is empty, then launches the decode kernel and (PDL) the combine, with the
// measured-best settings (the defaults of tuning.h's DenseDecodeTuning, fixed). Returns
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

// Explicit instantiations (instantiations/*.cu): one kernel per element type x d_qk.
struct DenseDecodeParams;
template <typename Element, int kHeadDimQK>
cudaError_t launch_dense_decode_kernel(const DenseDecodeParams& params, int num_m_blocks,
                                       int h_kv, int num_sm_parts, cudaStream_t stream);

}  // namespace openmla::cuda::sm90
