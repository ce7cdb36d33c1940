// Sparse prefill on FP8 tensor cores (the opt-in path of docs/semantics.md; sparse_decode/NOTES.md
// has the design and its measurements). Keys come as e4m3 rows of one power-of-two scale each
// (dequant_once.cu writes them from the cache's named slots: 512 codes, 64 RoPE dims as bf16, all
// divided by the row's scale s_k); q is quantised here, a row at a time, the same way.
//
// A CTA: 64 query heads of one query token over all of its keys, in 64-key tiles; 3 warpgroups.
//  - WG2 (producer): each tile's rows by cp.async into a stage (codes K-major with the 128 B
//    swizzle, RoPE dims, scales; zeros for an invalid key), then V^T for the P V product: FP8
//    wgmma reads both operands K-major, so the codes are transposed in shared memory (ldmatrix
//    .trans of 16-bit pairs, byte permutes, stmatrix; the published FA3 technique), keys in the
//    order of P's register fragment (below), so P needs no shuffle.
//  - WG0, WG1: each computes the tile's S = Q K^T (e4m3 over the d_qk - 64 non-RoPE dims, bf16
//    over the RoPE ones, one fp32 accumulator) and the same softmax, and O += P V over its own
//    256 of the 512 V dims (e4m3, P from registers). S twice keeps the two independent: no
//    exchange, no named barrier a tile (NOTES.md: its cost and the alternative).
// Softmax (the semantics' integer running max M of y = x log2 e + e_k): p = 2^(y - M) <= 1 holds
// the key's scale s_k = 2^e_k, so P V over the codes is P V over the keys; e4m3(256 p) is P's
// operand; the row sum adds 256 p / s_k (unquantised; it holds 256 l), and a growing M rescales
// O and the sum by an exact power of two. A stage's codes, RoPE dims and scales go back to the
// producer after the softmax (empty_k), its V^T after P V (empty_v).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include <cute/tensor.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "core/fp8_row_scale.h"
#include "cuda/sm90/attention/mma.cuh"
#include "cuda/sm90/attention/primitives.cuh"
#include "cuda/sm90/sparse_decode/e4m3_decode.cuh"
#include "cuda/sm90/sparse_prefill/fp8_launch.h"
#include "cuda/common/smem_opt_in.h"

namespace openmla::cuda::sm90 {

namespace fp8_prefill {

constexpr int kThreads = 384;
constexpr int kTileKeys = 64;
constexpr int kProducerRegisters = 40, kConsumerRegisters = 232;
enum : uint32_t { kBarQ = 1 };  // both compute warpgroups: Q quantised and stored (256)

struct alignas(1024) Stage {
  uint8_t k8[kTileKeys * 512];  // codes, K-major: 4 pieces of 64 keys x 128 dims, 128 B swizzle
  uint8_t kr[kTileKeys * 128];  // RoPE dims (bf16), K-major, 128 B swizzle
  uint8_t vt[512 * kTileKeys];  // V^T: 512 dim rows of 64 key positions, 64 B swizzle
  float scale[kTileKeys];       // s_k; 0 for an invalid key
};
struct alignas(1024) Smem {
  uint8_t q8[64 * 512];
  uint8_t qr[64 * 128];
  Stage stage[2];
  int q_exp[64];
  uint64_t full_k[2], full_v[2], empty_k[2], empty_v[2];
};
constexpr int kSmemBytes = sizeof(Smem) + 1024;  // (+ alignment of the dynamic window)
static_assert(sizeof(Stage) % 1024 == 0);

template <int kDqk>
struct Traits {
  static constexpr int kNope = kDqk - 64;  // dims on the e4m3 product: 512 or 448
  static constexpr int kNopeSteps = kNope / 32;
  using E4 = cute::float_e4m3_t;
  using BF = cute::bfloat16_t;
  using LayoutQK8 = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<E4>{},
                                                 cute::Shape<cute::_64, cute::_512>{}));
  using LayoutRope = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<BF>{},
                                                  cute::Shape<cute::_64, cute::_64>{}));
  // A compute warpgroup's half of V^T: 256 dims x 64 key positions.
  using LayoutVt = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW64_Atom<E4>{},
                                                cute::Shape<cute::_256, cute::_64>{}));
  // Only its shape matters: P's register fragment as the A operand of P V.
  using LayoutP = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW64_Atom<E4>{},
                                               cute::Shape<cute::_64, cute::_64>{}));
  using MmaQK8 = decltype(cute::make_tiled_mma(cute::SM90_64x64x32_F32E4M3E4M3_SS_TN<>{}));
  using MmaQKr = decltype(cute::make_tiled_mma(
      cute::SM90_64x64x16_F32BF16BF16_SS<cute::GMMA::Major::K, cute::GMMA::Major::K>{}));
  using MmaPV = decltype(cute::make_tiled_mma(cute::SM90_64x256x32_F32E4M3E4M3_RS_TN<>{}));
};

