// The SM90 sparse attention kernel: the skeleton (shared memory, barriers, register split, role
// dispatch) of sparse decode, sparse prefill and dense decode over a quantised cache. Design,
// shared-memory map and barrier protocol: NOTES.md; compile-time choices: traits.h.
//
// Grid (m_blocks, num_splits, problems), 384 threads, one CTA per SM; with kCluster 2 the CTAs
// of m-blocks 2c and 2c + 1 are a cluster. CTA (m, s, q) serves rows [64 m, 64 m + 64) of
// problem q over split s of its key list (problem.cuh). Roles:
//   WG2: the producer, fills a stage with a tile's 64 keys as bf16 (fill_quantized.cuh; the
//        seesaw's half stages: fill_bf16.cuh fill_halves)
//   WG0, WG1: the compute warpgroups, in the standard order (order_standard.cuh) or the seesaw
//        (order_seesaw.cuh); both end in epilogue.cuh.
#pragma once

#include <cuda.h>

#include <cstdint>

#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "cuda/common/smem_opt_in.h"
#include "cuda/sm90/sparse_attention/cluster.cuh"
#include "cuda/sm90/sparse_attention/fill_bf16.cuh"
#include "cuda/sm90/sparse_attention/fill_quantized.cuh"
#include "cuda/sm90/sparse_attention/order_seesaw.cuh"
#include "cuda/sm90/sparse_attention/order_standard.cuh"
#include "cuda/sm90/sparse_attention/params.h"
#include "cuda/sm90/sparse_attention/traits.h"

namespace openmla::cuda::sm90 {
namespace sparse {

// Barrier arrival counts. The standard order: full, the producer's 4 warps (+1 in a cluster:
// the arrival that expects the peer's bytes); empty, the 8 compute warps (of both CTAs in a
// cluster). The seesaw, per half stage: full, the 4 producer warps; empty, L0 by WG0's 4 warps,
// R1 by WG1's, R0 and L1 by all 8.
template <class Traits>
__device__ __forceinline__ void init_barriers(typename Traits::SharedStorage& smem) {
  using Barrier = cutlass::arch::ClusterBarrier;
  if constexpr (Traits::kSeesaw) {
#pragma unroll
    for (int s = 0; s < Traits::kStages; ++s) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        Barrier::init(&smem.full[2 * s + half], 4);
        Barrier::init(&smem.empty[2 * s + half], half == s ? 4 : 8);
      }
    }
  } else {
#pragma unroll
    for (int s = 0; s < Traits::kStages; ++s) {
      Barrier::init(&smem.full[s], Traits::kCluster == 2 ? 5 : 4);
      Barrier::init(&smem.empty[s], 8 * Traits::kCluster);
    }
  }
  cutlass::arch::fence_barrier_init();
}

template <class Traits>
__global__ void __launch_bounds__(Traits::kNumThreads, 1)
    sparse_attention_kernel(const __grid_constant__ SparseAttentionParams params) {
  using Storage = typename Traits::SharedStorage;
  extern __shared__ __align__(1024) char smem_raw[];
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  Storage& smem =
      *reinterpret_cast<Storage*>(smem_raw + (((smem_base + 1023u) & ~1023u) - smem_base));
  const int m_block = blockIdx.x, split = blockIdx.y, problem = params.problem0 + blockIdx.z;
  if (threadIdx.x == 0) init_barriers<Traits>(smem);
  if constexpr (Traits::kCluster == 2) {
    cluster_sync();  // the peer's barriers exist before anything arrives on them
  } else {
    __syncthreads();
  }
  // The combine grid may launch now; it waits for this grid to finish before reading partials.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);
  if (wg == 2) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    if constexpr (Traits::kSeesaw) {
      fill_halves<Traits>(params, smem, problem, split);
    } else {
      fill_quantized<Traits>(params, smem, problem, split);
    }
  } else if (wg == 1) {
    cutlass::arch::warpgroup_reg_alloc<Traits::kWg1Registers>();
    if constexpr (Traits::kSeesaw) {
      consume_seesaw<Traits>(params, smem, 1, m_block, split, problem);
    } else {
      consume_standard<Traits>(params, smem, 1, m_block, split, problem);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kWg0Registers>();
    if constexpr (Traits::kSeesaw) {
      consume_seesaw<Traits>(params, smem, 0, m_block, split, problem);
    } else {
      consume_standard<Traits>(params, smem, 0, m_block, split, problem);
    }
  }
  // A cluster's peer may store into this CTA's stages or arrive on its barriers until here.
  if constexpr (Traits::kCluster == 2) cluster_sync();
}

}  // namespace sparse

// One launch of the kernel form `Traits` (problems [problem0, problem0 + 65535) of the grid).
template <class Traits>
cudaError_t launch_sparse_traits(const SparseAttentionParams& params, cudaStream_t stream) {
  auto kernel = sparse::sparse_attention_kernel<Traits>;
  if (const cudaError_t err = allow_dynamic_smem(kernel, Traits::kSmemBytes); err != cudaSuccess) {
    return err;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(params.m_blocks, params.num_splits,
                       min(params.problems - params.problem0, 65535));
  config.blockDim = dim3(Traits::kNumThreads);
  config.dynamicSmemBytes = Traits::kSmemBytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  if constexpr (Traits::kCluster == 2) {
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = 2;
    attribute[0].val.clusterDim.y = 1;
    attribute[0].val.clusterDim.z = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&config, kernel, params);
}

}  // namespace openmla::cuda::sm90
