// SM90 dense MHA prefill forward: one TMA producer thread + two wgmma warpgroups (design,
// barrier protocol and shared-memory map: NOTES.md; compile-time choices: traits.h).
//
// Grid (m_blocks, h_q, batch), 384 threads, one CTA per SM. CTA (x, h, b) serves query rows
// [128 m, 128 m + 128) of sequence b, query head h (m = m_blocks - 1 - x: with causal masking the
// last rows see the most keys, so the longest CTAs start first), kv head h / group. It walks
// key blocks n = 0 .. n_end - 1, n_end the blocks its last row sees. Per block, each compute
// warpgroup (its 64 rows) does
//
//   S = Q K(n)^T (ss wgmma, K from stage n % 2) -> K handed back
//   mask keys >= the row's visible count (only on blocks that reach past the WG's first row's)
//   m' = max(m, rowmax S); O *= e^(m - m'); l = l e^(m - m') + rowsum(P); P = e^(S - m')
//   O += P V(n) (rs wgmma, P from registers, V read MN-major) -> V handed back
//
// and the epilogue writes O / l (16-byte row stores, rows past the sequence not written) and
// lse = m + ln l (natural log; -inf and O = 0 for a row that sees no key).
#pragma once

#include <cuda.h>

#include <cstdint>

#include <cute/tensor.hpp>
#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "cuda/common/smem_opt_in.h"
#include "cuda/sm90/attention/fragments.cuh"
#include "cuda/sm90/attention/mma.cuh"
#include "cuda/sm90/attention/primitives.cuh"
#include "cuda/sm90/attention/softmax.cuh"
#include "cuda/sm90/mha_prefill/params.h"
#include "cuda/sm90/mha_prefill/traits.h"