using attention::cp_async16_u32;  // (attention/primitives.cuh)
using attention::cp_async4_u32;
using attention::cp_async_arrive_noinc;
using attention::smem_u32;
using sparse_decode_detail::prmt;  // (sparse_decode/e4m3_decode.cuh)
// Two floats to e4m3 (x in the low byte), round to nearest even, saturating.
__device__ __forceinline__ uint32_t e4m3x2(float x, float y) {
  return static_cast<uint32_t>(__nv_cvt_float2_to_fp8x2(make_float2(x, y), __NV_SATFINITE, __NV_E4M3));
}

// The producer: tile j's rows into stage j % 2, then (one tile behind, so tile j's loads fly
// meanwhile) tile j - 1's V^T.
template <int kDqk>
__device__ __forceinline__ void produce(const Fp8PrefillParams& p, Smem& smem, int64_t t,
                                        int n_keys, int n_tiles) {
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int32_t* index_row = p.row_index + t * p.topk;
  for (int j = 0; j <= n_tiles; ++j) {
    if (j < n_tiles) {
      const int s = j & 1;
      // (the stage's codes, RoPE dims and scales: free once tile j - 2's softmax has read them)
      cutlass::arch::ClusterBarrier::wait(&smem.empty_k[s], ((j >> 1) & 1) ^ 1);
      Stage& st = smem.stage[s];
      // Lane l < 16 owns key 16 warp + l of the tile: its row, or -1.
      const int key = 16 * warp + (lane & 15);
      const int k = kTileKeys * j + key;
      const int32_t row = k < n_keys ? __ldg(index_row + k) : -1;
      if (lane < 16) {
        cp_async4_u32(smem_u32(&st.scale[key]), p.row_scales + (row >= 0 ? row : 0), row >= 0);
      }
      // The codes: a warp instruction a key (lane = 16-byte chunk, piece = chunk / 8).
      const uint32_t k8 = smem_u32(st.k8), kr = smem_u32(st.kr);
#pragma unroll 4
      for (int kk = 0; kk < 16; ++kk) {
        const int32_t r = __shfl_sync(0xffffffffu, row, kk);
        const int kt = 16 * warp + kk;
        const uint8_t* src = p.rows + static_cast<int64_t>(r >= 0 ? r : 0) * kRowBytes;
        cp_async16_u32(k8 + (lane >> 3) * 8192 + kt * 128 + (((lane & 7) ^ (kt & 7)) << 4),
                   src + 16 * lane, r >= 0);
      }
      // The RoPE dims: four keys a warp instruction (8 chunks of 16 B each).
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int kk = 4 * i + (lane >> 3), c = lane & 7;
        const int32_t r = __shfl_sync(0xffffffffu, row, kk);
        const int kt = 16 * warp + kk;
        const uint8_t* src = p.rows + static_cast<int64_t>(r >= 0 ? r : 0) * kRowBytes;
        cp_async16_u32(kr + kt * 128 + ((c ^ (kt & 7)) << 4), src + 512 + 16 * c, r >= 0);
      }
      cp_async_arrive_noinc(smem.full_k[s]);
    }
    if (j >= 1) {
      const int s = (j - 1) & 1;
      cutlass::arch::ClusterBarrier::wait(&smem.full_k[s], ((j - 1) >> 1) & 1);
      // (V^T: free once tile j - 3's P V is done)
      cutlass::arch::ClusterBarrier::wait(&smem.empty_v[s], (((j - 1) >> 1) & 1) ^ 1);
      Stage& st = smem.stage[s];
      // V^T of the warp's 16 keys (group g), 32 dims an iteration. ldmatrix.trans: matrix m of
      // lane l's row address = keys 16 g + 8 (m & 1) + (l & 7), dims 32 cc + 16 (m >> 1) ..
      // + 15; thread (q = l / 4, u = l % 4) gets, per matrix, dims 2q, 2q + 1 of keys 2u, 2u + 1
      // (+ 8 for m odd): the permutes make words of one dim, keys (2u, 2u + 1, 2u + 8, 2u + 9),
      // i.e. positions 4u .. 4u + 3 of P's fragment order. stmatrix writes rows of 16 positions;
      // its 8 rows a matrix take dims of distinct residues mod 8 (no bank conflict): even dims
      // for q < 4 and odd ones for q >= 4 in matrices 0 and 2, the others in 1 and 3.
      const int g = warp, m = lane >> 3, r8 = lane & 7;
      const int key = 16 * g + 8 * (m & 1) + r8;
      const bool upper = (lane >> 2) >= 4;
      const uint32_t k8 = smem_u32(st.k8), vt = smem_u32(st.vt);
#pragma unroll 4
      for (int cc = 0; cc < 16; ++cc) {
        const int c16 = 2 * cc + (m >> 1);
        const uint32_t src = k8 + (c16 >> 3) * 8192 + key * 128 + (((c16 & 7) ^ (key & 7)) << 4);
        uint32_t x0, x1, x2, x3;
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(x0), "=r"(x1), "=r"(x2), "=r"(x3)
                     : "r"(src));
        const uint32_t d0lo = prmt(x0, x1, 0x6420), d1lo = prmt(x0, x1, 0x7531);
        const uint32_t d0hi = prmt(x2, x3, 0x6420), d1hi = prmt(x2, x3, 0x7531);
        const uint32_t s0 = upper ? d1lo : d0lo, s1 = upper ? d0lo : d1lo;
        const uint32_t s2 = upper ? d1hi : d0hi, s3 = upper ? d0hi : d1hi;
        const int dim = 32 * cc + 16 * (m >> 1) + 2 * r8 + ((m & 1) ? (r8 < 4) : (r8 >= 4));
        const uint32_t dst = vt + (dim >> 3) * 512 + (dim & 7) * 64 + ((g ^ ((dim & 7) >> 1)) << 4);
        asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(dst),
                     "r"(s0), "r"(s1), "r"(s2), "r"(s3)
                     : "memory");
      }
      attention::fence_async_smem();  // V^T before the wgmmas that read it
      cutlass::arch::ClusterBarrier::arrive(&smem.full_v[s]);
    }
  }
}

