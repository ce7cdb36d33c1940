// SM90 dense MHA prefill forward: one TMA producer thread (producer.cuh) + two wgmma
// warpgroups (design, barrier protocol and shared-memory map: NOTES.md; tiles: traits.h).
//
// Grid (m_blocks, h_q, batch), 384 threads, one CTA per SM. CTA (x, h, b) serves query rows
// [128 m, 128 m + 128) of sequence b, query head h (m = m_blocks - 1 - x: with causal masking the
// last rows see the most keys, so the longest CTAs start first), kv head h / group. It walks
// key blocks n = 0 .. n_end - 1, n_end the blocks its last row sees. Each compute warpgroup (its
// 64 rows) computes, per block,
//
//   S = Q K(n)^T (ss wgmma, K from stage n % 2) -> K handed back
//   mask keys >= the row's visible count (only on blocks that reach past the WG's first row's)
//   m' = max(m, rowmax S); P = e^(S - m'); O *= e^(m - m'); l = l e^(m - m') + rowsum(P)
//   O += P V(n) (rs wgmma, P from registers, V read MN-major) -> V handed back
//
// in FlashAttention-3's order: S(n) is issued together with P(n-1) V(n-1) and the softmax of S(n)
// runs while that P V is in flight (intra-warpgroup overlap); the two warpgroups take turns
// issuing their wgmmas (named barriers kBarTurn0/1), so one's softmax overlaps the other's
// products (ping-pong).
// The epilogue writes O / l (16-byte row stores, rows past the sequence not written) and
// lse = m·scale + ln l (m the raw max; natural log; -inf and O = 0 for a row that sees no key).
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
#include "cuda/sm90/mha_prefill/producer.cuh"
#include "cuda/sm90/mha_prefill/traits.h"

namespace openmla::cuda::sm90 {
namespace mha_fwd_detail {
using namespace attention;  // the shared device pieces (src/cuda/sm90/attention/)

// Named barriers of the ping-pong (ids 1, 2; 0 is __syncthreads): warpgroup w waits at
// kBarTurn0 + w before issuing its wgmmas and lets the other one go after (256 threads each:
// 128 waiting, 128 arriving).
enum : uint32_t { kBarTurn0 = 1, kBarTurn1 = 2 };
__device__ __forceinline__ void turn_wait(int wg) { bar_sync(kBarTurn0 + wg, 256); }
__device__ __forceinline__ void turn_pass(int wg) { bar_arrive(kBarTurn0 + (1 - wg), 256); }

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

  // S = Q K^T of stage s over d_qk / 16 k-steps, issued and committed (not waited for).
  auto issue_qk = [&](int s) {
    Tensor tSrKs = at_offset(tSrK, s * Traits::kKBytes);
    warpgroup_fence_operand(tSrS);
    warpgroup_arrive();
#pragma unroll
    for (int kk = 0; kk < size<2>(tSrQ); ++kk) {
      mma_qk.accumulate_ = kk == 0 ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
      gemm(mma_qk, tSrQ(_, _, kk), tSrKs(_, _, kk), tSrS);
    }
    warpgroup_commit_batch();
  };
  // Block n's S (landed) -> P = e^(S - m') in place, m updated; scale_old = e^(m - m') for O
  // and l, tile_sum this thread's part of P's row sums. A row that has seen no key keeps
  // m = -inf and P = 0 (max_base); masked keys (causal, past the sequence's keys: those are the
  // next sequence's rows or the map's zero fill) are -inf, so P is exactly 0 there.
  auto softmax = [&](int n, float (&scale_old)[2], float (&tile_sum)[2]) {
    if ((n + 1) * kN > lim_first) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int j = 0; j < size<1>(S); ++j) {
          if (n * kN + get<1>(cS_rc(i, j)) >= limit[i]) S(i, j) = -INFINITY;
        }
      }
    }
    float base[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float m_new = fmaxf(m[i], quad_max(row_reduce<true>(S, i)));
      scale_old[i] = m[i] == -INFINITY ? 0.f : exp2_approx((m[i] - m_new) * sl2);
      m[i] = m_new;
      base[i] = max_base(m_new, sl2);
    }
    exp_rows(S, base, sl2, tile_sum);
  };
  auto rescale = [&](const float (&scale_old)[2], const float (&tile_sum)[2]) {
#pragma unroll
    for (int i = 0; i < 2; ++i) l[i] = l[i] * scale_old[i] + tile_sum[i];
    rescale_rows_if(O, scale_old);  // skipped where no row's max moved (exact)
  };
  auto stage_of = [](int n) { return n % Traits::kStages; };
  auto phase_of = [](int n) { return static_cast<uint32_t>((n / Traits::kStages) & 1); };

  if (w.n_end > 0) {
    cutlass::arch::ClusterBarrier::wait(&smem.q_full, 0);
    float scale_old[2], tile_sum[2];
    {
      // Turns: each warpgroup issues n_end + 1 times (S(0); S(n) with P V(n-1) for n >= 1; the
      // last P V), WG0 first. WG1 passes once up front and skips its last pass, so every wait
      // at a barrier meets exactly one pass of the other warpgroup (none is left pending).
      if (wg == 1) turn_pass(wg);
      cutlass::arch::ClusterBarrier::wait(&smem.k_full[0], 0);
      turn_wait(wg);
      issue_qk(0);
      turn_pass(wg);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);
      release_part(&smem.k_empty[0], lane);
      softmax(0, scale_old, tile_sum);
      rescale(scale_old, tile_sum);  // O is 0, scale_old 0: l = tile_sum
      pack_p<Element>(tSrS, tOrP);
#pragma unroll 1
      for (int n = 1; n < w.n_end; ++n) {
        const int s = stage_of(n), sp = stage_of(n - 1);
        cutlass::arch::ClusterBarrier::wait(&smem.k_full[s], phase_of(n));
        turn_wait(wg);
        issue_qk(s);
        cutlass::arch::ClusterBarrier::wait(&smem.v_full[sp], phase_of(n - 1));
        gemm_pv(mma_pv, tOrP, at_offset(tOrV, sp * Traits::kVBytes), tOrO);
        turn_pass(wg);
        warpgroup_wait<1>();  // S(n) done; P(n-1) V(n-1) may still run
        warpgroup_fence_operand(tSrS);
        release_part(&smem.k_empty[s], lane);
        softmax(n, scale_old, tile_sum);  // S's registers only: P and O are the wgmma's
        wait_pv(tOrO, tOrP);
        release_part(&smem.v_empty[sp], lane);
        rescale(scale_old, tile_sum);
        pack_p<Element>(tSrS, tOrP);
      }
      const int sl = stage_of(w.n_end - 1);
      cutlass::arch::ClusterBarrier::wait(&smem.v_full[sl], phase_of(w.n_end - 1));
      turn_wait(wg);
      gemm_pv(mma_pv, tOrP, at_offset(tOrV, sl * Traits::kVBytes), tOrO);
      if (wg == 0) turn_pass(wg);
      wait_pv(tOrO, tOrP);
      release_part(&smem.v_empty[sl], lane);
    }
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
