// SM90 dense MLA decode: TMA producer + two wgmma warpgroups in FlashMLA's seesaw order.
// Design, numbers and tuning history: NOTES.md. Compile-time choices: traits.h.
//
// Grid (m_blocks, h_kv, num_sm_parts), 384 threads, one CTA per SM. CTA (m, g, w) serves query
// rows [64 m, 64 m + 64) of kv head g for every request piece of schedule worker w; a request
// piece is the key range [tok_begin, tok_end) walked in pairs of 64-key tiles (tile 0 in stage 0,
// tile 1 in stage 1). Per pair, with m the running max before it:
//
//   WG0: S0 = Q K0^T; m0 = max(m, rowmax S0); P0 = exp(S0 - m0) -> smem (for WG1), m0 -> smem
//        O_L *= exp(m - m0); O_L += P0 V0_L            (P0 from registers)
//        wait P1 -> O_L *= exp(m0 - m1); O_L += P1 V1_L
//   WG1: S1 = Q K1^T; wait P0 -> O_R *= exp(m - m0); O_R += P0 V0_R   (issued, runs while:)
//        m1 = max(m0, rowmax S1); P1 = exp(S1 - m1) -> smem, m1, exp(m0 - m1) -> smem
//        O_R *= exp(m0 - m1); O_R += P1 V1_R           (P1 from registers)
//
// so the two QK^T run side by side and each softmax overlaps the other warpgroup's GEMMs. Each
// part of a stage (V left, V right, RoPE) is handed back to the producer by its last reader, so
// the next pair's tiles load while this pair's PVs run. V is the first 512 dims of the same keys
// (read transposed, MN-major). A request with one split writes out/lse here; otherwise the
// split's fp32 partial goes to the workspace for combine.cu, which this grid lets launch early.
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

#include "cuda/sm90/dense_decode/launch.h"
#include "cuda/sm90/dense_decode/params.h"
#include "cuda/sm90/dense_decode/traits.h"

