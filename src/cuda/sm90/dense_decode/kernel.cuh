// SM90 dense MLA decode: TMA producer + two wgmma warpgroups in FlashMLA's seesaw order.
// Design, numbers and tuning history: NOTES.md. Compile-time choices: traits.h.
//
// Grid (m_blocks, h_kv, num_sm_parts), 384 threads, one CTA per SM. CTA (m, g, w) serves query
// rows [64 m, 64 m + 64) of kv head g for every request piece of schedule worker w; a request
// piece is the key range [tok_begin, tok_end) walked in 64-key tiles, each two 32-key halves:
//
//   WG0: S_A = Q K_A^T, softmax (new max m_A) -> P_A, m_A, scale_A to smem -> O_L += P_A V_A,L
//                                                wait P_B -> O_L *= scale_B, O_L += P_B V_B,L
//   WG1: S_B = Q K_B^T -> wait P_A -> O_R *= scale_A, O_R += P_A V_A,R (async) while softmax of
//        S_B against m_A (new max m_B) -> P_B, scale_B to smem -> O_R *= scale_B, += P_B V_B,R
//
// so the two QK^T run side by side and each warpgroup's softmax overlaps GEMMs, while the next
// tile loads into the other stage. V is the first 512 dims of the same keys (read transposed,
// MN-major). A request with one split writes out/lse here; otherwise the split's fp32 partial
// goes to the workspace for combine.cu, which this grid lets launch early (PDL).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include <cute/tensor.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "cuda/sm90/dense_decode/params.h"
#include "cuda/sm90/dense_decode/traits.h"

