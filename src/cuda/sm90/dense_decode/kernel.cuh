// SM90 dense MLA decode: two TMA producer warps + two wgmma warpgroups in a software-pipelined
// seesaw. Design, numbers and tuning history: NOTES.md. Compile-time choices: traits.h.
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
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include <cute/tensor.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "core/schedule.h"
#include "cuda/common/quad_transpose.cuh"
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
};

__device__ __forceinline__ void bar_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void bar_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
// Generic-proxy smem writes (P, Q, zeroed rows) ordered before async-proxy accesses (wgmma reads,
// the next TMA write into the same bytes). With a memory clobber, unlike CUTLASS's
// fence_view_async_shared: the stores before it must not sink below it.
__device__ __forceinline__ void fence_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// A part of a stage handed back to its producer warp: lane 0 of each of the 4 warps of the
// releasing warpgroup arrives (the empty barrier counts 4).
__device__ __forceinline__ void release_part(uint64_t* empty, int lane) {
  if (lane == 0) cutlass::arch::ClusterBarrier::arrive(empty);
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
  // Request boundaries: role's [request][event] row after the CTA spans (params.h). The address
  // comes from the parameters at each mark: a pointer held across the loop cost registers. None
  // between a request's Q wait and its first wgmma: stamps there made ptxas put a
  // warpgroup.arrive before every wgmma of the kernel (92 instead of 23; C7519), and the trace
  // build ran 50% slower.
  __device__ __forceinline__ void mark_request(const DenseDecodeParams& p, int role, int request,
                                               int event) const {
    if (row != nullptr && request < kTraceRequests) {
      p.trace[3ll * p.trace_pairs * kTraceEvents + 6ll * kTraceMaxCtas +
              (role * kTraceRequests + request) * kTraceRequestEvents + event] = clock64();
    }
  }
  int trace_pairs_ = 0;
#else
  __device__ __forceinline__ Tracer(const DenseDecodeParams&, int, bool) {}
  __device__ __forceinline__ void mark(int, int) const {}
  __device__ __forceinline__ void mark_request(const DenseDecodeParams&, int, int, int) const {}
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

// Q of request r for CTA rows [64 m_block, 64 m_block + 64) of kv head `kv_head` by TMA, one box
// a 64-dim piece (rows past the request's are the map's zero fill), completing q_full (one
// arrival, by the thread with `arrive`, expecting all of Q's bytes). This thread issues pieces
// first, first + step, ...: one thread's TMA stream is capped by its boxes in flight (~32 GB/s
// into an SM from DRAM), so Q's 72 KB come faster from several warps.
template <class Traits>
__device__ __forceinline__ void issue_q(const DenseDecodeParams& p,
                                        typename Traits::SharedStorage& smem, int r, int kv_head,
                                        int m_block, int first, int step, bool arrive) {
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  if (arrive) Barrier::arrive_and_expect_tx(&smem.q_full, Traits::kBlockM * Traits::kHeadDimQK * 2);
  const int row0 = m_block * Traits::kBlockM;
  const int s0 = row0 / p.group, head0 = row0 - s0 * p.group;
#pragma unroll 1
  for (int c = first; c < Traits::kNumPieces; c += step) {
    cute::SM90_TMA_LOAD_5D::copy(&p.tma_q, &smem.q_full, p.cache_hint,
                                 smem.q + c * Traits::kQPieceElems, c * Traits::kPieceDims, head0,
                                 kv_head, s0, r);
  }
}

// ---------------------------------------------------------------------------------------------
// Producers: lane 0 of warps 8 and 9 fill stage 0 (the even tiles), lane 0 of warps 10 and 11
// stage 1 (the odd tiles), each refilling its pieces of a part as soon as the part is handed
// back, in the stage's part order. (One
// thread issuing both stages in a fixed order waited for the part handed back last while the
// others sat free; a producer warp holding block ids ahead or prefetching into L2 measured no
// better: NOTES.md v3, v5c, v8.)

// A thread issuing TMA keeps only a few boxes in flight: one thread streams ~32 GB/s into an SM
// from DRAM (~42 from L2) however many slots are free, two threads in two warps twice that
// (openmla_bench_tma_stream, NOTES.md v10). So each stage's pieces are issued by two warps.
constexpr int kIssuersPerStage = 2;

// One part of the tile at key t0 (`valid` keys of it before the piece's end) into `stage`, each
// piece completing its own barrier; this thread issues the part's pieces sub, sub + 2, ... Pages
// of >= 64 keys: one 64-key box per piece (`block` is the tile's block). Smaller pages: one box
// per (page, piece), pages past the last valid key not loaded (the consumers zero those V rows
// and mask those keys). `after_wait` runs once the part is free (a trace stamp).
template <class Traits, bool kSmallPages, class F>
__device__ __forceinline__ void load_part(const DenseDecodeParams& p,
                                          typename Traits::SharedStorage& smem,
                                          const int32_t* table, int block, int row, int kv_head,
                                          int stage, int part, int t0, int valid, uint32_t phase,
                                          int sub, uint64_t hint, F&& after_wait) {
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  const int first = Traits::part_first_piece(part), n = Traits::part_pieces(part);
  cutlass::arch::ClusterBarrier::wait(&smem.empty[stage][part], phase ^ 1);
  after_wait();
  typename Traits::Element* dst = smem.k[stage] + first * Traits::kPieceElems;
  // (Loops kept rolled and no divisions: the producers have 40 registers.)
  if constexpr (!kSmallPages) {  // `block`, `row`: the tile's block and first row in it
#pragma unroll 1
    for (int c = sub; c < n; c += kIssuersPerStage) {
      uint64_t* full = &smem.full[stage][first + c];
      Barrier::arrive_and_expect_tx(full, valid > 0 ? Traits::kPieceBytes : 0);
      if (valid > 0) {
        cute::SM90_TMA_LOAD_4D::copy(&p.tma_k, full, hint, dst + c * Traits::kPieceElems,
                                     (first + c) * Traits::kPieceDims, row, kv_head, block);
      }
    }
  } else {  // pages of 8, 16 or 32 keys (2^page_shift): the tile's pages from the table
    const int pages = (valid + p.page_size - 1) >> p.page_shift;
    const int first_page = t0 >> p.page_shift;
#pragma unroll 1
    for (int c = sub; c < n; c += kIssuersPerStage) {
      uint64_t* full = &smem.full[stage][first + c];
      Barrier::arrive_and_expect_tx(full, static_cast<uint32_t>(pages * p.page_size * 128));
#pragma unroll 1
      for (int j = 0; j < pages; ++j) {
        const int b = table[(first_page + j) * p.block_table_stride_n];
        cute::SM90_TMA_LOAD_4D::copy(&p.tma_k, full, hint,
                                     dst + c * Traits::kPieceElems + j * p.page_size * Traits::kPieceDims,
                                     (first + c) * Traits::kPieceDims, 0, kv_head, b);
      }
    }
  }
}

// Stage `stage`'s tiles of every request piece of this worker: tile 2k + stage of each pair k.
// Tile 1 of a pair past the piece's end is an empty load (0 bytes): every barrier still completes
// one phase per pair, so both sides count pairs alone.
template <class Traits, bool kSmallPages>
__device__ __forceinline__ void produce(const DenseDecodeParams& p,
                                        typename Traits::SharedStorage& smem, int kv_head,
                                        int stage, int sub) {
  auto field = [&](int f) { return smem.range[f]; };  // the worker's range (traits.h)
  const Tracer trace(p, 2, sub == 0);
  int pair = 0;  // pairs loaded so far: the phase of every barrier of the stage
  for (int r = field(0); r <= field(2); ++r) {
    trace.mark_request(p, 2, r - field(0), 2 * stage);
    const RequestPiece piece = request_piece(p, r, field(0), field(1), field(2), field(3));
    const int32_t* table = p.block_table + r * p.block_table_stride_b;
    // Pages of >= 64 keys: the block id of this stage's first tile, read here, before the tile
    // loop whose bounds wait for the seqlen (any tile below the capacity has a table entry), so
    // the two loads are in flight together at a request's start.
    int first_block = 0;
    if constexpr (!kSmallPages) {
      const int t0 = piece.tile_begin + stage * Traits::kBlockN;
      if (t0 < p.capacity) first_block = table[(t0 / p.page_size) * p.block_table_stride_n];
    }
    const int n_tiles = piece.num_tiles();
    const uint64_t hint = piece.seqlen >= p.long_from ? p.cache_hint_long : p.cache_hint;
    for (int it = stage; it < n_tiles + stage; it += 2, ++pair) {
      const int t0 = piece.tile_begin + it * Traits::kBlockN;
      const int valid = max(0, min(Traits::kBlockN, piece.tok_end - t0));
      // Pages of >= 64 keys: the tile's one block id (read before the first part is free) and its
      // first row in that block.
      int block = 0, row = 0;
      if constexpr (!kSmallPages) {
        const int page = t0 / p.page_size;
        block = first_block;
        if (it != stage && t0 < p.capacity) block = table[page * p.block_table_stride_n];
        row = t0 - page * p.page_size;
      }
      if (stage == 0) trace.mark(pair, 0);
#pragma unroll 1
      for (int i = 0; i < Traits::kNumParts; ++i) {
        // Stamps: the part free (its empty barrier passed), then issued; the time between the
        // consumer's release and the first is the producer's wake-up, the rest the TMA issue.
        load_part<Traits, kSmallPages>(
            p, smem, table, block, row, kv_head, stage, Traits::part_order(stage, i), t0, valid,
            pair & 1, sub, hint, [&] { trace.mark(pair, 7 + stage * Traits::kNumParts + i); });
        trace.mark(pair, 1 + stage * Traits::kNumParts + i);  // part issued
        if (i == 0 && it == stage) trace.mark_request(p, 2, r - field(0), 2 * stage + 1);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Compute warpgroups.

// S = Q K^T of stage `kStage`'s tile, piece by piece as each lands, in the stage's part order,
// one wgmma group per part. After the first part's group (RoPE) `after_first_part` runs with at
// most that group pending: every wgmma issued before this QK^T (the other tile's PV) is done then.
// (After the first part, not the second: WG0's callback hands stage 1's V left back, and waiting
// for stage 0's V left to land first held WG1's next S and its hand-off: -3.0% at h_q 128 L 4096,
// session 12.)
// kIssueOnly: every part issued and committed, nothing waited for (the caller waits).
template <class Traits, int kStage, bool kIssueOnly = false, class Mma, class TQ, class TK,
          class TS, class F>
__device__ __forceinline__ void gemm_qk(Mma& mma, TQ const& tSrQ, TK const& tSrK, TS& tSrS,
                                        uint64_t* full, uint32_t phase, F&& after_first_part) {
  using namespace cute;
  constexpr int kSteps = Traits::kPieceDims / 16;
  warpgroup_fence_operand(tSrS);
#pragma unroll
  for (int i = 0; i < Traits::kNumParts; ++i) {
    const int part = Traits::part_order(kStage, i);
    // One fence a part: between a part's pieces only barrier waits come, no register writes.
    // (A fence a piece made ptxas close a wgmma group a piece, so the wait below for the other
    // tile's PV waited for this QK^T's earlier pieces too.)
    cutlass::arch::ClusterBarrier::wait(&full[Traits::part_first_piece(part)], phase);
    warpgroup_arrive();
#pragma unroll
    for (int c = Traits::part_first_piece(part);
         c < Traits::part_first_piece(part) + Traits::part_pieces(part); ++c) {
      if (c != Traits::part_first_piece(part)) cutlass::arch::ClusterBarrier::wait(&full[c], phase);
#pragma unroll
      for (int kk = 0; kk < kSteps; ++kk) {
        const bool first = i == 0 && c == Traits::part_first_piece(part) && kk == 0;
        mma.accumulate_ = first ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
        gemm(mma, tSrQ(_, _, c * kSteps + kk), tSrK(_, _, c * kSteps + kk), tSrS);
      }
    }
    warpgroup_commit_batch();
    if (!kIssueOnly && i == 0) {
      warpgroup_wait<1>();
      after_first_part();
    }
  }
  if constexpr (!kIssueOnly) {
    warpgroup_wait<0>();
    warpgroup_fence_operand(tSrS);
  }
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

// O's rows times `scale`, skipped when every factor of the warp is 1 (exact; with the lazy
// running max below nearly every tile after a request's first).
template <class TO>
__device__ __forceinline__ void rescale_rows_if(TO& O, const float (&scale)[2]) {
  if (__any_sync(0xffffffffu, scale[0] != 1.f || scale[1] != 1.f)) rescale_rows(O, scale);
}

// The running max moves only when a tile's row max exceeds it by more than `thr` (2^8 in P's
// units): P is then at most 256 (exact in every 16-bit type's range, fp32 sums), and O rarely
// needs a rescale (FA4's lazy rescaling). -inf (no key yet) always moves.
__device__ __forceinline__ float lazy_max(float m, float tile_max, float thr) {
  return tile_max > m + thr ? tile_max : m;
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

// One row of this thread's half of O (row i of the accumulator, already normalised) into `out`
// (the row's first column of this warpgroup's half) as 16-byte stores. The 4 lanes of a quad hold the
// row's n-blocks of 8 columns, 2 columns each (lane q: columns 8 nb + 2 q, + 1); a 4 x 4
// transpose inside the quad per 4 n-blocks (4 shuffles) gives lane q all 8 columns of n-block
// 4 g + q. Four times fewer store instructions than one 4-byte store a column pair, each a warp
// writing 8 rows x 64 contiguous bytes. Every lane shuffles; only `store` lanes write.
template <class Element, class TO>
__device__ __forceinline__ void store_row_16B(char* out, TO const& O, int i, int q, bool store) {
  using namespace cute;
  constexpr int kBlocks = size<1>(TO{}.layout()) / 2;  // n-blocks of 8 columns in the row
  static_assert(kBlocks % 4 == 0);
#pragma unroll
  for (int g = 0; g < kBlocks / 4; ++g) {
    uint32_t a[4];  // a[k]: this lane's 2 columns of n-block 4 g + k
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int j = 2 * (4 * g + k);
      a[k] = pack2<Element>(O(i, j), O(i, j + 1));
    }
    const uint4 v = quad_transpose(a, q);
    if (store) *reinterpret_cast<uint4*>(out + (8 * (4 * g + q)) * 2) = v;
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
                                        int m_block, int kv_head) {
  using namespace cute;
  using Element = typename Traits::Element;
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
  const float max_thr = 8.f / sl2;  // lazy_max's threshold: 2^8 in P
  auto field = [&](int f) { return smem.range[f]; };  // the worker's range (traits.h)
  const Tracer trace(p, wg, t == 0);
  int pair = 0;  // pairs consumed so far by this CTA: the phase of both stages' barriers
  // Q by TMA (p.q_tma): lane 0 of the first p.q_issuers compute warps load request r's 64 rows
  // (rows past the request's are the map's zero fill): the first request's right away, each next
  // one's once both warpgroups are past their last QK^T (kBarEpilogue), so it lands under the
  // epilogue. (The compute threads' own loads cost ~6 µs at a CTA's start and more at each
  // request boundary; issued earlier, by the producer warps right after the last QK^T, or
  // prefetched into L2, it measured no better: NOTES.md session 8.)
  const int warp = thread / 32;  // 0-7 over both warpgroups
  const bool q_issuer = p.q_tma && lane == 0 && warp < p.q_issuers;
  auto load_q_tma = [&](int r) {
    issue_q<Traits>(p, smem, r, kv_head, m_block, warp, p.q_issuers, warp == 0);
  };
  if (q_issuer && field(0) <= field(2)) load_q_tma(field(0));
  uint32_t q_phase = 0;

  // Output of a finished request, O already normalised (1/l folded in). (Its 64 KB of stores
  // hold both warpgroups ~4-6k clocks at a request boundary; deferring them under the next
  // request's first QK^T kept O live across requests and spilled 1.9 KB: NOTES.md session 8.)
  auto write_out = [&](int rr, bool single, int first_split) {
    if (!single) {
      // A split's fp32 partial, in the accumulator's own order (combine.h, "o_accum"): float4 k
      // of thread t of warpgroup wg is rows r, r + 8 x columns 256 wg + 8 k + 2 (t % 4), + 1,
      // at float4 (32 wg + k) * 32 row_groups + t of the CTA's block, so a warp stores 512
      // contiguous bytes an instruction. (Row-major 8-byte stores, 8 rows x 32 B an
      // instruction, cost ~12 µs of b 32 x 4096's 89 where every CTA stores at once; this order
      // ~2: session 10 run 5.) Only the warps of the first row_groups 16-row groups have a
      // block slot; threads whose rows are both past the request's store nothing.
      const int split = field(4) + (rr - field(0));
      const int64_t block = core::partial_block(core::partial_slot(split, first_split, rr),
                                                kv_head, m_block, p.h_kv, p.m_blocks);
      const int lanes = 32 * p.row_groups;  // the block's float4s of one column slot
      const int block_float4s = core::partial_block_float4s(p.row_groups, Traits::kHeadDimV);
      float4* out = reinterpret_cast<float4*>(p.o_accum) + block * block_float4s +
                    wg * (Traits::kVHalfDims / 8) * lanes + t;
      if (m_block * 64 + row_of[0] >= p.rows) return;  // both rows past the request's
#pragma unroll
      for (int k = 0; k < size<1>(O) / 2; ++k) {
        out[k * lanes] = make_float4(O(0, 2 * k), O(0, 2 * k + 1), O(1, 2 * k), O(1, 2 * k + 1));
      }
      return;
    }
    auto out_row = [&](int i) {  // this warpgroup's half of row i in out
      const int grow = m_block * 64 + row_of[i];
      const int s = grow / p.group, h = kv_head * p.group + grow % p.group;
      return static_cast<char*>(p.out) + (rr * p.out_stride_b + s * p.out_stride_s +
                                          h * p.out_stride_h + wg * Traits::kVHalfDims) * 2;
    };
    if (p.output_stores == 2) {
      // (Every lane takes part in the quads' shuffles; rows past the request's skip the store.)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        store_row_16B<Element>(out_row(i), O, i, lane % 4, m_block * 64 + row_of[i] < p.rows);
      }
      return;
    }
    if (p.output_stores != 1) return;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int grow = m_block * 64 + row_of[i];
      if (grow >= p.rows) continue;
      // From one opaque first column, so the others' offsets are constants: else their 32
      // addresses were hoisted out of the request loop into registers (and spilled).
      const int col0 = get<1>(cO_rc(i, 0));
      int opaque = col0;
      asm volatile("" : "+r"(opaque));
      char* out = out_row(i) + opaque * 2;
#pragma unroll
      for (int j = 0; j < size<1>(O); j += 2) {
        const int col = get<1>(cO_rc(i, j)) - col0;
        *reinterpret_cast<uint32_t*>(out + col * 2) = pack2<Element>(O(i, j), O(i, j + 1));
      }
    }
  };

  for (int r = field(0); r <= field(2); ++r) {
    const RequestPiece piece = request_piece(p, r, field(0), field(1), field(2), field(3));
    const int n_tiles = piece.num_tiles();
    const int first_split = p.num_splits[r * p.num_splits_stride];
    const int n_splits = p.num_splits[(r + 1) * p.num_splits_stride] - first_split;

    // Every QK^T of the previous request is done (its epilogue passed kBarEpilogue).
    if (p.q_tma) {
      cutlass::arch::ClusterBarrier::wait(&smem.q_full, q_phase);
      q_phase ^= 1;
    } else {
      if (n_tiles > 0) load_q<Traits>(p, smem.q, r, kv_head, m_block, thread);
      fence_async_smem();
    }
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

    const int n_pairs = (n_tiles + 1) / 2;
    // Pair k's tile in stage `stage`: its first key, and how many of its keys are before the end.
    auto tile_key = [&](int k, int stage) { return piece.tile_begin + (2 * k + stage) * kBlockN; };
    auto tile_valid = [&](int k, int stage) {
      return max(0, min(kBlockN, piece.tok_end - tile_key(k, stage)));
    };
    // S of stage `stage`'s tile of pair k masked, and its row maxima.
    auto score_tail = [&](int stage, int k, float(&mx)[2]) {
      const int k0 = tile_key(k, stage);
      if (k0 + kBlockN > min_limit || k0 < piece.tok_begin) {
        mask_tile(S, cS_rc, k0, piece.tok_begin, limit);
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) mx[i] = quad_max(row_reduce<true>(S, i));
    };
    // S = Q K^T of stage kStage's tile of pair k, masked, and its row maxima.
    auto score = [&](auto stage_c, int k, uint32_t phase, float(&mx)[2], auto&& after_first_part) {
      constexpr int kStage = decltype(stage_c)::value;
      gemm_qk<Traits, kStage>(mma_qk, at_offset(tSrQ, 0), at_offset(tSrK, kStage * kStageBytes),
                              tSrS, smem.full[kStage], phase, after_first_part);
      warpgroup_fence_operand(tOrO);
      score_tail(kStage, k, mx);
    };

    if (wg == 0) {
      // P of the odd tile of the previous pair (stage 1) from WG1, with WG1's running max and
      // the factor e^(m_even - m_odd): rescale, hand the stage's RoPE piece (P's buffer) back,
      // and when the tile exists issue O_L += P V_L on it (not waited for).
      auto take_odd = [&](bool has_tile) {
        bar_sync(kBarP1Ready, 256);
        const float4 st = smem.stats1[t];
        if (has_tile) load_p(p_buffer(1), tOrP_other, t);
        if constexpr (Traits::kPInKTile) {
          __syncwarp();
          release_part(&smem.empty[1][Traits::kPartRope], lane);
        }
        const float scale1[2] = {st.z, st.w};
        m_run[0] = st.x;
        m_run[1] = st.y;
#pragma unroll
        for (int i = 0; i < 2; ++i) l_run[i] *= scale1[i];
        rescale_rows_if(O, scale1);
        if (has_tile) gemm_pv(mma_pv, tOrP_other, at_offset(tOrV, kStageBytes), tOrO);
      };
      for (int k = 0; k < n_pairs; ++k, ++pair) {
        const uint32_t phase = pair & 1;
        trace.mark(pair, 0);
        if (k > 0) take_odd(true);  // tile 2k - 1 exists whenever pair k does
        trace.mark(pair, 1);
        // ---- S of tile 2k; the PV on tile 2k - 1 runs under it, then its V left goes back ----
        float mx[2];
        score(cute::Int<0>{}, k, phase, mx, [&] {
          warpgroup_fence_operand(tOrO);
          warpgroup_fence_operand(tOrP_other);
          if (k > 0) release_part(&smem.empty[1][Traits::kPartL], lane);
        });
        trace.mark(pair, 2);
        // ---- softmax of tile 2k against the running max: P for itself and for WG1 ----
        float scale0[2], base0[2], sum0[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const float m0 = lazy_max(m_run[i], mx[i], max_thr);
          base0[i] = max_base(m0, sl2);
          scale0[i] = exp2_approx(m_run[i] * sl2 - base0[i]);
          m_run[i] = m0;
        }
        softmax_to_p<Element>(S, tSrS, base0, sl2, sum0, tOrP_own);
#pragma unroll
        for (int i = 0; i < 2; ++i) l_run[i] = l_run[i] * scale0[i] + sum0[i];
        store_p(p_buffer(0), tOrP_own, t);
        smem.max0[t] = make_float2(m_run[0], m_run[1]);
        const int valid = tile_valid(k, 0);
        const bool zero = valid < kBlockN;
        if (zero) {
          zero_v_rows<Traits>(smem.k[0], valid, t);
          fence_async_smem();  // the zeroed rows before the wgmmas that read them
        }
        bar_arrive(kBarP0Ready, 256);
        trace.mark(pair, 3);
        if (zero) {
          bar_sync(kBarWg0, 128);
        } else if constexpr (Traits::kPInKTile) {
          // P before the next TMA into the RoPE piece. After the arrive: the fence (a MEMBAR)
          // stays off WG1's path; that TMA waits for WG1 to have read P anyway.
          fence_async_smem();
        }
        // ---- O_L += P V_L on tile 2k, then stage 0's V left goes back ----
        rescale_rows_if(O, scale0);
        gemm_pv(mma_pv, tOrP_own, at_offset(tOrV, 0), tOrO);
        wait_pv(tOrO, tOrP_own);
        trace.mark(pair, 4);
        release_part(&smem.empty[0][Traits::kPartL], lane);
      }
      if (n_pairs > 0) {
        // The request's last odd tile, if it has one (an even tile count): its PV, then stage
        // 1's V left goes back (it completes a phase per pair, loaded or not).
        const bool has_last = n_tiles % 2 == 0;
        take_odd(has_last);
        if (has_last) wait_pv(tOrO, tOrP_other);
        release_part(&smem.empty[1][Traits::kPartL], lane);
      }
    } else {
      // The pair body, straight-line for each case (a runtime `has1` around the issue-only
      // QK^T and its wait made ptxas inject a warpgroup.arrive before every wgmma, C7519).
      auto body = [&](auto has1_c, int k) __attribute__((always_inline)) {
        constexpr bool has1 = decltype(has1_c)::value;  // the pair's odd tile exists
        const uint32_t phase = pair & 1;
        trace.mark(pair, 0);
        // ---- S of tile 2k + 1 issued first: it needs nothing of WG0's, and its stage has
        // usually landed by now (v10 issued it behind the PV on P(2k), ~1k clocks later) ----
        if constexpr (has1) {
          gemm_qk<Traits, 1, true>(mma_qk, at_offset(tSrQ, 0), at_offset(tSrK, kStageBytes),
                                   tSrS, smem.full[1], phase, [] {});
        }
        // ---- P of tile 2k from WG0: O_R *= e^(m - m0), issue O_R += P V_R on it ----
        bar_sync(kBarP0Ready, 256);
        const float2 m0v = smem.max0[t];
        load_p(p_buffer(0), tOrP_other, t);
        if constexpr (Traits::kPInKTile) {
          __syncwarp();
          release_part(&smem.empty[0][Traits::kPartRope], lane);
        }
        const float m0[2] = {m0v.x, m0v.y};
        float scale0[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          scale0[i] = exp2_approx(m_run[i] * sl2 - max_base(m0[i], sl2));
          l_run[i] *= scale0[i];
        }
        rescale_rows_if(O, scale0);
        gemm_pv(mma_pv, tOrP_other, at_offset(tOrV, 0), tOrO);
        trace.mark(pair, 1);
        // ---- S of tile 2k + 1 done (the PV on tile 2k still runs: O is not touched until it
        // is waited for below) ----
        float mx[2] = {-INFINITY, -INFINITY};
        if constexpr (has1) {
          warpgroup_wait<1>();
          warpgroup_fence_operand(tSrS);
          score_tail(1, k, mx);
        } else {
          wait_pv(tOrO, tOrP_other);
          release_part(&smem.empty[0][Traits::kPartR], lane);
          // The tile past the end is a 0-byte phase of stage 1: no part of it may go back before
          // the producer's arrival, or a release could run a phase ahead of the producer's wait
          // (WG0 hands its parts back after kBarP1Ready, which follows this).
#pragma unroll
          for (int c = 0; c < Traits::kNumPieces; ++c) {
            cutlass::arch::ClusterBarrier::wait(&smem.full[1][c], phase);
          }
        }
        trace.mark(pair, 2);
        // ---- softmax of tile 2k + 1 against m0: P, m1 and e^(m0 - m1) for WG0 ----
        float base1[2], scale1[2], sum1[2] = {0.f, 0.f};
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const float m1 = lazy_max(m0[i], mx[i], max_thr);
          base1[i] = max_base(m1, sl2);
          scale1[i] = exp2_approx(m0[i] * sl2 - base1[i]);
          m_run[i] = m1;
        }
        if constexpr (has1) {
          softmax_to_p<Element>(S, tSrS, base1, sl2, sum1, tOrP_own);
          store_p(p_buffer(1), tOrP_own, t);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) l_run[i] = l_run[i] * scale1[i] + sum1[i];
        smem.stats1[t] = make_float4(m_run[0], m_run[1], scale1[0], scale1[1]);
        const int valid = tile_valid(k, 1);
        const bool zero = has1 && valid < kBlockN;
        if (zero) {
          zero_v_rows<Traits>(smem.k[1], valid, t);
          fence_async_smem();
        }
        bar_arrive(kBarP1Ready, 256);
        trace.mark(pair, 3);
        if constexpr (has1) {  // the PV on tile 2k, then stage 0's V right goes back
          wait_pv(tOrO, tOrP_other);
          release_part(&smem.empty[0][Traits::kPartR], lane);
        }
        if (zero) {
          bar_sync(kBarWg1, 128);
        } else if constexpr (Traits::kPInKTile) {
          fence_async_smem();  // P before the next TMA into the RoPE piece (as for WG0's P)
        }
        // ---- O_R += P V_R on tile 2k + 1, then stage 1's V right goes back ----
        rescale_rows_if(O, scale1);
        if constexpr (has1) {
          gemm_pv(mma_pv, tOrP_own, at_offset(tOrV, kStageBytes), tOrO);
          wait_pv(tOrO, tOrP_own);
        }
        trace.mark(pair, 4);
        release_part(&smem.empty[1][Traits::kPartR], lane);
      };
      for (int k = 0; k < n_pairs; ++k, ++pair) {
        if (2 * k + 1 < n_tiles) {
          body(cute::true_type{}, k);
        } else {
          body(cute::false_type{}, k);
        }
      }
    }

    // ---- epilogue: row sums of both warpgroups, normalise, write ----
    trace.mark_request(p, wg, r - field(0), 4);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      l_run[i] = quad_sum(l_run[i]);
      if (row_leader) smem.row_sum[wg][row_of[i]] = l_run[i];
    }
    bar_sync(kBarEpilogue, 256);
    trace.mark_request(p, wg, r - field(0), 5);
    if (q_issuer && r < field(2)) load_q_tma(r + 1);
    const bool single = n_splits == 1;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int grow = m_block * 64 + row_of[i];
      const float l = smem.row_sum[0][row_of[i]] + smem.row_sum[1][row_of[i]];
      const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
      for (int j = 0; j < size<1>(O); ++j) O(i, j) *= inv;
      if (grow >= p.rows || !(wg == 0 && row_leader)) continue;
      const int s = grow / p.group, h = kv_head * p.group + grow % p.group;
      const float lse = l > 0.f ? m_run[i] * p.scale + logf(l) : (single ? INFINITY : -INFINITY);
      if (single) {
        p.lse[r * p.lse_stride_b + h * p.lse_stride_h + s * p.lse_stride_s] = lse;
      } else {
        const int split = field(4) + (r - field(0));
        p.lse_accum[(static_cast<int64_t>(split) * p.s_q + s) * p.h_q + h] = lse;
      }
    }
    write_out(r, single, first_split);
    trace.mark_request(p, wg, r - field(0), 6);
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
      for (int c = 0; c < Traits::kNumPieces; ++c) cutlass::arch::ClusterBarrier::init(&smem.full[s][c], 1);
#pragma unroll
      for (int part = 0; part < Traits::kNumParts; ++part) {
        cutlass::arch::ClusterBarrier::init(&smem.empty[s][part], 4);  // lane 0 of 4 warps
      }
    }
    cutlass::arch::ClusterBarrier::init(&smem.q_full, 1);
    cutlass::arch::fence_barrier_init();
    const int32_t* meta = params.metadata + blockIdx.z * params.metadata_stride_part;
#pragma unroll
    for (int f = 0; f < 5; ++f) smem.range[f] = meta[f * params.metadata_stride_field];
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
  static const cudaError_t attr_error = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes);
  if (attr_error != cudaSuccess) return attr_error;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(num_m_blocks, h_kv, num_sm_parts);
  config.blockDim = dim3(Traits::kNumThreads);
  config.dynamicSmemBytes = Traits::kSmemBytes;
  config.stream = stream;
  return cudaLaunchKernelEx(&config, kernel, params);
}

}  // namespace openmla::cuda::sm90
