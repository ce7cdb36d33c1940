// SM90 dense MLA decode: two TMA producer warps + two wgmma warpgroups in a software-pipelined
// seesaw. Design, numbers and tuning history: NOTES.md. Compile-time choices: traits.h. This file
// holds the kernel and its launch (consume.cuh: the compute warpgroups' loop); the family's own pieces live
// beside it (producer.cuh: TMA refills, Q; epilogue.cuh: a finished request's output, lse and
// split partial; trace.cuh), the shared ones in ../attention/
// (mma.cuh, softmax.cuh, mask.cuh, fragments.cuh: P exchange, output stores; primitives.cuh).
//
// Grid (m_blocks, h_kv, num_sm_parts), 384 threads, one CTA per SM. CTA (m, g, w) serves query
// rows [64 m, 64 m + 64) of kv head g for every request piece of schedule worker w; a request
// piece is the key range [tok_begin, tok_end) walked in pairs of 64-key tiles: WG0 scores the
// even tiles (stage 0), WG1 the odd ones (stage 1), and both multiply every tile's P by their
// half of V (WG0 dims 0-255, WG1 256-511). Per pair k (tiles 2k, 2k+1), with m the running max:
//
//   WG0: P(2k-1) from WG1 -> O_L *= e^(m(2k-2) - m(2k-1)); O_L += P(2k-1) V(2k-1)_L   (issued)
//        S = Q K(2k)^T piece by piece as they land (PV above runs under it; V(2k-1)_L handed
//        back once it is done); m(2k) = max(m, rowmax S); P(2k) -> smem for WG1;
//        O_L *= e^(m(2k-1) - m(2k)); O_L += P(2k) V(2k)_L; V(2k)_L handed back
//   WG1: P(2k) from WG0 -> O_R *= e^(m(2k-1) - m(2k)); O_R += P(2k) V(2k)_R           (issued)
//        S = Q K(2k+1)^T piece by piece (PV above under it; V(2k)_R handed back when done);
//        m(2k+1); P(2k+1) -> smem for WG0; O_R *= ...; O_R += P(2k+1) V(2k+1)_R; handed back
//
// so each tile's PVs run while the next tile's K streams in and is scored, and a stage goes back
// to its producer warp as soon as its last PV is done (v7 held both stages until a pair's four
// PVs were done). Each part of a stage (V left, V right, RoPE) is handed back by its last reader
// and refilled at once by the stage's own producer warp, in the order parts come back. V is the
// first 512 dims of the same keys (read transposed, MN-major). A request with one split writes
// out/lse here; otherwise the split's fp32 partial goes to the workspace for combine.cu, which
// this grid lets launch early.
#pragma once

#include <cuda.h>

#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "cuda/common/smem_opt_in.h"
#include "cuda/sm90/dense_decode/consume.cuh"
#include "cuda/sm90/dense_decode/epilogue.cuh"
#include "cuda/sm90/dense_decode/launch.h"
#include "cuda/sm90/dense_decode/params.h"
#include "cuda/sm90/dense_decode/producer.cuh"
#include "cuda/sm90/dense_decode/trace.cuh"
#include "cuda/sm90/dense_decode/traits.h"