namespace openmla::cuda::sm90 {
namespace dense_decode_detail {

// Named barriers (hardware ids; 0 is __syncthreads). Counts in threads.
enum : uint32_t {
  kBarRequest = 1,   // both compute WGs: Q loaded / previous request finished (256)
  kBarPAReady = 2,   // WG0 -> WG1: P_A, m_A, scale_A published (256)
  kBarPBReady = 3,   // WG1 -> WG0: P_B, m_B, scale_B published (256)
  kBarWg0 = 4,       // inside WG0: its smem writes visible to its own wgmma (128)
  kBarWg1 = 5,       // inside WG1 (128)
  kBarEpilogue = 6,  // row sums exchanged (256)
};

__device__ __forceinline__ void bar_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void bar_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
// Generic-proxy smem writes (P, Q, zeroed rows) made visible to the async proxy (wgmma, TMA).
// With a memory clobber, unlike CUTLASS's fence_view_async_shared: the stores before it must
// not sink below it.
__device__ __forceinline__ void fence_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

template <typename Element>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (cute::is_same_v<Element, cute::bfloat16_t>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// Byte offset of (row, 16-byte chunk) inside an 8 KB piece of 64 rows x 128 B, 128 B swizzle
// (the TMA/GMMA pattern: chunk index XOR row mod 8; pieces start on 1024 B boundaries).
__device__ __forceinline__ uint32_t swizzled_offset(int row, int chunk) {
  return static_cast<uint32_t>(row * 128 + ((chunk ^ (row & 7)) << 4));
}

// The wgmma accumulator ((2,2,N/8),M,N) seen as (rows, cols): ((2,M),(2,N/8,N)).
template <class Layout>
__device__ __forceinline__ auto acc_rowcol(Layout const& l) {
  using namespace cute;
  return make_layout(make_layout(get<0, 1>(l), get<1>(l)),
                     make_layout(get<0, 0>(l), get<0, 2>(l), get<2>(l)));
}

// A descriptor fragment moved by `bytes` (another stage). The sum goes through an empty asm so
// the compiler cannot hoist the 36 per-k-step descriptors of the loop into live registers
// (it did: 72+ registers, spills); each step's descriptor is then one add at its use.
template <class Frag>
__device__ __forceinline__ auto at_offset(Frag const& frag, uint32_t bytes) {
  cute::GmmaDescriptor desc = frag.data().desc_;
  uint32_t lo = desc.reg32_[0] + (bytes >> 4);
  asm volatile("" : "+r"(lo));
  desc.reg32_[0] = lo;
  return cute::make_tensor(cute::GMMA::DescriptorIterator{desc}, frag.layout());
}

// The key range one worker walks in request r.
struct RequestPiece {
  int seqlen;     // keys of the request (clamped to the cache capacity)
  int tok_begin;  // first key of this piece (a multiple of 64 for 64-key schedules)
  int tok_end;    // one past the last key
  int tile_begin;  // tok_begin rounded down to 64: tiles are 64-aligned (keys below are masked)
  __device__ __forceinline__ int num_tiles() const { return (tok_end - tile_begin + 63) / 64; }
};
__device__ __forceinline__ RequestPiece request_piece(const DenseDecodeParams& p, int r,
                                                      int begin_req, int begin_tok, int last_req,
                                                      int end_tok) {
  int64_t len = p.seqlens[r * p.seqlens_stride];
  len = len < 0 ? 0 : (len > p.capacity ? p.capacity : len);
  RequestPiece piece;
  piece.seqlen = static_cast<int>(len);
  piece.tok_begin = r == begin_req ? begin_tok : 0;
  piece.tok_end = min(r == last_req ? end_tok : piece.seqlen, piece.seqlen);
  if (piece.tok_begin < 0) piece.tok_begin = 0;
  if (piece.tok_end < piece.tok_begin) piece.tok_end = piece.tok_begin;
  piece.tile_begin = piece.tok_begin & ~63;
  return piece;
}

// ---------------------------------------------------------------------------------------------
// Producer: one thread issues every TMA of the CTA's tiles, in the order the consumers use them.

template <class Traits>
__device__ __forceinline__ constexpr uint32_t pieces_in_group(int g) {
  const int left = Traits::kNumPieces - g * Traits::kPiecesPerGroup;
  return static_cast<uint32_t>(left < Traits::kPiecesPerGroup ? left : Traits::kPiecesPerGroup);
}

// L2 prefetch (no smem, no barrier) of the tile at key t0 of a piece: the loads two stages deep
// are too few bytes in flight to cover HBM latency, so tiles further ahead are pulled into L2.
template <class Traits>
__device__ __forceinline__ void prefetch_tile(const DenseDecodeParams& p, const int32_t* table,
                                              int kv_head, int t0, int tok_end) {
  constexpr int kHalfN = Traits::kHalfN;
  const int page_size = p.page_size;
  if (page_size >= kHalfN) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int h0 = t0 + h * kHalfN;
      if (h0 >= tok_end) break;
      const int page = h0 / page_size;
      const int block = table[page * p.block_table_stride_n];
#pragma unroll
      for (int c = 0; c < Traits::kNumPieces; ++c) {
        cute::SM90_TMA_LOAD_4D::PREFETCH::copy(&p.tma_k, c * Traits::kPieceDims,
                                               h0 - page * page_size, kv_head, block);
      }
    }
  } else {
    const int last = min(t0 + Traits::kBlockN, tok_end);
    for (int k = t0; k < last; k += page_size) {
      const int block = table[(k / page_size) * p.block_table_stride_n];
#pragma unroll
      for (int c = 0; c < Traits::kNumPieces; ++c) {
        cute::SM90_TMA_LOAD_4D::PREFETCH::copy(&p.tma_k, c * Traits::kPieceDims, 0, kv_head,
                                               block);
      }
    }
  }
}

template <class Traits>
__device__ __forceinline__ void produce(const DenseDecodeParams& p,
                                        typename Traits::SharedStorage& smem, int kv_head,
                                        int begin_req, int begin_tok, int last_req, int end_tok) {
  using Element = typename Traits::Element;
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  constexpr int kPieces = Traits::kNumPieces;
  constexpr int kHalfN = Traits::kHalfN;
  const int page_size = p.page_size;
  const int ahead = p.l2_prefetch_tiles;
  int tile = 0;
  for (int r = begin_req; r <= last_req; ++r) {
    const RequestPiece piece = request_piece(p, r, begin_req, begin_tok, last_req, end_tok);
    const int32_t* table = p.block_table + r * p.block_table_stride_b;
    for (int t0 = piece.tile_begin; t0 < piece.tok_end; t0 += Traits::kBlockN, ++tile) {
      const int stage = tile & 1;
      const uint32_t phase = (tile >> 1) & 1;
      // Tiles `ahead` further on into L2 (at a piece's first tile, all of 1 .. ahead).
      if (ahead > 0) {
        for (int a = t0 == piece.tile_begin ? 1 : ahead; a <= ahead; ++a) {
          const int ta = t0 + a * Traits::kBlockN;
          if (ta >= piece.tok_end) break;
          prefetch_tile<Traits>(p, table, kv_head, ta, piece.tok_end);
        }
      }
      Barrier::wait(&smem.empty[stage], phase ^ 1);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int h0 = t0 + h * kHalfN;
        const int valid = max(0, min(kHalfN, piece.tok_end - h0));  // keys of this half to load
        Element* dst = smem.k[stage] + h * Traits::kHalfElems;
        uint64_t* full = smem.full[stage][h];
        if (page_size >= kHalfN) {
          // A page holds whole halves: one box of 32 keys per piece (none past the end).
          const uint32_t bytes = valid > 0 ? Traits::kPieceBytes : 0;
#pragma unroll
          for (int g = 0; g < Traits::kPieceGroups; ++g) {
            Barrier::arrive_and_expect_tx(&full[g], bytes * pieces_in_group<Traits>(g));
          }
          if (valid > 0) {
            const int page = h0 / page_size;
            const int in_page = h0 - page * page_size;
            const int block = table[page * p.block_table_stride_n];
#pragma unroll
            for (int c = 0; c < kPieces; ++c) {
              cute::SM90_TMA_LOAD_4D::copy(&p.tma_k, &full[c / Traits::kPiecesPerGroup], p.cache_hint,
                                           dst + c * Traits::kPieceElems, c * Traits::kPieceDims,
                                           in_page, kv_head, block);
            }
          }
        } else {
          // A half spans several pages: one box of page_size keys per (page, piece); pages past
          // the piece's last key are not loaded (the consumers zero those rows).
          const int pages = (valid + page_size - 1) / page_size;
          const int first_page = h0 / page_size;
          const uint32_t bytes = static_cast<uint32_t>(pages * page_size * 128);
#pragma unroll
          for (int g = 0; g < Traits::kPieceGroups; ++g) {
            Barrier::arrive_and_expect_tx(&full[g], bytes * pieces_in_group<Traits>(g));
          }
          for (int j0 = 0; j0 < pages; j0 += 4) {
            int block[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
              block[u] = j0 + u < pages ? table[(first_page + j0 + u) * p.block_table_stride_n] : 0;
            }
#pragma unroll
            for (int u = 0; u < 4; ++u) {
              if (j0 + u >= pages) break;
              const int row0 = (j0 + u) * page_size;
#pragma unroll
              for (int c = 0; c < kPieces; ++c) {
                cute::SM90_TMA_LOAD_4D::copy(
                    &p.tma_k, &full[c / Traits::kPiecesPerGroup], p.cache_hint,
                    dst + c * Traits::kPieceElems + row0 * Traits::kPieceDims,
                    c * Traits::kPieceDims, 0, kv_head, block[u]);
              }
            }
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Compute warpgroups.

// S = Q K^T over all pieces, starting each piece's four k-steps as soon as that piece lands.
template <class Traits, class Mma, class TQ, class TK, class TS>
__device__ __forceinline__ void gemm_qk(Mma& mma, TQ const& tSrQ, TK const& tSrK, TS& tSrS,
                                        uint64_t* full, uint32_t phase) {
  using namespace cute;
  warpgroup_fence_operand(tSrS);
  warpgroup_arrive();
#pragma unroll
  for (int c = 0; c < Traits::kNumPieces; ++c) {
    if (c % Traits::kPiecesPerGroup == 0) {
      cutlass::arch::ClusterBarrier::wait(&full[c / Traits::kPiecesPerGroup], phase);
      if (c > 0) warpgroup_arrive();  // the wait's branches sit between these wgmmas and the last
    }
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      mma.accumulate_ = (c == 0 && kk == 0) ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
      gemm(mma, tSrQ(_, _, c * 4 + kk), tSrK(_, _, c * 4 + kk), tSrS);
    }
  }
  warpgroup_commit_batch();
  warpgroup_wait<0>();
  warpgroup_fence_operand(tSrS);
}

// O += P V (issued, not waited for).
template <class Mma, class TP, class TV, class TO>
__device__ __forceinline__ void gemm_pv(Mma& mma, TP const& tOrP, TV const& tOrV, TO& tOrO) {
  using namespace cute;
  warpgroup_fence_operand(tOrO);
  warpgroup_arrive();
  mma.accumulate_ = GMMA::ScaleOut::One;
  gemm(mma, tOrP, tOrV, tOrO);
  warpgroup_commit_batch();
}

template <class TO>
__device__ __forceinline__ void wait_pv(TO& tOrO) {
  cute::warpgroup_wait<0>();
  cute::warpgroup_fence_operand(tOrO);
}

// Keys outside [lower, limit[i]) of row i (absolute key indices) get -inf.
template <class TS, class TC>
__device__ __forceinline__ void mask_tile(TS& S, TC const& cS, int t0, int lower,
                                          const int (&limit)[2]) {
  using namespace cute;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int j = 0; j < size<1>(S); ++j) {
      const int key = t0 + get<1>(cS(i, j));
      if (key >= limit[i] || key < lower) S(i, j) = -INFINITY;
    }
  }
}

// P (the softmax numerators, in S's registers) to smem as Element: 64 rows x 32 keys, 64 B
// rows, 64 B swizzle (16-byte chunk index XOR bits 1..2 of the row; 512 B-aligned base).
template <class Element, class TS, class TC>
__device__ __forceinline__ void store_p(Element* sP, TS const& S, TC const& cS) {
  using namespace cute;
  char* base = reinterpret_cast<char*>(sP);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = get<0>(cS(i, 0));
#pragma unroll
    for (int j = 0; j < size<1>(S); j += 2) {
      const int col = get<1>(cS(i, j));
      const uint32_t off = row * 64 + ((((col >> 3) ^ (row >> 1)) & 3) << 4) + (col & 7) * 2;
      *reinterpret_cast<uint32_t*>(base + off) = pack2<Element>(S(i, j), S(i, j + 1));
    }
  }
}

// Zero V rows [valid, 32) of the 8 V pieces of a half, so keys past the piece's end (unused
// cache slots may hold anything, NaN too, or were never loaded) add 0 * 0 to P V.
template <class Traits>
__device__ __forceinline__ void zero_v_rows(typename Traits::Element* half, int valid,
                                            int thread) {
  char* base = reinterpret_cast<char*>(half);
  const int chunks = (Traits::kHalfN - valid) * Traits::kNumVPieces * 8;  // 16 B chunks
  for (int idx = thread; idx < chunks; idx += 128) {
    const int row = valid + idx / (Traits::kNumVPieces * 8);
    const int k = idx % (Traits::kNumVPieces * 8);
    *reinterpret_cast<uint4*>(base + (k / 8) * Traits::kPieceBytes + row * 128 + (k % 8) * 16) =
        make_uint4(0u, 0u, 0u, 0u);
  }
}

// Max (or sum) of row i of this thread's accumulator values, as a tree: the sequential chain put
// 16 dependent operations on the path WG1 waits on.
template <bool kMax, class TS>
__device__ __forceinline__ float row_reduce(TS const& S, int i) {
  constexpr int n = cute::size<1>(TS{}.layout());
  float v[n];
#pragma unroll
  for (int j = 0; j < n; ++j) v[j] = S(i, j);
#pragma unroll
  for (int w = n / 2; w > 0; w /= 2) {
#pragma unroll
    for (int j = 0; j < w; ++j) v[j] = kMax ? fmaxf(v[j], v[j + w]) : v[j] + v[j + w];
  }
  return v[0];
}

template <class TO>
__device__ __forceinline__ void rescale_rows(TO& O, const float (&scale)[2]) {
  using namespace cute;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int j = 0; j < size<1>(O); ++j) O(i, j) *= scale[i];
  }
}

