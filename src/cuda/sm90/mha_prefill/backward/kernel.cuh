// The main kernel of SM90 dense MHA prefill backward (NOTES.md). CTA (key block, kv head,
// sequence): K and V of kBlockN keys (128 at d 128, 64 at d 192) stay in shared memory; the CTA
// loops over every (query head of the kv head's group, block of 64 query tokens) that sees a
// key of the block, Q and dO double-buffered by cp.async, and per iteration
//   S^T = K Q^T, P^T = exp(S^T scale - lse) on visible pairs (to sP), dP^T = V dO^T,
//   dS^T = P^T (dP^T - D) (to sdS), dV += P^T dO, dK += dS^T Q (registers, whole CTA life),
//   dQ = dS K added into the fp32 workspace with atomics.
// Two compute warpgroups: at d 128 each owns 64 keys for S, dP, dK, dV; at d 192 each owns half
// the queries of S, dP and half the dims of dK, dV; each owns half of d_qk for dQ. No warp
// specialisation and no TMA: a simple, checkable first version (NOTES.md, next levers).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/sm90/mha_prefill/backward/params.h"
#include "cuda/sm90/mha_prefill/backward/traits.h"
#include "cuda/sm90/mha_prefill/backward/wgmma_ops.cuh"

namespace openmla::cuda::sm90::mha_bwd {

template <class Element>
__device__ __forceinline__ void store_grad(void* base, bool f32, int64_t index, float x) {
  if (f32) {
    static_cast<float*>(base)[index] = x;
  } else {
    static_cast<Element*>(base)[index] = Element(x);
  }
}

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    mha_bwd_main_kernel(const __grid_constant__ MhaBwdParams p) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kD = Traits::kDqk;
  constexpr int kDv = Traits::kDv;
  constexpr int kN = Traits::kBlockN;
  constexpr int kM = Traits::kBlockM;
  constexpr int kThreads = Traits::kThreads;
  using LayoutQ = typename Traits::LayoutQ;
  using LayoutDO = typename Traits::LayoutDO;
  using LayoutK = typename Traits::LayoutK;
  using LayoutV = typename Traits::LayoutV;
  using LayoutDS = typename Traits::LayoutDS;

  const int tid = threadIdx.x;
  const int n0 = blockIdx.x * kN;  // the block's first key within its sequence
  const int g = blockIdx.y;        // kv head
  const int b = blockIdx.z;        // sequence
  const int q0 = p.cu_seqlens_q[b];
  const int kv0 = p.cu_seqlens_kv[b];
  // Lengths beyond the max are cut to it (the grid covers max_seqlen_kv keys).
  const int s_q = max(0, min(p.cu_seqlens_q[b + 1] - q0, p.max_seqlen_q));
  const int s_kv = max(0, min(p.cu_seqlens_kv[b + 1] - kv0, p.max_seqlen_kv));
  if (n0 >= s_kv) return;
  const int diag = s_kv - s_q;  // query t sees key u iff u <= t + diag (causal)

  // The query blocks that see a key of this block: with causal, from the one holding query
  // n0 - diag (the first to see key n0) to the end.
  int m_first = 0;
  if (p.causal && n0 - diag > 0) m_first = (n0 - diag) / kM;
  const int m_count = max(0, (s_q + kM - 1) / kM - m_first);
  const int n_iter = m_count * p.group;

  extern __shared__ __align__(1024) char smem[];
  Element* sK = reinterpret_cast<Element*>(smem + Traits::kOffK);
  Element* sV = reinterpret_cast<Element*>(smem + Traits::kOffV);
  Element* sQ = reinterpret_cast<Element*>(smem + Traits::kOffQ);
  Element* sdO = reinterpret_cast<Element*>(smem + Traits::kOffDO);
  Element* sdS = reinterpret_cast<Element*>(smem + Traits::kOffDS);
  Element* sP = reinterpret_cast<Element*>(smem + Traits::kOffP);
  float* s_lse = reinterpret_cast<float*>(smem + Traits::kOffLse);      // lse * log2(e)
  float* s_delta = reinterpret_cast<float*>(smem + Traits::kOffDelta);  // D