namespace openmla::cuda::sm90 {

template <class Traits>
__global__ void __launch_bounds__(Traits::kNumThreads, 1)
    dense_decode_kernel(const __grid_constant__ DenseDecodeParams params) {
  using namespace dense_decode_detail;
  using Storage = typename Traits::SharedStorage;
  // Aligned to 1024 B by pointer arithmetic on the shared array itself: a round trip through an
  // integer loses the address space, and every smem access became a generic LD/ST (run 3 SASS).
  extern __shared__ __align__(1024) char smem_raw[];
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  Storage& smem =
      *reinterpret_cast<Storage*>(smem_raw + (((smem_base + 1023u) & ~1023u) - smem_base));

  const int thread = threadIdx.x;
  const int wg = __shfl_sync(0xffffffffu, thread / 128, 0);
#if defined(OPENMLA_DENSE_DECODE_TRACE)
  long long trace_start = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(trace_start));
  const long long trace_clock = clock64();
#endif
  if (thread == 0) {
#pragma unroll
    for (int s = 0; s < Traits::kStages; ++s) {
#pragma unroll
      for (int c = 0; c < Traits::kNumPieces; ++c) cutlass::arch::ClusterBarrier::init(&smem.full[s][c], 1);
#pragma unroll
      for (int part = 0; part < Traits::kNumParts; ++part) {
        cutlass::arch::ClusterBarrier::init(&smem.empty[s][part], 4);  // lane 0 of 4 warps
      }
    }
    cutlass::arch::ClusterBarrier::init(&smem.q_full, 1);
    cutlass::arch::fence_barrier_init();
    const int32_t* meta = params.metadata + blockIdx.z * params.metadata_stride_part;
    static_assert(sizeof(smem.range) == sizeof(int) * core::kScheduleRowFields);
#pragma unroll
    for (int f = 0; f < core::kScheduleRowFields; ++f) {
      smem.range[f] = meta[f * params.metadata_stride_field];
    }
    // A caller's schedule is checked for shape only: its requests are kept in [0, batch) (a
    // range past either end walks nothing). Tokens are clamped per request (request_piece), and
    // splits to the workspace's room as they are stored.
    smem.range[kBeginRequest] = max(smem.range[kBeginRequest], 0);
    smem.range[kEndRequest] = min(smem.range[kEndRequest], params.batch - 1);
  }
  __syncthreads();
#if defined(OPENMLA_DENSE_DECODE_TRACE)
  const long long trace_synced = clock64();
#endif
  // The combine grid may launch now; it waits for this grid to finish before reading partials.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");

  if (wg == 2) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    const int producer = thread / 32 - 8;  // warps 8, 9: stage 0; warps 10, 11: stage 1
    if (thread % 32 == 0) {
      cute::prefetch_tma_descriptor(&params.tma_k);
      // Two walks, so each holds only its own page arithmetic in the producers' 40 registers.
      if (params.page_size >= Traits::kBlockN) {
        produce<Traits, false>(params, smem, blockIdx.y, producer / kIssuersPerStage,
                               producer % kIssuersPerStage);
      } else {
        produce<Traits, true>(params, smem, blockIdx.y, producer / kIssuersPerStage,
                              producer % kIssuersPerStage);
      }
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kMmaRegisters>();
    const int pairs = consume<Traits>(params, smem, wg, thread, blockIdx.x, blockIdx.y);
#if defined(OPENMLA_DENSE_DECODE_TRACE)
    const int cta = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    if (params.trace != nullptr && thread == 0 && cta < kTraceMaxCtas) {
      long long end = 0;
      unsigned sm = 0;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(end));
      asm("mov.u32 %0, %%smid;" : "=r"(sm));
      long long* span = params.trace + (3ll * params.trace_pairs * kTraceEvents) + 6ll * cta;
      span[0] = trace_start;
      span[1] = end;
      span[2] = trace_clock;
      span[3] = clock64();
      span[4] = sm;
      span[5] = pairs;
      if (cta == 0) {  // CTA 0's entry and the end of its setup, as the producers' request 0 row
        long long* req = params.trace + 3ll * params.trace_pairs * kTraceEvents +
                         6ll * kTraceMaxCtas + (2 * kTraceRequests) * kTraceRequestEvents;
        req[6] = trace_clock;
        req[7] = trace_synced;
      }
    }
#else
    (void)pairs;
#endif
  }
}

}  // namespace openmla::cuda::sm90

// ---------------------------------------------------------------------------------------------
// The launch of one instantiation (instantiations/*.cu instantiate it for one Element x d_qk).
namespace openmla::cuda::sm90 {

template <typename Element, int kHeadDimQK>
cudaError_t launch_dense_decode_kernel(const DenseDecodeParams& params, int num_m_blocks,
                                       int h_kv, int num_sm_parts, cudaStream_t stream) {
  using Traits = DenseDecodeTraits<Element, kHeadDimQK>;
  auto kernel = dense_decode_kernel<Traits>;
  if (const cudaError_t err = allow_dynamic_smem(kernel, Traits::kSmemBytes); err != cudaSuccess) {
    return err;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(num_m_blocks, h_kv, num_sm_parts);
  config.blockDim = dim3(Traits::kNumThreads);
  config.dynamicSmemBytes = Traits::kSmemBytes;
  config.stream = stream;
  return cudaLaunchKernelEx(&config, kernel, params);
}

}  // namespace openmla::cuda::sm90
