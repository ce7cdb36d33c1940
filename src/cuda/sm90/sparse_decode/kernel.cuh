// SM90 sparse MLA decode: a gathering, dequantising producer warpgroup and two wgmma warpgroups.
// Design and numbers: NOTES.md; compile-time choices: traits.h; the producer: fills.cuh.
//
// Grid (m_blocks, num_splits, problems), 384 threads, one CTA per SM. A problem is one query
// token and its index list (sparse mode), or one request's s_q tokens and its first L cache
// positions through the block table (dense mode, dense decode over a KVCache: params.h). CTA
// (m, s, q) serves rows [64 m, 64 m + 64) of problem q (heads; in dense mode token-major
// (j, h) pairs) over split s of its key list. Per tile k (stage k % 2):
//   WG2: gathers and dequantises the tile's 64 keys into the stage (fills.cuh: the token fill
//        of quantised caches, bf16 keys by cp.async, or the warp-per-key fill)
//   WG0: S = Q K^T (the PV of tile k-1 completes under it), keys the mask drops -> -inf, the
//        running max, P = exp(S - m) to registers and to shared memory with O's row factors;
//        O_L *= factor; O_L += P V_L (issued, completed under the next QK^T)
//   WG1: P and the factors from shared memory; O_R *= factor; O_R += P V_R
// A stage goes back to the producer once both warpgroups' wgmmas on it are done. With a CTA pair
// (h_q 128 and other even m-block counts over quantised caches: pair.cuh) each CTA's producer
// decodes half of every tile into both CTAs' stages. bf16 tiles (bf16 caches, sparse prefill's
// kv) may run the seesaw order instead (traits.h kSeesaw; consume below): each compute
// warpgroup computes S for alternate tiles and both tiles' P V for its half of d_v (staggered
// maxima with kStagger). A split that is the problem's only one writes out (bf16, attention sink
// applied) and lse; otherwise its normalised fp32 partial and lse go to the workspace for the
// combine kernel (launch.cu).
#pragma once

#include <cuda.h>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include <cstdint>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include "cuda/common/smem_opt_in.h"
#include "cuda/sm90/attention/fragments.cuh"
#include "cuda/sm90/attention/mma.cuh"
#include "cuda/sm90/attention/primitives.cuh"
#include "cuda/sm90/attention/softmax.cuh"
#include "cuda/sm90/sparse_decode/consume.cuh"
#include "cuda/sm90/sparse_decode/params.h"
#include "cuda/sm90/sparse_decode/traits.h"