// Q rows of (request, kv head, m_block) into smem; rows past the request's rows are zero.
template <class Traits>
__device__ __forceinline__ void load_q(const DenseDecodeParams& p, typename Traits::Element* sQ,
                                       int r, int kv_head, int m_block, int thread) {
  constexpr int kChunksPerRow = Traits::kHeadDimQK / 8;  // 16 B chunks
  constexpr int kChunks = Traits::kBlockM * kChunksPerRow;
  static_assert(kChunks % Traits::kNumMmaThreads == 0);
  const char* q = static_cast<const char*>(p.q);
  char* base = reinterpret_cast<char*>(sQ);
  // Opaque to the compiler: else it hoists all 18 chunks' addresses out of the request loop
  // into registers the MMA warpgroups need.
  asm volatile("" : "+r"(thread));
  uint4 v[kChunks / Traits::kNumMmaThreads];
#pragma unroll
  for (int it = 0; it < kChunks / Traits::kNumMmaThreads; ++it) {
    const int idx = it * Traits::kNumMmaThreads + thread;
    const int row = idx / kChunksPerRow, ch = idx % kChunksPerRow;
    const int grow = m_block * Traits::kBlockM + row;
    v[it] = make_uint4(0u, 0u, 0u, 0u);
    if (grow < p.rows) {
      const int s = grow / p.group, h = kv_head * p.group + grow % p.group;
      const int64_t off = r * p.q_stride_b + s * p.q_stride_s + h * p.q_stride_h + ch * 8;
      v[it] = __ldg(reinterpret_cast<const uint4*>(q + off * 2));
    }
  }
#pragma unroll
  for (int it = 0; it < kChunks / Traits::kNumMmaThreads; ++it) {
    const int idx = it * Traits::kNumMmaThreads + thread;
    const int row = idx / kChunksPerRow, ch = idx % kChunksPerRow;
    *reinterpret_cast<uint4*>(base + (ch / 8) * (Traits::kQPieceElems * 2) +
                              swizzled_offset(row, ch % 8)) =
        v[it];
  }
}