namespace openmla::cuda::sm90 {
namespace mha_fwd_detail {
using namespace attention;  // the shared device pieces (src/cuda/sm90/attention/)

// Keys query row t of a sequence sees: all s_kv, or with causal masking the first
// t + s_kv - s_q + 1 (bottom-right aligned), clamped to [0, s_kv] (cpu/mha_prefill.h).
__device__ __forceinline__ int visible_keys(int t, int s_q, int s_kv, bool causal) {
  if (!causal) return s_kv;
  const int n = t + s_kv - s_q + 1;
  return n < 0 ? 0 : (n > s_kv ? s_kv : n);
}

// One CTA's work: its sequence (first token and key, lengths), its first row in the sequence,
// and the key blocks it walks, [0, n_end).
struct Work {
  int q0, s_q, kv0, s_kv;
  int m0;
  int n_end;
};

template <class Traits>
__device__ __forceinline__ Work work_of(const MhaFwdParams& p, int m_block, int b) {
  Work w;
  w.q0 = p.cu_seqlens_q[b * p.cu_q_stride];
  w.kv0 = p.cu_seqlens_kv[b * p.cu_kv_stride];
  // A caller's offsets are not read on the host: a decreasing pair is an empty sequence here.
  w.s_q = max(p.cu_seqlens_q[(b + 1) * p.cu_q_stride] - w.q0, 0);
  w.s_kv = max(p.cu_seqlens_kv[(b + 1) * p.cu_kv_stride] - w.kv0, 0);
  w.m0 = m_block * Traits::kBlockM;
  w.n_end = 0;
  if (w.m0 < w.s_q) {
    const int last = min(w.m0 + Traits::kBlockM, w.s_q) - 1;
    w.n_end = (visible_keys(last, w.s_q, w.s_kv, p.causal != 0) + Traits::kBlockN - 1) /
              Traits::kBlockN;
  }
  return w;
}

// ---------------------------------------------------------------------------------------------
// Producer: one thread. Q of both warpgroups once (q_full), then each block's K and V into stage
// n % 2 as soon as both warpgroups have handed that stage's K (resp. V) back.
template <class Traits>
__device__ __forceinline__ void produce(const MhaFwdParams& p,
                                        typename Traits::SharedStorage& smem, const Work& w,
                                        int head, int kv_head) {
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  using cute::SM90_TMA_LOAD_3D;
  constexpr uint64_t kHintQ = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_FIRST);
  // K and V of a head are read by every m block of the sequence: keep them in L2.
  constexpr uint64_t kHintKV = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_LAST);
  constexpr int kPieceElemsQ = Traits::kWgRows * Traits::kPieceDims;
  constexpr int kPieceElemsKV = Traits::kBlockN * Traits::kPieceDims;
  if (w.n_end == 0) return;
  cute::prefetch_tma_descriptor(&p.tma_q);
  cute::prefetch_tma_descriptor(&p.tma_k);
  cute::prefetch_tma_descriptor(&p.tma_v);
  Barrier::arrive_and_expect_tx(&smem.q_full, Traits::kQBytes);
#pragma unroll
  for (int wg = 0; wg < 2; ++wg) {
#pragma unroll
    for (int c = 0; c < Traits::kQPieces; ++c) {
      SM90_TMA_LOAD_3D::copy(&p.tma_q, &smem.q_full, kHintQ, smem.q[wg] + c * kPieceElemsQ,
                             c * Traits::kPieceDims, head, w.q0 + w.m0 + wg * Traits::kWgRows);
    }
  }
#pragma unroll 1
  for (int n = 0; n < w.n_end; ++n) {
    const int s = n % Traits::kStages;
    const uint32_t phase = (n / Traits::kStages) & 1;
    const int key0 = w.kv0 + n * Traits::kBlockN;
    // A fresh barrier's "previous" phase counts as complete: the first pass waits for nothing.
    cutlass::arch::ClusterBarrier::wait(&smem.k_empty[s], phase ^ 1);
    Barrier::arrive_and_expect_tx(&smem.k_full[s], Traits::kKBytes);
#pragma unroll
    for (int c = 0; c < Traits::kQPieces; ++c) {
      SM90_TMA_LOAD_3D::copy(&p.tma_k, &smem.k_full[s], kHintKV, smem.k[s] + c * kPieceElemsKV,
                             c * Traits::kPieceDims, kv_head, key0);
    }
    cutlass::arch::ClusterBarrier::wait(&smem.v_empty[s], phase ^ 1);
    Barrier::arrive_and_expect_tx(&smem.v_full[s], Traits::kVBytes);
#pragma unroll
    for (int c = 0; c < Traits::kVPieces; ++c) {
      SM90_TMA_LOAD_3D::copy(&p.tma_v, &smem.v_full[s], kHintKV, smem.v[s] + c * kPieceElemsKV,
                             c * Traits::kPieceDims, kv_head, key0);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// A compute warpgroup: its 64 rows over every block, then the epilogue.
template <class Traits>
__device__ __forceinline__ void consume(const MhaFwdParams& p,
                                        typename Traits::SharedStorage& smem, const Work& w,
                                        int head, int wg, int t) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kN = Traits::kBlockN;
  const int lane = t % 32;
  const bool causal = p.causal != 0;
  const float sl2 = p.scale_log2;

  typename Traits::TiledMmaQK mma_qk;
  typename Traits::TiledMmaPV mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(t);
  auto thr_pv = mma_pv.get_thread_slice(t);

  Tensor sQ = make_tensor(make_smem_ptr(smem.q[wg]), typename Traits::SmemLayoutQ{});  // (64,D)
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);  // (MMA,1,D/16) descriptors
  // Stage 0's K and V descriptors; stage 1 by byte offset (at_offset).
  Tensor tSrK = thr_qk.partition_fragment_B(
      make_tensor(make_smem_ptr(smem.k[0]), typename Traits::SmemLayoutK{}));  // (MMA,1,D/16)
  Tensor tOrV = thr_pv.partition_fragment_B(
      make_tensor(make_smem_ptr(smem.v[0]), typename Traits::SmemLayoutV{}));  // (MMA,1,8)
  Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<64>, Int<kN>>{});       // fp32
  Tensor S = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));              // (2,32)
  Tensor cS = make_identity_tensor(Shape<Int<64>, Int<kN>>{});
  Tensor tScS = thr_qk.partition_C(cS);
  Tensor cS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));  // (2,32) -> (row,key)
  // Only its shape matters: P's register fragment as the A operand of P V.
  Tensor sP_shape = make_tensor(make_smem_ptr(smem.q[0]), typename Traits::SmemLayoutP{});
  Tensor tOrP = thr_pv.partition_fragment_A(sP_shape);  // (MMA,1,8) Element
  static_assert(decltype(size(tOrP))::value == decltype(size(tSrS))::value);
  Tensor tOrO = partition_fragment_C(mma_pv, Shape<Int<64>, Int<Traits::kHeadDimV>>{});  // fp32
  Tensor O = make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));                       // (2,32)
  static_assert(decltype(size<0>(S))::value == 2 && decltype(size<0>(O))::value == 2);

  // This thread's two rows (in the sequence) and the keys each sees.
  int row[2], limit[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    row[i] = w.m0 + wg * Traits::kWgRows + get<0>(cS_rc(i, 0));
    limit[i] = visible_keys(row[i], w.s_q, w.s_kv, causal);
  }
  // The warpgroup's first row sees the fewest keys: blocks past its count need the mask.
  const int lim_first = visible_keys(w.m0 + wg * Traits::kWgRows, w.s_q, w.s_kv, causal);

  float m[2] = {-INFINITY, -INFINITY};  // running max of the raw logits (Q K^T)
  float l[2] = {0.f, 0.f};              // this thread's part of the row sums, in units of e^m
  clear(tOrO);
  if (w.n_end > 0) cutlass::arch::ClusterBarrier::wait(&smem.q_full, 0);