namespace openmla::cuda::sm90 {

// The token fill of one format, its rounds streamed where params.stream (fills.cuh).
template <class Traits, bool kPair, int kCodec>
__device__ __forceinline__ void produce_codec(const SparseDecodeParams& p,
                                              typename Traits::SharedStorage& smem, int problem,
                                              int split) {
  using namespace sparse_decode_detail;
  // 1: streamed, each round's loop the fast decode alone where its scales allow
  if (p.stream == 1) return produce_by_token_stream<Traits, kPair, kCodec>(p, smem, problem, split);
  produce_by_token<Traits, kPair, kCodec>(p, smem, problem, split);
}

// The token fill built for the grid's one quantised format (params.fill_codec), or reading the
// format at run time (-1: the caches differ, or SparseTuning::generic_fill; never paired).
template <class Traits, bool kPair>
__device__ __forceinline__ void produce_quantised(const SparseDecodeParams& p,
                                                  typename Traits::SharedStorage& smem, int problem,
                                                  int split) {
  using namespace sparse_decode_detail;
  using kvcodec::Codec;
  constexpr int kV32 = static_cast<int>(Codec::kFP8_V32),
                kModel1 = static_cast<int>(Codec::kFP8_Model1);
  constexpr int kMX = static_cast<int>(Codec::kFP8_MX), kFP4 = static_cast<int>(Codec::kFP4);
  if constexpr (Traits::kHeadDimQK == 576) {
    if (p.fill_codec == kV32) return produce_codec<Traits, kPair, kV32>(p, smem, problem, split);
  } else {
    if (p.fill_codec == kModel1) {
      return produce_codec<Traits, kPair, kModel1>(p, smem, problem, split);
    }
    if (p.fill_codec == kMX) return produce_codec<Traits, kPair, kMX>(p, smem, problem, split);
    if (p.fill_codec == kFP4) return produce_codec<Traits, kPair, kFP4>(p, smem, problem, split);
  }
  if constexpr (!kPair) produce_by_token<Traits, false, -1>(p, smem, problem, split);
}

// The ring fill of the grid's one quantised format (launch.cu runs the ring kernel only with a
// fill built for one format).
template <class Traits>
__device__ __forceinline__ void produce_ring(const SparseDecodeParams& p,
                                             typename Traits::SharedStorage& smem, int problem,
                                             int split) {
  using namespace sparse_decode_detail;
  using kvcodec::Codec;
  constexpr int kV32 = static_cast<int>(Codec::kFP8_V32),
                kModel1 = static_cast<int>(Codec::kFP8_Model1);
  constexpr int kMX = static_cast<int>(Codec::kFP8_MX), kFP4 = static_cast<int>(Codec::kFP4);
  if constexpr (Traits::kHeadDimQK == 576) {
    if (p.fill_codec == kV32) return produce_by_ring<Traits, kV32>(p, smem, problem, split);
  } else {
    if (p.fill_codec == kModel1) return produce_by_ring<Traits, kModel1>(p, smem, problem, split);
    if (p.fill_codec == kMX) return produce_by_ring<Traits, kMX>(p, smem, problem, split);
    if constexpr (!Traits::kFp16) {  // (fp4 never stages fp16: SM90 has no e2m1 conversion)
      if (p.fill_codec == kFP4) return produce_by_ring<Traits, kFP4>(p, smem, problem, split);
    }
  }
  __trap();  // (never: the host checks the format) a clear error rather than a hang
}

template <class Traits>
__global__ void __launch_bounds__(Traits::kNumThreads, 1)
    sparse_decode_kernel(const __grid_constant__ SparseDecodeParams params) {
  using namespace sparse_decode_detail;
  using Storage = typename Traits::SharedStorage;
  extern __shared__ __align__(1024) char smem_raw[];
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  Storage& smem =
      *reinterpret_cast<Storage*>(smem_raw + (((smem_base + 1023u) & ~1023u) - smem_base));
  const int m_block = blockIdx.x, split = blockIdx.y, problem = params.problem0 + blockIdx.z;
  const bool pair = params.pair;  // a 2-CTA cluster sharing each tile's decoding (pair.cuh)
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < Traits::kStages; ++s) {
      if constexpr (Traits::kSeesaw) {
        // Per part (kParts s + part; a half's parts alike): filled by the 4 producer warps; L0
        // is freed by WG0's warps alone, R1 by WG1's, R0 and L1 by both (consume, the seesaw).
        constexpr int kPerHalf = Traits::kParts / 2;
#pragma unroll
        for (int part = 0; part < Traits::kParts; ++part) {
          cutlass::arch::ClusterBarrier::init(&smem.full[Traits::kParts * s + part], 4);
          cutlass::arch::ClusterBarrier::init(&smem.empty[Traits::kParts * s + part],
                                              part / kPerHalf == s ? 4 : 8);
        }
      } else if constexpr (Traits::kRing) {
        // per round of the one stage: the 4 producer warps; the 8 compute warps
#pragma unroll
        for (int r = 0; r < Traits::kBarriers; ++r) {  // (the round slots: per slot)
          cutlass::arch::ClusterBarrier::init(&smem.full[r], 4);
          cutlass::arch::ClusterBarrier::init(&smem.empty[r], 8);
        }
      } else {
        // lane 0 of the 4 producer warps and of the 8 compute warps (of both CTAs of a pair)
        cutlass::arch::ClusterBarrier::init(&smem.full[s], 4);  // (a pair's peer: bytes, pair.cuh)
        cutlass::arch::ClusterBarrier::init(&smem.empty[s], pair ? 16 : 8);
      }
    }
    cutlass::arch::fence_barrier_init();
  }
  if (pair) {
    cluster_sync();  // the peer's barriers exist before anything arrives on them
  } else {
    __syncthreads();
  }
  // The combine grid may launch now; it waits for this grid to finish before reading partials.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);
  if (wg >= 2) {  // the producer warpgroup
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    if constexpr (Traits::kRing) {
      produce_ring<Traits>(params, smem, problem, split);
    } else if constexpr (Traits::kSeesaw) {
      produce_halves<Traits>(params, smem, problem, split);
    } else if (pair) {
      produce_quantised<Traits, true>(params, smem, problem, split);
    } else if (params.by_token) {
      produce_quantised<Traits, false>(params, smem, problem, split);
    } else {
      produce<Traits>(params, smem, problem, split);
    }
  } else if (wg == 1) {
    cutlass::arch::warpgroup_reg_alloc<Traits::kWg1Registers>();
    consume<Traits>(params, smem, 1, m_block, split, problem);
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kWg0Registers>();
    consume<Traits>(params, smem, 0, m_block, split, problem);
  }
  if (pair) cluster_sync();  // the peer may still arrive on this CTA's barriers until here
}