// Q's rows quantised (the semantics: e_q of the non-RoPE dims' amax, codes and RoPE dims / 2^e_q)
// into q8 / qr by both compute warpgroups: thread (row r, quarter u) takes dims 128 u .. + 127
// of the codes and 16 of the RoPE dims.
template <int kDqk>
__device__ __forceinline__ void load_q(const Fp8PrefillParams& p, Smem& smem, int m_block,
                                       int64_t t) {
  constexpr int kNope = Traits<kDqk>::kNope;
  const int ct = threadIdx.x;  // 0..255
  const int r = ct >> 2, u = ct & 3;
  const int h = 64 * m_block + r;
  const bool live = h < p.h_q;
  const uint16_t* q = p.q + t * p.q_stride_t + static_cast<int64_t>(live ? h : 0) * p.q_stride_h;
  const bool codes_live = live && 128 * u < kNope;  // (d 512: quarter 3 holds 64 code dims)
  constexpr int kLast = kNope - 384;                // the last quarter's code dims: 128 or 64
  uint4 w[16];
#pragma unroll
  for (int c = 0; c < 16; ++c) {
    const bool in = codes_live && (u < 3 || 8 * c < kLast);
    w[c] = in ? __ldg(reinterpret_cast<const uint4*>(q + 128 * u) + c) : make_uint4(0, 0, 0, 0);
  }
  uint4 rw[2];
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    rw[c] = live ? __ldg(reinterpret_cast<const uint4*>(q + kNope + 16 * u) + c)
                 : make_uint4(0, 0, 0, 0);
  }
  float amax = 0.f;