template <class Traits>
__device__ __forceinline__ void consume(const DenseDecodeParams& p,
                                        typename Traits::SharedStorage& smem, int wg, int thread,
                                        int m_block, int kv_head, int begin_req, int begin_tok,
                                        int last_req, int end_tok, int begin_split) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kBlockN = Traits::kBlockN, kHalfN = Traits::kHalfN;
  const int t = thread - wg * 128;  // thread in its warpgroup
  const int lane = t % 32;

  typename Traits::TiledMmaQK mma_qk;
  typename Traits::TiledMmaPV mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(t);
  auto thr_pv = mma_pv.get_thread_slice(t);

  Tensor sQ = make_tensor(make_smem_ptr(smem.q), typename Traits::SmemLayoutQ{});  // (64,D)
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);                                  // (MMA,1,D/16)
  // Descriptors of stage 0, half 0; other (stage, half) by byte offset (at_offset).
  Tensor tSrK = thr_qk.partition_fragment_B(
      make_tensor(make_smem_ptr(smem.k[0]), typename Traits::SmemLayoutKHalf{}));  // (MMA,1,D/16)
  Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<64>, Int<kHalfN>>{});  // (MMA,1,1) fp32
  Tensor S = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));             // (2,8)
  Tensor cS = make_identity_tensor(Shape<Int<64>, Int<kHalfN>>{});
  Tensor tScS = thr_qk.partition_C(cS);
  Tensor cS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));  // (2,8) -> (row,key)

  // P of (stage, half): the half's RoPE piece at d 576, a buffer of its own at d 512.
  Element* const sP0 = Traits::kPInKTile ? smem.k[0] + Traits::kNumVPieces * Traits::kPieceElems
                                         : smem.p[0];
  auto p_bytes = [](int stage, int half) -> uint32_t {
    return Traits::kPInKTile ? (stage * Traits::kTileElems + half * Traits::kHalfElems) * 2
                             : (stage * 2 + half) * Traits::kPElems * 2;
  };
  auto sP = [&](int stage, int half) { return sP0 + p_bytes(stage, half) / 2; };
  Tensor tOrP = thr_pv.partition_fragment_A(
      make_tensor(make_smem_ptr(sP0), typename Traits::SmemLayoutP{}));  // (MMA,1,2)
  // This warpgroup's V dims [256 wg, 256 wg + 256) = pieces [4 wg, 4 wg + 4) of a half.
  Tensor tOrV = thr_pv.partition_fragment_B(make_tensor(
      make_smem_ptr(smem.k[0] + wg * (Traits::kNumVPieces / 2) * Traits::kPieceElems),
      typename Traits::SmemLayoutVHalf{}));  // (MMA,1,2)
  auto kv_bytes = [](int stage, int half) -> uint32_t {
    return (stage * Traits::kTileElems + half * Traits::kHalfElems) * 2;
  };
  Tensor tOrO = partition_fragment_C(mma_pv, Shape<Int<64>, Int<Traits::kVHalfDims>>{});  // fp32
  Tensor O = make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));                       // (2,128)
  Tensor cO = make_identity_tensor(Shape<Int<64>, Int<Traits::kVHalfDims>>{});
  Tensor tOcO = thr_pv.partition_C(cO);
  Tensor cO_rc = make_tensor(tOcO.data(), acc_rowcol(tOcO.layout()));  // (2,128) -> (row,dim)

  int row_of[2];  // rows (in the 64-row block) this thread holds