template <class Traits>
cudaError_t launch_sparse_decode_traits(const SparseDecodeParams& params, cudaStream_t stream) {
  auto kernel = sparse_decode_kernel<Traits>;
  if (const cudaError_t err = allow_dynamic_smem(kernel, Traits::kSmemBytes); err != cudaSuccess) {
    return err;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim =
      dim3(params.m_blocks, params.num_splits, min(params.problems - params.problem0, 65535));
  config.blockDim = dim3(Traits::kNumThreads);
  config.dynamicSmemBytes = Traits::kSmemBytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  if (params.pair) {  // m-blocks 2c and 2c + 1 as one cluster (pair.cuh)
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = 2;
    attribute[0].val.clusterDim.y = 1;
    attribute[0].val.clusterDim.z = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&config, kernel, params);
}

// The ring fill's kernel (params.ring; its own instantiations, instantiations/ring_*.cu).
template <int kHeadDimQK, bool kDense>
cudaError_t launch_sparse_decode_ring(const SparseDecodeParams& params, cudaStream_t stream) {
  // Only the forms the plan picks are compiled (core/sparse_kernel_plan.cc): the keys staged as
  // fp16 in the dense mode, the one stage in the sparse mode at d 576, the slots everywhere.
  if constexpr (kDense) {
    if (params.ring == 3) {  // the slots with the keys staged as fp16 (traits.h kFp16)
      return launch_sparse_decode_traits<SparseDecodeTraits<kHeadDimQK, kDense, false, false, 3>>(
          params, stream);
    }
  } else if constexpr (kHeadDimQK == 576) {
    if (params.ring == 1) {  // one bf16 stage (traits.h kRing)
      return launch_sparse_decode_traits<SparseDecodeTraits<kHeadDimQK, kDense, false, false, 1>>(
          params, stream);
    }
  }
  if (params.ring != 2) return cudaErrorInvalidValue;  // (never: the plan picks compiled forms)
  return launch_sparse_decode_traits<  // decoded into three round slots (traits.h kSlots)
      SparseDecodeTraits<kHeadDimQK, kDense, false, false, 2>>(params, stream);
}

// Compiled in instantiations/ring_*.cu only (a kernel per d_qk and mode, built in parallel).
extern template cudaError_t launch_sparse_decode_ring<576, false>(const SparseDecodeParams&,
                                                                  cudaStream_t);
extern template cudaError_t launch_sparse_decode_ring<576, true>(const SparseDecodeParams&,
                                                                 cudaStream_t);
extern template cudaError_t launch_sparse_decode_ring<512, false>(const SparseDecodeParams&,
                                                                  cudaStream_t);
extern template cudaError_t launch_sparse_decode_ring<512, true>(const SparseDecodeParams&,
                                                                 cudaStream_t);

// The fused V4 attention's kernels (traits.h kFused; instantiations/fused_d512_sm90.cu): the
// forms a fused call runs, with the fused steps compiled in.
cudaError_t launch_sparse_decode_fused(const SparseDecodeParams& params, cudaStream_t stream);

// The seesaw order serves grids of bf16 keys by cp.async (params.seesaw, launch.cu); the ring
// fill, quantised keys of one format (params.ring); a fused call (params.fused.on), its own
// kernels.
template <int kHeadDimQK, bool kDense>
cudaError_t launch_sparse_decode_kernel(const SparseDecodeParams& params, cudaStream_t stream) {
  if constexpr (kHeadDimQK == 512 && !kDense) {
    if (params.fused.on) return launch_sparse_decode_fused(params, stream);
  }
  if (params.ring > 0) return launch_sparse_decode_ring<kHeadDimQK, kDense>(params, stream);
  if constexpr (!kDense) {
    if (params.seesaw && params.stagger) {
      return launch_sparse_decode_traits<SparseDecodeTraits<kHeadDimQK, false, true, true>>(params,
                                                                                            stream);
    }
    if (params.seesaw) {
      return launch_sparse_decode_traits<SparseDecodeTraits<kHeadDimQK, false, true>>(params,
                                                                                      stream);
    }
  }
  return launch_sparse_decode_traits<SparseDecodeTraits<kHeadDimQK, kDense>>(params, stream);
}

}  // namespace openmla::cuda::sm90