#pragma unroll
  for (int c = 0; c < 16; ++c) {
    const uint32_t* v = reinterpret_cast<const uint32_t*>(&w[c]);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __nv_bfloat162 b = *reinterpret_cast<const __nv_bfloat162*>(&v[i]);
      amax = fmaxf(amax, fmaxf(fabsf(__low2float(b)), fabsf(__high2float(b))));
    }
  }
  amax = attention::quad_max(amax);
  const int e = core::fp8_row_exponent(amax);
  const float inv = core::fp8_pow2(-e);
  // Codes: piece u, row r, chunk c2 (16 dims) -> 8 B of e4m3 per 8 dims.
#pragma unroll
  for (int c2 = 0; c2 < 8; ++c2) {
    uint32_t out[4];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint32_t* v = reinterpret_cast<const uint32_t*>(&w[2 * c2 + half]);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const __nv_bfloat162 a = *reinterpret_cast<const __nv_bfloat162*>(&v[2 * i]);
        const __nv_bfloat162 b = *reinterpret_cast<const __nv_bfloat162*>(&v[2 * i + 1]);
        out[2 * half + i] = e4m3x2(__low2float(a) * inv, __high2float(a) * inv) |
                            e4m3x2(__low2float(b) * inv, __high2float(b) * inv) << 16;
      }
    }
    *reinterpret_cast<uint4*>(smem.q8 + u * 8192 + r * 128 + ((c2 ^ (r & 7)) << 4)) =
        make_uint4(out[0], out[1], out[2], out[3]);
  }
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const uint32_t* v = reinterpret_cast<const uint32_t*>(&rw[c]);
    uint32_t out[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __nv_bfloat162 b = *reinterpret_cast<const __nv_bfloat162*>(&v[i]);
      const __nv_bfloat162 s = __floats2bfloat162_rn(__low2float(b) * inv, __high2float(b) * inv);
      out[i] = *reinterpret_cast<const uint32_t*>(&s);
    }
    *reinterpret_cast<uint4*>(smem.qr + r * 128 + (((2 * u + c) ^ (r & 7)) << 4)) =
        make_uint4(out[0], out[1], out[2], out[3]);
  }
  if (u == 0) smem.q_exp[r] = e;
  attention::fence_async_smem();  // Q before the wgmmas that read it
  attention::bar_sync(kBarQ, 256);
}