  typename Traits::MmaSdP mma_sdp;
  typename Traits::MmaDV mma_dv;
  typename Traits::MmaDK mma_dk;
  typename Traits::MmaDQ mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(tid);
  auto thr_dv = mma_dv.get_thread_slice(tid);
  auto thr_dk = mma_dk.get_thread_slice(tid);
  auto thr_dq = mma_dq.get_thread_slice(tid);

  Tensor tdKrdK = partition_fragment_C(mma_dk, Shape<Int<kN>, Int<kD>>{});
  Tensor tdVrdV = partition_fragment_C(mma_dv, Shape<Int<kN>, Int<kDv>>{});
  clear(tdKrdK);
  clear(tdVrdV);

  if (n_iter > 0) {
    const Element* q_base = static_cast<const Element*>(p.q);
    const Element* do_base = static_cast<const Element*>(p.dout);
    // Iteration `it`: query head g * group + it / m_count, query block m_first + it % m_count.
    auto issue_loads = [&](int it, int stage) {
      int t_ld = threadIdx.x;  // through an empty asm: the chunks' addresses are not hoisted
      asm volatile("" : "+r"(t_ld));
      const int h = g * p.group + it / m_count;
      const int m0 = (m_first + it % m_count) * kM;
      const int64_t tok = static_cast<int64_t>(q0) + m0;
      load_tile<kM, kD, kThreads, LayoutQ>(sQ + stage * kM * kD,
                                           q_base + tok * p.q_stride_t + h * p.q_stride_h,
                                           p.q_stride_t, s_q - m0, t_ld);
      load_tile<kM, kDv, kThreads, LayoutDO>(sdO + stage * kM * kDv,
                                             do_base + tok * p.do_stride_t + h * p.do_stride_h,
                                             p.do_stride_t, s_q - m0, t_ld);
      if (t_ld < kM) {
        // Rows past the sequence, and queries that see no key (lse -inf), get lse +inf: P = 0.
        float lse = INFINITY, delta = 0.f;
        if (m0 + t_ld < s_q) {
          lse = p.lse[(tok + t_ld) * p.lse_stride_t + h * p.lse_stride_h];
          delta = p.delta[static_cast<int64_t>(h) * p.total_q + tok + t_ld];
          if (lse == -INFINITY) lse = INFINITY;
        }
        s_lse[stage * kM + t_ld] = lse * 1.4426950408889634f;
        s_delta[stage * kM + t_ld] = delta;
      }
    };

    const int64_t key_tok = static_cast<int64_t>(kv0) + n0;
    load_tile<kN, kD, kThreads, LayoutK>(
        sK, static_cast<const Element*>(p.k) + key_tok * p.k_stride_t + g * p.k_stride_h,
        p.k_stride_t, s_kv - n0, tid);
    load_tile<kN, kDv, kThreads, LayoutV>(
        sV, static_cast<const Element*>(p.v) + key_tok * p.v_stride_t + g * p.v_stride_h,
        p.v_stride_t, s_kv - n0, tid);
    issue_loads(0, 0);
    cp_async_commit();

    // Operands fixed for the CTA: K and V (A of S^T, dP^T), K^T (B of dQ), dS (A of dQ), P^T
    // and dS^T (A of dV, dK).
    Tensor tSrK = thr_sdp.partition_fragment_A(make_tensor(make_smem_ptr(sK), LayoutK{}));
    Tensor tdPrV = thr_sdp.partition_fragment_A(make_tensor(make_smem_ptr(sV), LayoutV{}));
    Tensor tdQrKt = thr_dq.partition_fragment_B(
        make_tensor(make_smem_ptr(sK), typename Traits::LayoutKt{}));
    Tensor tdQrdS = thr_dq.partition_fragment_A(make_tensor(make_smem_ptr(sdS), LayoutDS{}));
    Tensor tdVrPt = thr_dv.partition_fragment_A(
        make_tensor(make_smem_ptr(sP), typename Traits::LayoutDSt{}));
    Tensor tdKrdSt = thr_dk.partition_fragment_A(
        make_tensor(make_smem_ptr(sdS), typename Traits::LayoutDSt{}));

    for (int it = 0; it < n_iter; ++it) {
      const int stage = it & 1;
      if (it + 1 < n_iter) issue_loads(it + 1, stage ^ 1);
      cp_async_commit();
      cp_async_wait<1>();              // this thread's copies of iteration `it` landed
      attention::fence_async_smem();  // visible to wgmma (async proxy)
      __syncthreads();                // and every thread's

      const int h = g * p.group + it / m_count;
      const int m0 = (m_first + it % m_count) * kM;
      // (key, query) of each S^T / dP^T accumulator element, (query, dim) of each dQ one, from
      // the thread index passed through an empty asm at each use: recomputed where needed (a
      // few integer ops) instead of 100+ coordinates and swizzled shared addresses held live
      // across the products (spills).
      auto fresh_tid = [&] {
        int t = tid;
        asm volatile("" : "+r"(t));
        return t;
      };
      auto s_coords = [&] {
        return mma_sdp.get_thread_slice(fresh_tid()).partition_C(
            make_identity_tensor(Shape<Int<kN>, Int<kM>>{}));
      };
      Element* sQs = sQ + stage * kM * kD;
      Element* sdOs = sdO + stage * kM * kDv;
      const float* lse2 = s_lse + stage * kM;
      const float* delta = s_delta + stage * kM;
      Tensor tSrQ = thr_sdp.partition_fragment_B(make_tensor(make_smem_ptr(sQs), LayoutQ{}));
      Tensor tdPrdO = thr_sdp.partition_fragment_B(make_tensor(make_smem_ptr(sdOs), LayoutDO{}));
      Tensor tdVrdOt = thr_dv.partition_fragment_B(
          make_tensor(make_smem_ptr(sdOs), typename Traits::LayoutDOt{}));
      Tensor tdKrQt = thr_dk.partition_fragment_B(
          make_tensor(make_smem_ptr(sQs), typename Traits::LayoutQt{}));

      Tensor tSrS = partition_fragment_C(mma_sdp, Shape<Int<kN>, Int<kM>>{});
      Tensor tdPrdP = partition_fragment_C(mma_sdp, Shape<Int<kN>, Int<kM>>{});
      issue_gemm<true>(mma_sdp, tSrK, tSrQ, tSrS);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);

      // P^T = exp2(S^T scale log2e - lse log2e) where the query sees the key, else 0; its
      // 16-bit copy as (query, key) into sP.
      Tensor tScS = s_coords();
      CUTE_UNROLL
      for (int i = 0; i < size(tSrS); ++i) {
        const int row = get<0>(tScS(i));
        const int col = get<1>(tScS(i));
        const int key = n0 + row;
        const int t = m0 + col;
        const bool visible = key < s_kv && t < s_q && (!p.causal || key <= t + diag);
        const float x = tSrS(i) * p.scale_log2 - lse2[col];
        *smem_at<LayoutDS>(sP, col, row) = Element(visible ? attention::exp2_approx(x) : 0.f);
      }
      issue_gemm<true>(mma_sdp, tdPrV, tdPrdO, tdPrdP);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tdPrdP);