#pragma unroll 1
  for (int n = 0; n < w.n_end; ++n) {
    const int s = n % Traits::kStages;
    const uint32_t phase = (n / Traits::kStages) & 1;
    // S = Q K^T over d_qk / 16 k-steps.
    cutlass::arch::ClusterBarrier::wait(&smem.k_full[s], phase);
    Tensor tSrKs = at_offset(tSrK, s * Traits::kKBytes);
    warpgroup_fence_operand(tSrS);
    warpgroup_arrive();
#pragma unroll
    for (int kk = 0; kk < size<2>(tSrQ); ++kk) {
      mma_qk.accumulate_ = kk == 0 ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
      gemm(mma_qk, tSrQ(_, _, kk), tSrKs(_, _, kk), tSrS);
    }
    warpgroup_commit_batch();
    warpgroup_wait<0>();
    warpgroup_fence_operand(tSrS);
    release_part(&smem.k_empty[s], lane);

    // Keys this row does not see (causal, past the sequence's keys: those are the next
    // sequence's rows or the map's zero fill) -> -inf, so P is exactly 0 there.
    if ((n + 1) * kN > lim_first) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int j = 0; j < size<1>(S); ++j) {
          if (n * kN + get<1>(cS_rc(i, j)) >= limit[i]) S(i, j) = -INFINITY;
        }
      }
    }

    // Online softmax. A row that has seen no key keeps m = -inf, P = 0 (max_base).
    float scale_old[2], base[2], tile_sum[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float m_new = fmaxf(m[i], quad_max(row_reduce<true>(S, i)));
      scale_old[i] = m[i] == -INFINITY ? 0.f : exp2_approx((m[i] - m_new) * sl2);
      m[i] = m_new;
      base[i] = max_base(m_new, sl2);
    }
    exp_rows(S, base, sl2, tile_sum);