#pragma unroll
  for (int i = 0; i < 2; ++i) row_of[i] = get<0>(cS_rc(i, 0));
  const bool row_leader = (lane % 4) == 0;  // one of the 4 threads sharing a row writes stats
  const float sl2 = p.scale_log2;

  int tile = 0;  // tiles consumed so far by this CTA (stage = tile & 1)
  for (int r = begin_req; r <= last_req; ++r) {
    const RequestPiece piece = request_piece(p, r, begin_req, begin_tok, last_req, end_tok);
    const int n_tiles = piece.num_tiles();
    const int first_split = p.num_splits[r * p.num_splits_stride];
    const int n_splits = p.num_splits[(r + 1) * p.num_splits_stride] - first_split;
    const int split = begin_split + (r - begin_req);

    // Every QK^T of the previous request is done (its epilogue passed kBarEpilogue).
    if (n_tiles > 0) load_q<Traits>(p, smem.q, r, kv_head, m_block, thread);
    fence_async_smem();
    bar_sync(kBarRequest, 256);

    int limit[2];  // keys >= limit are masked (piece end, causal)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int grow = m_block * 64 + row_of[i];
      limit[i] = piece.tok_end;
      if (p.causal && grow < p.rows) {
        limit[i] = min(limit[i], piece.seqlen - p.s_q + grow / p.group + 1);
      }
    }
    const int min_limit = min(limit[0], limit[1]);
    float m_run[2] = {-INFINITY, -INFINITY};
    float l_run[2] = {0.f, 0.f};  // this thread's share of the row sums (quad-reduced at the end)
    clear(tOrO);

    for (int it = 0; it < n_tiles; ++it) {
      const int ti = tile + it;
      const int st = ti & 1;
      const uint32_t phase = (ti >> 1) & 1;
      // This warpgroup's half: keys [k0, k0 + 32); `valid` of them before the piece's end.
      const int k0 = piece.tile_begin + it * kBlockN + wg * kHalfN;
      const int valid = max(0, min(kHalfN, piece.tok_end - k0));

      gemm_qk<Traits>(mma_qk, at_offset(tSrQ, 0), at_offset(tSrK, kv_bytes(st, wg)), tSrS,
                      smem.full[st][wg], phase);
      if (k0 + kHalfN > min_limit || k0 < piece.tok_begin) {
        mask_tile(S, cS_rc, k0, piece.tok_begin, limit);
      }
      float mx[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) mx[i] = quad_max(row_reduce<true>(S, i));

      if (wg == 0) {
        // ---- WG0: softmax of half A against the running max, P_A ----
        float scale_a[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const float m_new = fmaxf(m_run[i], mx[i]);
          const float base = m_new == -INFINITY ? 0.f : m_new * sl2;
          scale_a[i] = exp2_approx(m_run[i] * sl2 - base);
#pragma unroll
          for (int j = 0; j < size<1>(S); ++j) S(i, j) = exp2_approx(S(i, j) * sl2 - base);
          l_run[i] = l_run[i] * scale_a[i] + row_reduce<false>(S, i);
          m_run[i] = m_new;
        }
        store_p(sP(st, 0), S, cS_rc);
        if (row_leader) {
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            smem.row_max[st][0][row_of[i]] = m_run[i];
            smem.row_scale[st][0][row_of[i]] = scale_a[i];
          }
        }
        if (valid < kHalfN) zero_v_rows<Traits>(smem.k[st], valid, t);
        fence_async_smem();
        bar_arrive(kBarPAReady, 256);
        bar_sync(kBarWg0, 128);
        rescale_rows(O, scale_a);
        gemm_pv(mma_pv, at_offset(tOrP, p_bytes(st, 0)), at_offset(tOrV, kv_bytes(st, 0)), tOrO);
        wait_pv(tOrO);
        // ---- WG0: P_B from WG1 ----
        bar_sync(kBarPBReady, 256);
        float scale_b[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          scale_b[i] = smem.row_scale[st][1][row_of[i]];
          m_run[i] = smem.row_max[st][1][row_of[i]];
          l_run[i] *= scale_b[i];
        }
        rescale_rows(O, scale_b);
        gemm_pv(mma_pv, at_offset(tOrP, p_bytes(st, 1)), at_offset(tOrV, kv_bytes(st, 1)), tOrO);
        wait_pv(tOrO);
      } else {
        // ---- WG1: P_A from WG0, then softmax of half B against m_A while P_A V runs ----
        bar_sync(kBarPAReady, 256);
        float scale_a[2], scale_b[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          scale_a[i] = smem.row_scale[st][0][row_of[i]];
          m_run[i] = smem.row_max[st][0][row_of[i]];
        }
        rescale_rows(O, scale_a);
        gemm_pv(mma_pv, at_offset(tOrP, p_bytes(st, 0)), at_offset(tOrV, kv_bytes(st, 0)), tOrO);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const float m_new = fmaxf(m_run[i], mx[i]);
          const float base = m_new == -INFINITY ? 0.f : m_new * sl2;
          scale_b[i] = exp2_approx(m_run[i] * sl2 - base);
#pragma unroll
          for (int j = 0; j < size<1>(S); ++j) S(i, j) = exp2_approx(S(i, j) * sl2 - base);
          l_run[i] = l_run[i] * scale_a[i] * scale_b[i] + row_reduce<false>(S, i);
          m_run[i] = m_new;
        }
        store_p(sP(st, 1), S, cS_rc);
        if (row_leader) {
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            smem.row_max[st][1][row_of[i]] = m_run[i];
            smem.row_scale[st][1][row_of[i]] = scale_b[i];
          }
        }
        if (valid < kHalfN) zero_v_rows<Traits>(smem.k[st] + Traits::kHalfElems, valid, t);
        fence_async_smem();
        bar_arrive(kBarPBReady, 256);
        bar_sync(kBarWg1, 128);
        wait_pv(tOrO);
        rescale_rows(O, scale_b);
        gemm_pv(mma_pv, at_offset(tOrP, p_bytes(st, 1)), at_offset(tOrV, kv_bytes(st, 1)), tOrO);
        wait_pv(tOrO);
      }
      if (lane == 0) cutlass::arch::ClusterBarrier::arrive(&smem.empty[st]);
    }
    tile += n_tiles;

    // ---- epilogue: row sums of both warpgroups, normalise, write ----
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      l_run[i] = quad_sum(l_run[i]);
      if (row_leader) smem.row_sum[wg][row_of[i]] = l_run[i];
    }
    bar_sync(kBarEpilogue, 256);
    const bool single = n_splits == 1;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int grow = m_block * 64 + row_of[i];
      const float l = smem.row_sum[0][row_of[i]] + smem.row_sum[1][row_of[i]];
      const float inv = l > 0.f ? 1.f / l : 0.f;
      if (grow >= p.rows) continue;
      const int s = grow / p.group, h = kv_head * p.group + grow % p.group;
      const float lse = l > 0.f ? m_run[i] * p.scale + logf(l) : (single ? INFINITY : -INFINITY);
      if (single) {
        char* out = static_cast<char*>(p.out) +
                    (r * p.out_stride_b + s * p.out_stride_s + h * p.out_stride_h +
                     wg * Traits::kVHalfDims) * 2;
#pragma unroll
        for (int j = 0; j < size<1>(O); j += 2) {
          const int col = get<1>(cO_rc(i, j));
          *reinterpret_cast<uint32_t*>(out + col * 2) =
              pack2<Element>(O(i, j) * inv, O(i, j + 1) * inv);
        }
        if (wg == 0 && row_leader) {
          p.lse[r * p.lse_stride_b + h * p.lse_stride_h + s * p.lse_stride_s] = lse;
        }
      } else {
        const int64_t prow = (static_cast<int64_t>(split) * p.s_q + s) * p.h_q + h;
        float* out = p.o_accum + prow * Traits::kHeadDimV + wg * Traits::kVHalfDims;
#pragma unroll
        for (int j = 0; j < size<1>(O); j += 2) {
          const int col = get<1>(cO_rc(i, j));
          *reinterpret_cast<float2*>(out + col) = make_float2(O(i, j) * inv, O(i, j + 1) * inv);
        }
        if (wg == 0 && row_leader) p.lse_accum[prow] = lse;
      }
    }
  }
}

}  // namespace dense_decode_detail

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
  if (thread == 0) {
#pragma unroll
    for (int s = 0; s < Traits::kStages; ++s) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int g = 0; g < Traits::kPieceGroups; ++g) {
          cutlass::arch::ClusterBarrier::init(&smem.full[s][h][g], 1);
        }
      }
      cutlass::arch::ClusterBarrier::init(&smem.empty[s], 8);  // lane 0 of the 8 compute warps
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  // The combine grid may launch now; it waits for this grid to finish before reading partials.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");

  // The worker's range is read after setmaxnreg: values live across it get spilled.
  auto read_range = [&](int (&m)[5]) {
    const int32_t* meta = params.metadata + blockIdx.z * params.metadata_stride_part;
#pragma unroll
    for (int f = 0; f < 5; ++f) m[f] = meta[f * params.metadata_stride_field];
  };
  if (wg == 2) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    if (thread == 256) {
      int m[5];
      read_range(m);
      cute::prefetch_tma_descriptor(&params.tma_k);
      produce<Traits>(params, smem, blockIdx.y, m[0], m[1], m[2], m[3]);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kMmaRegisters>();
    int m[5];
    read_range(m);
    consume<Traits>(params, smem, wg, thread, blockIdx.x, blockIdx.y, m[0], m[1], m[2], m[3],
                    m[4]);
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
  static const cudaError_t attr_error = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes);
  if (attr_error != cudaSuccess) return attr_error;
  const dim3 grid(num_m_blocks, h_kv, num_sm_parts);
  kernel<<<grid, Traits::kNumThreads, Traits::kSmemBytes, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace openmla::cuda::sm90