template <int kDqk>
__device__ __forceinline__ void consume(const Fp8PrefillParams& p, Smem& smem, int wg,
                                        int m_block, int64_t t, int n_tiles) {
  using namespace cute;
  using T = Traits<kDqk>;
  using E4 = typename T::E4;
  using BF = typename T::BF;
  load_q<kDqk>(p, smem, m_block, t);

  const int tid = threadIdx.x % 128;
  const int lane = tid % 32, warp = tid / 32;
  typename T::MmaQK8 mma8;
  typename T::MmaQKr mmar;
  typename T::MmaPV mmapv;
  auto thr8 = mma8.get_thread_slice(tid);
  auto thrr = mmar.get_thread_slice(tid);
  auto thrpv = mmapv.get_thread_slice(tid);
  Tensor sQ8 = make_tensor(make_smem_ptr(reinterpret_cast<E4*>(smem.q8)), typename T::LayoutQK8{});
  Tensor sQr = make_tensor(make_smem_ptr(reinterpret_cast<BF*>(smem.qr)), typename T::LayoutRope{});
  Tensor sK8 = make_tensor(make_smem_ptr(reinterpret_cast<E4*>(smem.stage[0].k8)),
                           typename T::LayoutQK8{});
  Tensor sKr = make_tensor(make_smem_ptr(reinterpret_cast<BF*>(smem.stage[0].kr)),
                           typename T::LayoutRope{});
  Tensor sVt = make_tensor(make_smem_ptr(reinterpret_cast<E4*>(smem.stage[0].vt + 16384 * wg)),
                           typename T::LayoutVt{});
  Tensor sP = make_tensor(make_smem_ptr(reinterpret_cast<E4*>(smem.q8)), typename T::LayoutP{});
  Tensor tSrQ8 = thr8.partition_fragment_A(sQ8);
  Tensor tSrK8 = thr8.partition_fragment_B(sK8);
  Tensor tSrQr = thrr.partition_fragment_A(sQr);
  Tensor tSrKr = thrr.partition_fragment_B(sKr);
  Tensor tOrVt = thrpv.partition_fragment_B(sVt);
  Tensor tOrP = thrpv.partition_fragment_A(sP);  // registers: 2 k-blocks x 4 words
  Tensor tSrS = partition_fragment_C(mma8, Shape<_64, _64>{});
  Tensor tOrO = partition_fragment_C(mmapv, Shape<_64, _256>{});
  static_assert(decltype(size(tSrS))::value == 32 && decltype(size(tOrO))::value == 128);
  static_assert(decltype(size(tOrP))::value == 32);
  clear(tOrO);
  uint32_t* pw = reinterpret_cast<uint32_t*>(raw_pointer_cast(tOrP.data()));

  // This thread's rows (accumulator rows g, g + 8) and their q scale times the softmax scale.
  const int row0 = 16 * warp + lane / 4;
  float qs[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) qs[r] = p.scale * core::fp8_pow2(smem.q_exp[row0 + 8 * r]);
  float m_run[2] = {-INFINITY, -INFINITY};  // M: an integer, or -inf before any key
  float l_run[2] = {0.f, 0.f};              // this thread's share of the row sums
  float x_max[2] = {-INFINITY, -INFINITY};  // this thread's share of the exact max logits
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr uint32_t kStageBytes = sizeof(Stage);

  for (int j = 0; j < n_tiles; ++j) {
    const int s = j & 1;
    const uint32_t phase = (j >> 1) & 1;
    const Stage& st = smem.stage[s];
    cutlass::arch::ClusterBarrier::wait(&smem.full_k[s], phase);
    {
      auto tK8 = attention::at_offset(tSrK8, s * kStageBytes);
      auto tKr = attention::at_offset(tSrKr, s * kStageBytes);
      warpgroup_fence_operand(tSrS);
      warpgroup_arrive();
#pragma unroll
      for (int k = 0; k < T::kNopeSteps; ++k) {
        mma8.accumulate_ = k == 0 ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
        gemm(mma8, tSrQ8(_, _, k), tK8(_, _, k), tSrS);
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        mmar.accumulate_ = GMMA::ScaleOut::One;
        gemm(mmar, tSrQr(_, _, k), tKr(_, _, k), tSrS);
      }
      warpgroup_commit_batch();
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);
    }
    // Element i of the accumulator: row row0 + 8 ((i / 2) % 2), column 2 (lane % 4) + i % 2 +
    // 8 (i / 4).
    // Per column (key): its scale s_k = 2^e_k (0: an invalid key, whose S is 0 as its rows are
    // zeros) gives e_k, -inf for an invalid key, so y = x log2 e + e_k masks it by itself.
    float y[32];
    float y_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      const float2 ks = *reinterpret_cast<const float2*>(&st.scale[2 * (lane % 4) + 8 * q]);
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float kf = c ? ks.y : ks.x;
        const float ek =
            kf > 0.f ? static_cast<float>(static_cast<int>(__float_as_uint(kf) >> 23) - 127)
                     : -INFINITY;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int i = 4 * q + 2 * r + c;
          const float x = tSrS(i) * qs[r] * kf;
          x_max[r] = fmaxf(x_max[r], ek == -INFINITY ? -INFINITY : x);
          y[i] = fmaf(x, kLog2e, ek);
          y_max[r] = fmaxf(y_max[r], y[i]);
        }
      }
    }
    float m8[2];  // M - 8: p256 = 2^(y - M + 8) = 256 p (0 for every key while M is -inf)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_new = fmaxf(m_run[r], ceilf(attention::quad_max(y_max[r])));
      if (m_new > m_run[r]) {
        // 2^(M_old - M_new), exact (0 before the first key: O and the sums are 0 then)
        const float d = m_run[r] - m_new;
        const float f = d >= -126.f ? core::fp8_pow2(static_cast<int>(d)) : 0.f;
        l_run[r] *= f;
#pragma unroll
        for (int i = 0; i < 128; ++i) {
          if ((i / 2) % 2 == r) tOrO(i) *= f;
        }
        m_run[r] = m_new;
      }
      m8[r] = m_run[r] == -INFINITY ? 0.f : m_run[r] - 8.f;
    }
    // p256 = 256 p; the row sum (in units of 1/256) adds p256 / s_k (exact: 2^-e_k);
    // P's operand e4m3(256 p) in fragment order: word rho + 4 kb holds, for row (rho % 2),
    // positions 16 (rho / 2) + 4 (lane % 4) .. + 3 of k-block kb = accumulator columns (2 u,
    // 2 u + 1, 2 u + 8, 2 u + 9) + 16 (rho / 2) + 32 kb.