#pragma unroll
    for (int i = 0; i < 2; ++i) l[i] = l[i] * scale_old[i] + tile_sum[i];
    rescale_rows(O, scale_old);
    pack_p<Element>(tSrS, tOrP);

    // O += P V.
    cutlass::arch::ClusterBarrier::wait(&smem.v_full[s], phase);
    Tensor tOrVs = at_offset(tOrV, s * Traits::kVBytes);
    gemm_pv(mma_pv, tOrP, tOrVs, tOrO);
    wait_pv(tOrO, tOrP);
    release_part(&smem.v_empty[s], lane);
  }

  // Epilogue: O / l and lse per row; rows past the sequence's queries are not written.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float sum = quad_sum(l[i]);
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
#pragma unroll
    for (int j = 0; j < size<1>(O); ++j) O(i, j) *= inv;
    const bool valid = row[i] < w.s_q;
    const int64_t token = static_cast<int64_t>(w.q0) + row[i];
    char* dst = static_cast<char*>(p.out) +
                (token * p.out_stride_token + static_cast<int64_t>(head) * p.out_stride_head) * 2;
    store_row_16B<Element>(dst, O, i, lane % 4, valid);  // every lane shuffles
    if (valid && lane % 4 == 0) {
      p.lse[token * p.lse_stride_token + static_cast<int64_t>(head) * p.lse_stride_head] =
          sum > 0.f ? m[i] * p.softmax_scale + logf(sum) : -INFINITY;
    }
  }
}

}  // namespace mha_fwd_detail

template <class Traits>
__global__ void __launch_bounds__(Traits::kNumThreads, 1)
    mha_fwd_kernel(const __grid_constant__ MhaFwdParams params) {
  using namespace mha_fwd_detail;
  using Storage = typename Traits::SharedStorage;
  // Aligned to 1024 B by pointer arithmetic on the shared array itself (dense_decode/kernel.cuh).
  extern __shared__ __align__(1024) char smem_raw[];
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  Storage& smem =
      *reinterpret_cast<Storage*>(smem_raw + (((smem_base + 1023u) & ~1023u) - smem_base));

  const int m_block = static_cast<int>(gridDim.x - 1 - blockIdx.x);  // longest first
  const int head = blockIdx.y;
  const Work w = work_of<Traits>(params, m_block, blockIdx.z);
  if (w.m0 >= w.s_q) return;  // past this sequence's queries (the same for every thread)

  const int thread = threadIdx.x;
  if (thread == 0) {
    cutlass::arch::ClusterBarrier::init(&smem.q_full, 1);
#pragma unroll
    for (int s = 0; s < Traits::kStages; ++s) {
      cutlass::arch::ClusterBarrier::init(&smem.k_full[s], 1);
      cutlass::arch::ClusterBarrier::init(&smem.v_full[s], 1);
      cutlass::arch::ClusterBarrier::init(&smem.k_empty[s], 8);  // lane 0 of the 8 compute warps
      cutlass::arch::ClusterBarrier::init(&smem.v_empty[s], 8);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  const int wg = __shfl_sync(0xffffffffu, thread / 128, 0);
  if (wg == 2) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    if (thread == 256) produce<Traits>(params, smem, w, head, head / params.group);
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kMmaRegisters>();
    consume<Traits>(params, smem, w, head, wg, thread % 128);
  }
}

// The launch of one instantiation (instantiations/*.cu instantiate it per Element x d_qk).
template <typename Element, int kHeadDimQK>
cudaError_t launch_mha_fwd_kernel(const MhaFwdParams& params, int m_blocks, int h_q, int batch,
                                  cudaStream_t stream) {
  using Traits = MhaFwdTraits<Element, kHeadDimQK>;
  auto kernel = mha_fwd_kernel<Traits>;
  if (const cudaError_t err = allow_dynamic_smem(kernel, Traits::kSmemBytes); err != cudaSuccess) {
    return err;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(m_blocks, h_q, batch);
  config.blockDim = dim3(Traits::kNumThreads);
  config.dynamicSmemBytes = Traits::kSmemBytes;
  config.stream = stream;
  return cudaLaunchKernelEx(&config, kernel, params);
}

}  // namespace openmla::cuda::sm90