      // dS^T = P^T (dP^T - D) with P^T read back from sP (this thread's own stores), as
      // (query, key) into sdS.
      Tensor tdPcdP = s_coords();
      CUTE_UNROLL
      for (int i = 0; i < size(tdPrdP); ++i) {
        const int col = get<1>(tdPcdP(i));
        const int row = get<0>(tdPcdP(i));
        const float p_val = static_cast<float>(*smem_at<LayoutDS>(sP, col, row));
        *smem_at<LayoutDS>(sdS, col, row) = Element(p_val * (tdPrdP(i) - delta[col]));
      }
      attention::fence_async_smem();  // this thread's P and dS stores, to wgmma
      __syncthreads();                // every thread's (dQ reads both warpgroups' keys)

      Tensor tdQrdQ = partition_fragment_C(mma_dq, Shape<Int<kM>, Int<kD>>{});
      issue_gemm<false>(mma_dv, tdVrPt, tdVrdOt, tdVrdV);
      issue_gemm<false>(mma_dk, tdKrdSt, tdKrQt, tdKrdK);
      issue_gemm<true>(mma_dq, tdQrdS, tdQrKt, tdQrdQ);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tdVrdV);
      warpgroup_fence_operand(tdKrdK);
      warpgroup_fence_operand(tdQrdQ);
      // Elements 2j, 2j + 1 of a wgmma accumulator are columns c, c + 1 of one row.
      float* acc = p.dq_accum + (static_cast<int64_t>(h) * p.total_q + q0 + m0) * kD;
      Tensor tdQcdQ = mma_dq.get_thread_slice(fresh_tid())
                          .partition_C(make_identity_tensor(Shape<Int<kM>, Int<kD>>{}));
      CUTE_UNROLL
      for (int i = 0; i < size(tdQrdQ); i += 2) {
        const int row = get<0>(tdQcdQ(i));
        const int col = get<1>(tdQcdQ(i));
        if (m0 + row < s_q) {
          atomicAdd(reinterpret_cast<float2*>(acc + row * kD + col),
                    make_float2(tdQrdQ(i), tdQrdQ(i + 1)));
        }
      }
      __syncthreads();  // this stage's Q, dO, lse, D and dS are free again
    }
  }

  // dK (times the scale) and dV of the block's keys, in their dtypes.
  Tensor tdKcdK = thr_dk.partition_C(make_identity_tensor(Shape<Int<kN>, Int<kD>>{}));
  Tensor tdVcdV = thr_dv.partition_C(make_identity_tensor(Shape<Int<kN>, Int<kDv>>{}));
  CUTE_UNROLL
  for (int i = 0; i < size(tdKrdK); ++i) {
    const int key = n0 + get<0>(tdKcdK(i));
    if (key < s_kv) {
      store_grad<Element>(p.dk, p.dk_f32,
                          (static_cast<int64_t>(kv0) + key) * p.dk_stride_t +
                              g * p.dk_stride_h + get<1>(tdKcdK(i)),
                          tdKrdK(i) * p.scale);
    }
  }
  CUTE_UNROLL
  for (int i = 0; i < size(tdVrdV); ++i) {
    const int key = n0 + get<0>(tdVcdV(i));
    if (key < s_kv) {
      store_grad<Element>(p.dv, p.dv_f32,
                          (static_cast<int64_t>(kv0) + key) * p.dv_stride_t +
                              g * p.dv_stride_h + get<1>(tdVcdV(i)),
                          tdVrdV(i));
    }
  }
}

// Grid (key blocks of the longest sequence, h_kv, batch); the caller skips an empty grid.
template <class Element, int kDqk>
cudaError_t launch_main(const MhaBwdParams& p, cudaStream_t stream) {
  using Traits = BwdTraits<Element, kDqk>;
  auto* kernel = &mha_bwd_main_kernel<Traits>;
  const int smem = static_cast<int>(Traits::kSmemBytes);
  if (cudaError_t err =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      err != cudaSuccess) {
    return err;
  }
  const dim3 grid((p.max_seqlen_kv + Traits::kBlockN - 1) / Traits::kBlockN, p.h_kv, p.batch);
  kernel<<<grid, Traits::kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace openmla::cuda::sm90::mha_bwd