#pragma unroll
    for (int i = 0; i < 32; ++i) y[i] = attention::exp2_approx(y[i] - m8[(i / 2) % 2]);
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      const float2 ks = *reinterpret_cast<const float2*>(&st.scale[2 * (lane % 4) + 8 * q]);
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float inv = __uint_as_float(0x7F000000u - __float_as_uint(c ? ks.y : ks.x));
#pragma unroll
        for (int r = 0; r < 2; ++r) l_run[r] = fmaf(y[4 * q + 2 * r + c], inv, l_run[r]);
      }
    }
    // The stage's codes, RoPE dims and scales are read: the producer may refill them (V^T is
    // released after P V).
    cutlass::arch::ClusterBarrier::arrive(&smem.empty_k[s]);
#pragma unroll
    for (int kb = 0; kb < 2; ++kb) {
#pragma unroll
      for (int rho = 0; rho < 4; ++rho) {
        const int i0 = 2 * (rho % 2) + 4 * (2 * (rho / 2) + 4 * kb);
        pw[rho + 4 * kb] = e4m3x2(y[i0], y[i0 + 1]) | e4m3x2(y[i0 + 4], y[i0 + 5]) << 16;
      }
    }
    cutlass::arch::ClusterBarrier::wait(&smem.full_v[s], phase);
    {
      auto tVt = attention::at_offset(tOrVt, s * kStageBytes);
      warpgroup_fence_operand(tOrP);
      warpgroup_fence_operand(tOrO);
      warpgroup_arrive();
#pragma unroll
      for (int kb = 0; kb < 2; ++kb) {
        mmapv.accumulate_ = GMMA::ScaleOut::One;
        gemm(mmapv, tOrP(_, _, kb), tVt(_, _, kb), tOrO);
      }
      warpgroup_commit_batch();
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      warpgroup_fence_operand(tOrP);
    }
    cutlass::arch::ClusterBarrier::arrive(&smem.empty_v[s]);
  }

  // Epilogue (l_run holds 256 l): out = O / (256 l), lse = ln l + M ln 2, the sink's factor.
  constexpr float kLn2 = 0.6931471805599453f;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = attention::quad_sum(l_run[r]);
    const float xm = attention::quad_max(x_max[r]);
    const int h = 64 * m_block + row0 + 8 * r;
    if (h >= p.h_q) continue;
    const bool lonely = m_run[r] == -INFINITY;
    const float lse = lonely ? INFINITY : (log2f(l) - 8.f + m_run[r]) * kLn2;
    float f = lonely ? 0.f : 1.f / l;
    if (!lonely && p.sink != nullptr) {
      f *= 1.f / (1.f + expf(p.sink[h * p.sink_stride] - lse));
    }
    uint16_t* out = p.out + t * p.out_stride_t + static_cast<int64_t>(h) * p.out_stride_h +
                    256 * wg + 2 * (lane % 4);