namespace openmla::cuda::sm90 {
namespace dense_decode_detail {

// Named barriers (hardware ids; 0 is __syncthreads). Counts in threads.
enum : uint32_t {
  kBarRequest = 1,   // both compute WGs: Q loaded / previous request finished (256)
  kBarP0Ready = 2,   // WG0 -> WG1: P0, m0 published (256)
  kBarP1Ready = 3,   // WG1 -> WG0: P1, m1, scale1 published (256)
  kBarWg0 = 4,       // inside WG0: its zeroed V rows visible to its own wgmma (128)
  kBarWg1 = 5,       // inside WG1 (128)
  kBarEpilogue = 6,  // row sums exchanged (256)
  kBarQK0Done = 7,   // WG0 -> WG1: S0 computed, so QK1 starts now and runs under softmax 0 (256)
};

__device__ __forceinline__ void bar_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void bar_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
// True in every thread of the `threads` using barrier `id` when `pred` holds in any of them: a
// choice between wgmma sequences must be uniform over the warpgroup (`.sync.aligned`).
__device__ __forceinline__ bool bar_any(uint32_t id, uint32_t threads, bool pred) {
  uint32_t any;
  asm volatile(
      "{\n\t.reg .pred p, q;\n\t"
      "setp.ne.u32 p, %1, 0;\n\t"
      "bar.red.or.pred q, %2, %3, p;\n\t"
      "selp.u32 %0, 1, 0, q;\n\t}"
      : "=r"(any)
      : "r"(static_cast<uint32_t>(pred)), "r"(id), "r"(threads)
      : "memory");
  return any != 0;
}
// Generic-proxy smem writes (P, Q, zeroed rows) ordered before async-proxy accesses (wgmma reads,
// the next TMA write into the same bytes). With a memory clobber, unlike CUTLASS's
// fence_view_async_shared: the stores before it must not sink below it.
__device__ __forceinline__ void fence_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// Cluster of two CTAs (DenseDecodeTuning::multicast, off by default: measured slower, NOTES.md
// v6): the m-blocks 2i, 2i+1 of one (kv head, worker) each load half the pieces of every tile
// and multicast them to both, so each SM fetches half the bytes from L2. A part may be refilled
// only when the consumers of both CTAs are done with it: a warp releases it on the empty barrier
// of every CTA of the cluster, and the producer waits with cluster-scope acquire. Unclustered: the
// plain CTA-scope arrive.
__device__ __forceinline__ void release_part(uint64_t* empty, int lane, int cluster_size) {
  if (lane != 0) return;
  if (cluster_size == 1) {
    cutlass::arch::ClusterBarrier::arrive(empty);
  } else {
    cutlass::arch::ClusterBarrier::arrive(empty, 0, 1);
    cutlass::arch::ClusterBarrier::arrive(empty, 1, 1);
  }
}
__device__ __forceinline__ void wait_empty(uint64_t* bar, uint32_t phase, int cluster_size) {
  if (cluster_size == 1) {
    cutlass::arch::ClusterBarrier::wait(bar, phase);
    return;
  }
  const uint32_t addr = cute::cast_smem_ptr_to_uint(bar);
  asm volatile(
      "{\n\t.reg .pred done;\n\t"
      "WAIT_EMPTY:\n\t"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n\t"
      "@!done bra WAIT_EMPTY;\n\t}"
      ::"r"(addr), "r"(phase) : "memory");
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

// Timeline stamps (DenseDecodeParams::trace): one thread of each role of CTA (0,0,0) records
// clock64 at fixed points of its first trace_pairs pairs. Compiled in only with
// OPENMLA_DENSE_DECODE_TRACE (CMake option of the same name; tools/profile_dense_decode.sh):
// the stamps cost the compute warpgroups registers they do not have to spare.
constexpr int kTraceEvents = 16;
struct Tracer {
#if defined(OPENMLA_DENSE_DECODE_TRACE)
  long long* row = nullptr;  // this role's [pair][event] rows, null when not tracing
  __device__ __forceinline__ Tracer(const DenseDecodeParams& p, int role, bool leader) {
    if (p.trace != nullptr && leader && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) {
      row = p.trace + static_cast<int64_t>(role) * p.trace_pairs * kTraceEvents;
      trace_pairs_ = p.trace_pairs;
    }
  }
  __device__ __forceinline__ void mark(int pair, int event) const {
    if (row != nullptr && pair < trace_pairs_) row[pair * kTraceEvents + event] = clock64();
  }
  int trace_pairs_ = 0;
#else
  __device__ __forceinline__ Tracer(const DenseDecodeParams&, int, bool) {}
  __device__ __forceinline__ void mark(int, int) const {}
#endif
};

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
__device__ __forceinline__ constexpr int part_first_piece(int part) {
  return part * 4;  // L: 0-3, R: 4-7, RoPE: 8
}
template <class Traits>
__device__ __forceinline__ constexpr int part_pieces(int part) {
  return part == Traits::kPartRope ? Traits::kNumPieces - 8 : 4;
}

// L2 prefetch (no smem, no barrier) of the tile at key t0 of a piece: a runtime knob
// (DenseDecodeTuning::l2_prefetch_tiles, default 0) that measured slower in v3.
template <class Traits>
__device__ __forceinline__ void prefetch_tile(const DenseDecodeParams& p, const int32_t* table,
                                              int kv_head, int t0, int tok_end) {
  const int page_size = p.page_size;
  const int rows = page_size < Traits::kBlockN ? page_size : Traits::kBlockN;
  const int last = min(t0 + Traits::kBlockN, tok_end);
  for (int k = t0; k < last; k += rows) {
    const int page = k / page_size;
    const int block = table[page * p.block_table_stride_n];
#pragma unroll
    for (int c = 0; c < Traits::kNumPieces; ++c) {
      cute::SM90_TMA_LOAD_4D::PREFETCH::copy(&p.tma_k, c * Traits::kPieceDims,
                                             k - page * page_size, kv_head, block);
    }
  }
}

// One part of the tile at key t0 (`valid` keys of it before the piece's end) into `stage`.
// Pages of >= 64 keys: one 64-key box per piece. Smaller pages: one box per (page, piece), pages
// past the last valid key not loaded (the consumers zero those V rows and mask those keys).
// (A producer warp holding 32 block ids a lane instead of re-reading the table per part measured
// no better: the parts' spacing is the SM's TMA fetch rate, NOTES.md v5.)
template <class Traits>
__device__ __forceinline__ void load_part(const DenseDecodeParams& p,
                                          typename Traits::SharedStorage& smem,
                                          const int32_t* table, int kv_head, int stage, int part,
                                          int t0, int valid, uint32_t phase) {
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  const int page_size = p.page_size;
  const int first = part_first_piece<Traits>(part), n = part_pieces<Traits>(part);
  wait_empty(&smem.empty[stage][part], phase ^ 1, p.cluster_size);
  uint64_t* full = &smem.full[stage][part];
  typename Traits::Element* dst = smem.k[stage] + first * Traits::kPieceElems;
  // One box: alone, or (cluster) only the pieces this CTA issues, multicast to both CTAs (the
  // full barrier at the same offset in each receives the bytes). Pieces alternate between the
  // two CTAs, shifted by the stage so each issues 9 of a pair's 18 at d 576.
  auto load_box = [&](int c, void* smem_dst, int row, int block) {
    if (p.cluster_size == 1) {
      cute::SM90_TMA_LOAD_4D::copy(&p.tma_k, full, p.cache_hint, smem_dst,
                                   (first + c) * Traits::kPieceDims, row, kv_head, block);
    } else if (((first + c + stage) & 1) == static_cast<int>(blockIdx.x & 1)) {  // rank
      cute::SM90_TMA_LOAD_MULTICAST_4D::copy(&p.tma_k, full, 0x3, p.cache_hint, smem_dst,
                                             (first + c) * Traits::kPieceDims, row, kv_head,
                                             block);
    }
  };
  if (page_size >= Traits::kBlockN) {
    Barrier::arrive_and_expect_tx(full, valid > 0 ? n * Traits::kPieceBytes : 0);
    if (valid > 0) {
      const int page = t0 / page_size;
      const int block = table[page * p.block_table_stride_n];
      for (int c = 0; c < n; ++c) {
        load_box(c, dst + c * Traits::kPieceElems, t0 - page * page_size, block);
      }
    }
  } else {
    const int pages = (valid + page_size - 1) / page_size;
    const int first_page = t0 / page_size;
    Barrier::arrive_and_expect_tx(full, static_cast<uint32_t>(n * pages * page_size * 128));
    for (int j = 0; j < pages; ++j) {
      const int block = table[(first_page + j) * p.block_table_stride_n];
      for (int c = 0; c < n; ++c) {
        load_box(c, dst + c * Traits::kPieceElems + j * page_size * Traits::kPieceDims, 0, block);
      }
    }
  }
}

template <class Traits>
__device__ __forceinline__ void produce(const DenseDecodeParams& p,
                                        typename Traits::SharedStorage& smem, int kv_head,
                                        int begin_req, int begin_tok, int last_req, int end_tok) {
  const int ahead = p.l2_prefetch_tiles;
  const Tracer trace(p, 2, true);
  int pair = 0;  // pairs loaded so far: the phase of every barrier of both stages
  for (int r = begin_req; r <= last_req; ++r) {
    const RequestPiece piece = request_piece(p, r, begin_req, begin_tok, last_req, end_tok);
    const int32_t* table = p.block_table + r * p.block_table_stride_b;
    const int n_tiles = piece.num_tiles();
    for (int it = 0; it < n_tiles; it += 2, ++pair) {
      const uint32_t phase = pair & 1;
      if (ahead > 0) {
        for (int a = it == 0 ? 2 : ahead + 1; a <= ahead + 1; ++a) {
          if (it + a >= n_tiles) break;
          prefetch_tile<Traits>(p, table, kv_head, piece.tile_begin + (it + a) * Traits::kBlockN,
                                piece.tok_end);
        }
      }
      // Tile 1 of a pair past the piece's end is an empty load (0 bytes): every barrier still
      // completes one phase per pair, so both sides count pairs alone.
      trace.mark(pair, 0);
#pragma unroll 1
      for (int s = 0; s < 2; ++s) {
        const int t0 = piece.tile_begin + (it + s) * Traits::kBlockN;
        const int valid = max(0, min(Traits::kBlockN, piece.tok_end - t0));
#pragma unroll 1
        for (int part = 0; part < Traits::kNumParts; ++part) {
          load_part<Traits>(p, smem, table, kv_head, s, part, t0, valid, phase);
          trace.mark(pair, 1 + s * Traits::kNumParts + part);  // part issued
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Compute warpgroups.

// S = Q K^T over all pieces, starting each part's k-steps as soon as that part lands.
template <class Traits, class Mma, class TQ, class TK, class TS>
__device__ __forceinline__ void gemm_qk(Mma& mma, TQ const& tSrQ, TK const& tSrK, TS& tSrS,
                                        uint64_t* full, uint32_t phase) {
  using namespace cute;
  warpgroup_fence_operand(tSrS);
#pragma unroll
  for (int part = 0; part < Traits::kNumParts; ++part) {
    cutlass::arch::ClusterBarrier::wait(&full[part], phase);
    warpgroup_arrive();
    constexpr int kSteps = Traits::kPieceDims / 16;
#pragma unroll
    for (int c = part_first_piece<Traits>(part);
         c < part_first_piece<Traits>(part) + part_pieces<Traits>(part); ++c) {
#pragma unroll
      for (int kk = 0; kk < kSteps; ++kk) {
        mma.accumulate_ = (c == 0 && kk == 0) ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
        gemm(mma, tSrQ(_, _, c * kSteps + kk), tSrK(_, _, c * kSteps + kk), tSrS);
      }
    }
  }
  warpgroup_commit_batch();
  warpgroup_wait<0>();
  warpgroup_fence_operand(tSrS);
}

// O += P V with P from registers (issued and committed, not waited for).
template <class Mma, class TP, class TV, class TO>
__device__ __forceinline__ void gemm_pv(Mma& mma, TP& tOrP, TV const& tOrV, TO& tOrO) {
  using namespace cute;
  warpgroup_fence_operand(tOrP);
  warpgroup_fence_operand(tOrO);
  warpgroup_arrive();
  mma.accumulate_ = GMMA::ScaleOut::One;
  gemm(mma, tOrP, tOrV, tOrO);
  warpgroup_commit_batch();
}

template <class TO, class TP>
__device__ __forceinline__ void wait_pv(TO& tOrO, TP& tOrP) {
  cute::warpgroup_wait<0>();
  cute::warpgroup_fence_operand(tOrO);
  cute::warpgroup_fence_operand(tOrP);
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

// Zero V rows [valid, 64) of the 8 V pieces of a tile, so keys past the piece's end (unused
// cache slots may hold anything, NaN too, or were never loaded) add 0 * 0 to P V. A row is
// 128 contiguous bytes of its piece whatever the swizzle.
template <class Traits>
__device__ __forceinline__ void zero_v_rows(typename Traits::Element* tile, int valid,
                                            int thread) {
  char* base = reinterpret_cast<char*>(tile);
  const int chunks = (Traits::kBlockN - valid) * Traits::kNumVPieces * 8;  // 16 B chunks
  for (int idx = thread; idx < chunks; idx += 128) {
    const int row = valid + idx / (Traits::kNumVPieces * 8);
    const int k = idx % (Traits::kNumVPieces * 8);
    *reinterpret_cast<uint4*>(base + (k / 8) * Traits::kPieceBytes + row * 128 + (k % 8) * 16) =
        make_uint4(0u, 0u, 0u, 0u);
  }
}

// One level of a reduction tree: v[j] op= v[j + W] for j < W, then the next level.
template <bool kMax, int W>
__device__ __forceinline__ void reduce_levels(float* v) {
#pragma unroll
  for (int j = 0; j < W; ++j) v[j] = kMax ? fmaxf(v[j], v[j + W]) : v[j] + v[j + W];
  if constexpr (W > 1) reduce_levels<kMax, W / 2>(v);
}

// Max (or sum) of row i of this thread's accumulator values, as a tree (a dependent chain put
// 16 operations on the path the other warpgroup waits on). The levels are template recursion:
// `for (w = n / 2; w > 0; w /= 2)` was left rolled at n = 16, with v[] in local memory.
template <bool kMax, class TS>
__device__ __forceinline__ float row_reduce(TS const& S, int i) {
  constexpr int n = cute::size<1>(TS{}.layout());
  float v[n];
#pragma unroll
  for (int j = 0; j < n; ++j) v[j] = S(i, j);
  reduce_levels<kMax, n / 2>(v);
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

// The running max m as an exp2 exponent offset: rows that have seen no key yet (m = -inf) use 0
// so exp2(-inf - 0) = 0 instead of NaN.
__device__ __forceinline__ float max_base(float m, float scale_log2) {
  return m == -INFINITY ? 0.f : m * scale_log2;
}

// P = exp(S - m) in place (S's accumulator order) and its row sums; P packed into the A
// fragment of P V (the accumulator's register order is the A fragment's: 2 values a word).
template <class Element, class TS, class TAcc, class TP>
__device__ __forceinline__ void softmax_to_p(TS& S, TAcc const& tSrS, const float (&base)[2],
                                             float sl2, float (&row_sum)[2], TP& tOrP) {
  using namespace cute;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int j = 0; j < size<1>(S); ++j) S(i, j) = exp2_approx(S(i, j) * sl2 - base[i]);
    row_sum[i] = row_reduce<false>(S, i);
  }
  // The accumulator's flat order (tSrS, compact) is the fragment's; pack pairs of it.
  static_assert(decltype(size(tSrS))::value == 2 * decltype(size(recast<uint32_t>(tOrP)))::value);
  Tensor P32 = recast<uint32_t>(tOrP);
#pragma unroll
  for (int k = 0; k < size(P32); ++k) P32(k) = pack2<Element>(tSrS(2 * k), tSrS(2 * k + 1));
}

// P fragments cross between the warpgroups thread-major: word 4j..4j+3 of thread t is the 16 B
// at (j * 128 + t) * 16, so a warp's accesses are 512 contiguous bytes (no bank conflicts).
template <class TP>
__device__ __forceinline__ void store_p(void* buf, TP& tOrP, int t) {
  using namespace cute;
  Tensor P32 = recast<uint32_t>(tOrP);
  uint4* dst = static_cast<uint4*>(buf);
#pragma unroll
  for (int j = 0; j < size(P32) / 4; ++j) {
    dst[j * 128 + t] = make_uint4(P32(4 * j), P32(4 * j + 1), P32(4 * j + 2), P32(4 * j + 3));
  }
}
template <class TP>
__device__ __forceinline__ void load_p(const void* buf, TP& tOrP, int t) {
  using namespace cute;
  Tensor P32 = recast<uint32_t>(tOrP);
  const uint4* src = static_cast<const uint4*>(buf);
#pragma unroll
  for (int j = 0; j < size(P32) / 4; ++j) {
    const uint4 v = src[j * 128 + t];
    P32(4 * j) = v.x;
    P32(4 * j + 1) = v.y;
    P32(4 * j + 2) = v.z;
    P32(4 * j + 3) = v.w;
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

// Returns the pairs it consumed (for the trace's CTA spans).
template <class Traits>
__device__ __forceinline__ int consume(const DenseDecodeParams& p,
                                        typename Traits::SharedStorage& smem, int wg, int thread,
                                        int m_block, int kv_head, int begin_req, int begin_tok,
                                        int last_req, int end_tok, int begin_split) {
  using namespace cute;
  using Element = typename Traits::Element;
  using Barrier = cutlass::arch::ClusterBarrier;
  constexpr int kBlockN = Traits::kBlockN;
  const int t = thread - wg * 128;  // thread in its warpgroup
  const int lane = t % 32;

  typename Traits::TiledMmaQK mma_qk;
  typename Traits::TiledMmaPV mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(t);
  auto thr_pv = mma_pv.get_thread_slice(t);

  Tensor sQ = make_tensor(make_smem_ptr(smem.q), typename Traits::SmemLayoutQ{});  // (64,D)
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);                                  // (MMA,1,D/16)
  // Descriptors of stage 0; stage 1 by byte offset (at_offset).
  Tensor tSrK = thr_qk.partition_fragment_B(
      make_tensor(make_smem_ptr(smem.k[0]), typename Traits::SmemLayoutK{}));  // (MMA,1,D/16)
  Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<64>, Int<kBlockN>>{});  // (MMA,1,1) fp32
  Tensor S = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));             // (2,16)
  Tensor cS = make_identity_tensor(Shape<Int<64>, Int<kBlockN>>{});
  Tensor tScS = thr_qk.partition_C(cS);
  Tensor cS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));  // (2,16) -> (row,key)

  // P as the A operand of P V, in registers: this warpgroup's own tile, and the other's (read
  // from shared memory).
  Tensor sP_shape = make_tensor(make_smem_ptr(smem.q), typename Traits::SmemLayoutP{});
  Tensor tOrP_own = thr_pv.partition_fragment_A(sP_shape);    // (MMA,1,4) Element
  Tensor tOrP_other = thr_pv.partition_fragment_A(sP_shape);  // (MMA,1,4) Element
  static_assert(size(decltype(tOrP_own){}) == size(decltype(tSrS){}));
  // The P exchange buffer of a stage: its RoPE piece at d 576, a buffer of its own at d 512.
  auto p_buffer = [&](int stage) -> void* {
    return Traits::kPInKTile ? static_cast<void*>(smem.k[stage] + 8 * Traits::kPieceElems)
                             : static_cast<void*>(smem.p[Traits::kPInKTile ? 0 : stage]);
  };
  // This warpgroup's V dims [256 wg, 256 wg + 256) = pieces [4 wg, 4 wg + 4) of a tile.
  Tensor tOrV = thr_pv.partition_fragment_B(
      make_tensor(make_smem_ptr(smem.k[0] + wg * (Traits::kNumVPieces / 2) * Traits::kPieceElems),
                  typename Traits::SmemLayoutV{}));  // (MMA,1,4)
  constexpr uint32_t kStageBytes = Traits::kTileElems * 2;
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
  // The part of a stage this warpgroup hands back after its PV: V left (WG0) or V right (WG1);
  // and the RoPE piece of the other warpgroup's stage, after reading the P stored there.
  const int my_v_part = wg == 0 ? Traits::kPartL : Traits::kPartR;

  const Tracer trace(p, wg, t == 0);
  int pair = 0;  // pairs consumed so far by this CTA: the phase of both stages' barriers
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

    for (int it = 0; it < n_tiles; it += 2, ++pair) {
      const uint32_t phase = pair & 1;
      const bool has1 = it + 1 < n_tiles;     // the pair's second tile exists
      const bool mine = wg == 0 || has1;      // this warpgroup has a tile (stage wg) to score
      const int k0 = piece.tile_begin + (it + wg) * kBlockN;  // its first key
      const int valid = max(0, min(kBlockN, piece.tok_end - k0));
      float mx[2] = {-INFINITY, -INFINITY};
      // S = Q K^T of this warpgroup's tile, masked, and its row maxima.
      auto score = [&] {
        gemm_qk<Traits>(mma_qk, at_offset(tSrQ, 0), at_offset(tSrK, wg * kStageBytes), tSrS,
                        smem.full[wg], phase);
        trace.mark(pair, 2);  // S done
        if (wg == 0 && p.serialize_qk) bar_arrive(kBarQK0Done, 256);
        if (k0 + kBlockN > min_limit || k0 < piece.tok_begin) {
          mask_tile(S, cS_rc, k0, piece.tok_begin, limit);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) mx[i] = quad_max(row_reduce<true>(S, i));
      };
      // The tail both warpgroups share, once their V part of stage 0 is handed back: rescale by
      // e^(m0 - m1) and add P1 V1 (if tile 1 exists), hand back their V part of stage 1.
      auto finish_pair = [&](bool has_tile1, auto& tOrP1, const float (&scale1)[2]) {
        if (has_tile1) {
          rescale_rows(O, scale1);
          gemm_pv(mma_pv, tOrP1, at_offset(tOrV, kStageBytes), tOrO);
          trace.mark(pair, 7);  // PV on tile 1 issued
          wait_pv(tOrO, tOrP1);
        }
        trace.mark(pair, 8);  // PV on tile 1 done
        release_part(&smem.empty[1][my_v_part], lane, p.cluster_size);
      };
      // Wait for this warpgroup's PV on tile 0, hand its V part of stage 0 back.
      auto finish_tile0 = [&](auto& tOrP0) {
        wait_pv(tOrO, tOrP0);
        trace.mark(pair, 6);  // PV on tile 0 done
        release_part(&smem.empty[0][my_v_part], lane, p.cluster_size);
      };
      trace.mark(pair, 0);
      // QK1 waits for QK0: the tensor pipe then runs QK0, QK1, PV0_L, PV0_R, PV1_L, PV1_R in
      // that order, softmax 0 hides under QK1, and every part of the next pair's tiles is freed
      // about three PVs before its QK^T needs it (issued together, QK1' of the next pair waited
      // for a tile released at that moment: one whole load exposed per pair, v5 run 1).
      if (wg == 1 && p.serialize_qk) bar_sync(kBarQK0Done, 256);
      trace.mark(pair, 1);

      if (wg == 0) {
        if (mine) score();
        // ---- WG0: softmax of tile 0 against the running max, P0 for itself and for WG1 ----
        float scale0[2], base0[2], sum0[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const float m0 = fmaxf(m_run[i], mx[i]);
          base0[i] = max_base(m0, sl2);
          scale0[i] = exp2_approx(m_run[i] * sl2 - base0[i]);
          m_run[i] = m0;
        }
        softmax_to_p<Element>(S, tSrS, base0, sl2, sum0, tOrP_own);
#pragma unroll
        for (int i = 0; i < 2; ++i) l_run[i] = l_run[i] * scale0[i] + sum0[i];
        store_p(p_buffer(0), tOrP_own, t);
        smem.max0[t] = make_float2(m_run[0], m_run[1]);
        const bool zero = valid < kBlockN;
        if (zero) {
          zero_v_rows<Traits>(smem.k[0], valid, t);
          fence_async_smem();  // the zeroed rows before the wgmmas that read them
        }
        bar_arrive(kBarP0Ready, 256);
        trace.mark(pair, 3);  // P0 published
        if (zero) {
          bar_sync(kBarWg0, 128);
        } else if constexpr (Traits::kPInKTile) {
          // P0 before the next TMA into the RoPE piece. After the arrive: the fence (a MEMBAR)
          // stays off WG1's path; that TMA waits for WG1 to have read P0 anyway.
          fence_async_smem();
        }
        rescale_rows(O, scale0);
        gemm_pv(mma_pv, tOrP_own, at_offset(tOrV, 0), tOrO);
        trace.mark(pair, 4);  // PV0_L issued
        // Early (v7): V0_L goes back as soon as PV0_L is done, so its refill overlaps QK1 (P1
        // comes after QK1 and softmax 1 anyway). Late (v6): after P1 arrived. Two bodies, so
        // each has its wgmma wait unconditionally (a wait under a branch serialises wgmmas).
        auto take_p1 = [&](auto early) {
          if constexpr (decltype(early)::value) finish_tile0(tOrP_own);
          // ---- WG0: P1 from WG1 ----
          bar_sync(kBarP1Ready, 256);
          trace.mark(pair, 5);  // P1 received
          const float4 st = smem.stats1[t];
          if (has1) load_p(p_buffer(1), tOrP_other, t);
          if constexpr (Traits::kPInKTile) {
            __syncwarp();
            release_part(&smem.empty[1][Traits::kPartRope], lane, p.cluster_size);
          }
          const float scale1[2] = {st.z, st.w};
          m_run[0] = st.x;
          m_run[1] = st.y;
#pragma unroll
          for (int i = 0; i < 2; ++i) l_run[i] *= scale1[i];
          if constexpr (!decltype(early)::value) finish_tile0(tOrP_own);
          finish_pair(has1, tOrP_other, scale1);  // PV1_L
        };
        if (p.release_early) {
          take_p1(cute::true_type{});
        } else {
          take_p1(cute::false_type{});
        }
      } else {
        // ---- WG1: P0 V0_R and the softmax of tile 1 against m0 ----
        // P0 from WG0: rescale by e^(m - m0), issue O_R += P0 V0_R.
        float m0[2], scale1[2];
        auto take_p0 = [&] {
          bar_sync(kBarP0Ready, 256);
          trace.mark(pair, 3);  // P0 received
          const float2 m0v = smem.max0[t];
          load_p(p_buffer(0), tOrP_other, t);
          if constexpr (Traits::kPInKTile) {
            __syncwarp();
            release_part(&smem.empty[0][Traits::kPartRope], lane, p.cluster_size);
          }
          m0[0] = m0v.x;
          m0[1] = m0v.y;
          float scale0[2];
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            scale0[i] = exp2_approx(m_run[i] * sl2 - max_base(m0[i], sl2));
            l_run[i] *= scale0[i];
          }
          rescale_rows(O, scale0);
          gemm_pv(mma_pv, tOrP_other, at_offset(tOrV, 0), tOrO);
          trace.mark(pair, 4);  // PV0_R issued
        };
        // P1 = exp(S1 - m1) for itself and WG0, with m1, e^(m0 - m1) for WG0.
        auto publish_p1 = [&] {
          float base1[2], sum1[2] = {0.f, 0.f};
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const float m1 = fmaxf(m0[i], mx[i]);
            base1[i] = max_base(m1, sl2);
            scale1[i] = exp2_approx(m0[i] * sl2 - base1[i]);
            m_run[i] = m1;
          }
          if (mine) {
            softmax_to_p<Element>(S, tSrS, base1, sl2, sum1, tOrP_own);
            store_p(p_buffer(1), tOrP_own, t);
          }
#pragma unroll
          for (int i = 0; i < 2; ++i) l_run[i] = l_run[i] * scale1[i] + sum1[i];
          smem.stats1[t] = make_float4(m_run[0], m_run[1], scale1[0], scale1[1]);
          const bool zero = mine && valid < kBlockN;
          if (zero) {
            zero_v_rows<Traits>(smem.k[1], valid, t);
            fence_async_smem();
          }
          bar_arrive(kBarP1Ready, 256);
          trace.mark(pair, 5);  // P1 published
          if (zero) {
            bar_sync(kBarWg1, 128);
          } else if constexpr (Traits::kPInKTile) {
            fence_async_smem();  // P1 before the next TMA into the RoPE piece (as for P0)
          }
        };
        auto body = [&](auto pv_first) {
          if constexpr (decltype(pv_first)::value) {
            // Tile 1 has not landed: PV0_R first, so V0_R is refilled while tile 1 arrives.
            take_p0();
            finish_tile0(tOrP_other);
            if (mine) score();
            publish_p1();
            finish_pair(mine, tOrP_own, scale1);  // PV1_R
          } else {
            // QK1 first: softmax 1 then runs under PV0_R.
            if (mine) score();
            take_p0();
            publish_p1();
            finish_tile0(tOrP_other);
            finish_pair(mine, tOrP_own, scale1);  // PV1_R
          }
        };
        // Decided per pair: has the first part of tile 1 landed by the time QK0 is done? Each
        // thread polls at its own moment, so WG1 agrees by a reduction (a per-thread choice sent
        // warps into different wgmma sequences: hang, device run 2 of v7).
        // (release_early 2 always takes PV0_R first: a test knob for that body.)
        const bool pv_first =
            p.release_early == 2 ||
            (p.release_early == 1 &&
             (!mine || !bar_any(kBarWg1, 128,
                                cutlass::arch::ClusterBarrier::test_wait(&smem.full[1][0],
                                                                         phase, 1u))));
        if (pv_first) {
          body(cute::true_type{});
        } else {
          body(cute::false_type{});
        }
      }
    }

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
  return pair;
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
#if defined(OPENMLA_DENSE_DECODE_TRACE)
  long long trace_start = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(trace_start));
  const long long trace_clock = clock64();
#endif
  if (thread == 0) {
#pragma unroll
    for (int s = 0; s < Traits::kStages; ++s) {
#pragma unroll
      for (int part = 0; part < Traits::kNumParts; ++part) {
        cutlass::arch::ClusterBarrier::init(&smem.full[s][part], 1);
        // lane 0 of 4 warps of every CTA of the cluster
        cutlass::arch::ClusterBarrier::init(&smem.empty[s][part], 4 * params.cluster_size);
      }
    }
    cutlass::arch::fence_barrier_init();
  }
  // The partner CTA multicasts into this CTA's smem and arrives on its barriers: both CTAs'
  // barriers are initialised before either starts, and neither exits before both are done.
  const bool clustered = params.cluster_size > 1;
  __syncthreads();
  if (clustered) {
    cute::cluster_arrive_relaxed();
    cute::cluster_wait();
  }
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
    const int pairs = consume<Traits>(params, smem, wg, thread, blockIdx.x, blockIdx.y, m[0],
                                      m[1], m[2], m[3], m[4]);
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
    }
#else
    (void)pairs;
#endif
  }
  if (clustered) {
    // Not the .aligned forms: the producer warp's lanes arrive here at different times.
    asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
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
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(Traits::kNumThreads);
  config.dynamicSmemBytes = Traits::kSmemBytes;
  config.stream = stream;
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = 2;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  if (params.cluster_size == 2 && num_m_blocks % 2 == 0) {
    // The schedule assumes every CTA of the grid is resident at once (one wave): a GPU that
    // cannot hold that many 2-CTA clusters side by side gets the unclustered kernel.
    static int max_clusters = -1;
    if (max_clusters < 0) {
      config.attrs = &cluster;
      config.numAttrs = 1;
      if (cudaOccupancyMaxActiveClusters(&max_clusters, kernel, &config) != cudaSuccess) {
        max_clusters = 0;
        (void)cudaGetLastError();
      }
    }
    if (2 * max_clusters >= static_cast<int>(grid.x * grid.y * grid.z)) {
      config.attrs = &cluster;
      config.numAttrs = 1;
      dense_decode_tuning().last_cluster_size = 2;
      return cudaLaunchKernelEx(&config, kernel, params);
    }
  }
  dense_decode_tuning().last_cluster_size = 1;
  DenseDecodeParams alone = params;
  alone.cluster_size = 1;
  config.attrs = nullptr;
  config.numAttrs = 0;
  return cudaLaunchKernelEx(&config, kernel, alone);
}

}  // namespace openmla::cuda::sm90