#pragma unroll
    for (int q = 0; q < 32; ++q) {
      const int i = 2 * r + 4 * q;
      const __nv_bfloat162 v = __floats2bfloat162_rn(tOrO(i) * f, tOrO(i + 1) * f);
      *reinterpret_cast<__nv_bfloat162*>(out + 8 * q) = v;
    }
    if (wg == 0 && lane % 4 == 0) {
      p.lse[t * p.lse_stride_t + static_cast<int64_t>(h) * p.lse_stride_h] = lse;
      p.max_logits[t * p.max_logits_stride_t + static_cast<int64_t>(h) * p.max_logits_stride_h] =
          lonely ? -INFINITY : xm;
    }
  }
}

}  // namespace fp8_prefill

template <int kDqk>
__global__ void __launch_bounds__(fp8_prefill::kThreads, 1)
    sparse_prefill_fp8_kernel(const __grid_constant__ Fp8PrefillParams p) {
  using namespace fp8_prefill;
  extern __shared__ __align__(1024) char smem_raw[];
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  Smem& smem = *reinterpret_cast<Smem*>(smem_raw + (((base + 1023u) & ~1023u) - base));
  const int m_block = blockIdx.x;
  const int64_t t = p.token0 + blockIdx.y;
  int n_keys = p.topk;
  if (p.lengths != nullptr) {
    const int len = __ldg(p.lengths + t * p.lengths_stride);
    n_keys = len < 0 ? 0 : (len < p.topk ? len : p.topk);  // clamped, as every path does
  }
  const int n_tiles = (n_keys + kTileKeys - 1) / kTileKeys;  // topk_length skips the rest
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      cutlass::arch::ClusterBarrier::init(&smem.full_k[s], 128);  // producer threads' copies
      cutlass::arch::ClusterBarrier::init(&smem.full_v[s], 128);  // producer threads' V^T
      cutlass::arch::ClusterBarrier::init(&smem.empty_k[s], 256);  // compute threads: K read
      cutlass::arch::ClusterBarrier::init(&smem.empty_v[s], 256);  // compute threads: V^T read
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
  if (wg == 2) {
    cutlass::arch::warpgroup_reg_dealloc<kProducerRegisters>();
    produce<kDqk>(p, smem, t, n_keys, n_tiles);
  } else {
    cutlass::arch::warpgroup_reg_alloc<kConsumerRegisters>();
    consume<kDqk>(p, smem, wg, m_block, t, n_tiles);
  }
}

template <int kDqk>
cudaError_t launch_sparse_prefill_fp8(const Fp8PrefillParams& params, int m_blocks, int tokens,
                                      cudaStream_t stream) {
  auto kernel = sparse_prefill_fp8_kernel<kDqk>;
  if (const cudaError_t err = allow_dynamic_smem(kernel, fp8_prefill::kSmemBytes);
      err != cudaSuccess) {
    return err;
  }
  kernel<<<dim3(m_blocks, tokens), fp8_prefill::kThreads, fp8_prefill::kSmemBytes, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace openmla::cuda::sm90
