// What fills the dense decode kernel's shared memory (kernel.cuh): the producer warps' walk over
// a worker's request pieces, refilling each part of a stage by TMA as soon as it is handed back,
// and a request's Q, by TMA from the compute warps or by the compute threads' own loads; and
// the output rows' TMA stores from that buffer.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>

#include "core/schedule.h"
#include "cuda/sm90/attention/primitives.cuh"
#include "cuda/sm90/dense_decode/params.h"
#include "cuda/sm90/dense_decode/trace.cuh"

namespace openmla::cuda::sm90 {
namespace dense_decode_detail {
using namespace attention;  // the shared device pieces (src/cuda/sm90/attention/)
// The fields of a worker's schedule row (smem.range), by name.
using core::kBeginRequest;
using core::kBeginSplit;
using core::kBeginToken;
using core::kEndRequest;
using core::kEndToken;

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
  // (The planner's pieces need neither clamp; a caller's schedule, stale or corrupted, may: a
  // begin past the request's keys would read block-table entries past its row.)
  if (piece.tok_begin < 0) piece.tok_begin = 0;
  if (piece.tok_begin > piece.seqlen) piece.tok_begin = piece.seqlen;
  if (piece.tok_end < piece.tok_begin) piece.tok_end = piece.tok_begin;
  piece.tile_begin = piece.tok_begin & ~63;
  return piece;
}

// The origin of a CTA's row boxes in the q / out maps (params.h tma_q): its first row row0 =
// token s0 x group + head0.
struct RowsBox {
  int s0, head0;
};
__device__ __forceinline__ RowsBox rows_box(const DenseDecodeParams& p, int row0) {
  const int s0 = row0 / p.group;
  return {s0, row0 - s0 * p.group};
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
  const RowsBox box = rows_box(p, m_block * Traits::kBlockM);
#pragma unroll 1
  for (int c = first; c < Traits::kNumPieces; c += step) {
    cute::SM90_TMA_LOAD_5D::copy(&p.tma_q, &smem.q_full, p.cache_hint,
                                 smem.q + c * Traits::kQPieceElems, c * Traits::kPieceDims,
                                 box.head0, kv_head, box.s0, r);
  }
}

// Request r's Q rows of this CTA into L2 (TMA prefetch, the pieces issue_q would load).
template <class Traits>
__device__ __forceinline__ void prefetch_q(const DenseDecodeParams& p, int r, int kv_head,
                                           int m_block, int first, int step) {
  const RowsBox box = rows_box(p, m_block * Traits::kBlockM);
#pragma unroll 1
  for (int c = first; c < Traits::kNumPieces; c += step) {
    cute::SM90_TMA_LOAD_5D::PREFETCH::copy(&p.tma_q, c * Traits::kPieceDims, box.head0, kv_head,
                                           box.s0, r);
  }
}

// This warpgroup's half of request r's output rows (pieces 4 wg .. 4 wg + 3 of Q's shared memory,
// stage_out_smem) to out by TMA (rows past the request's are outside the map and not written),
// waiting until the stores have read the buffer. One thread.
template <class Traits>
__device__ __forceinline__ void store_out_tma(const DenseDecodeParams& p,
                                              typename Traits::SharedStorage& smem, int r,
                                              int kv_head, int m_block, int wg) {
  const RowsBox box = rows_box(p, m_block * Traits::kBlockM);
#pragma unroll
  for (int c = 4 * wg; c < 4 * wg + 4; ++c) {
    cute::SM90_TMA_STORE_5D::copy(&p.tma_out, smem.q + c * Traits::kQPieceElems,
                                  c * Traits::kPieceDims, box.head0, kv_head, box.s0, r);
  }
  cute::tma_store_arrive();
  cute::tma_store_wait<0>();
}

// ---------------------------------------------------------------------------------------------
// Producers: lane 0 of warps 8 and 9 fill stage 0 (the even tiles), lane 0 of warps 10 and 11
// stage 1 (the odd tiles), each refilling its pieces of a part as soon as the part is handed
// back, in the stage's part order. (One
// thread issuing both stages in a fixed order waited for the part handed back last while the
// others sat free; a producer warp holding block ids ahead or prefetching into L2 measured no
// better: NOTES.md, ideas 3, 7, 10.)

// A thread issuing TMA keeps only a few boxes in flight: one thread streams ~32 GB/s into an SM
// from DRAM (~42 from L2) however many slots are free, two threads in two warps twice that
// (openmla_bench_tma_stream, NOTES.md, idea 13). So each stage's pieces are issued by two warps.
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
                                     dst + c * Traits::kPieceElems +
                                         j * p.page_size * Traits::kPieceDims,
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
  auto field = [&](core::ScheduleField f) { return smem.range[f]; };  // the worker's row
  const Tracer trace(p, 2, sub == 0);
  int pair = 0;  // pairs loaded so far: the phase of every barrier of the stage
  for (int r = field(kBeginRequest); r <= field(kEndRequest); ++r) {
    trace.mark_request(p, 2, r - field(kBeginRequest), 2 * stage);
    const RequestPiece piece = request_piece(p, r, field(kBeginRequest), field(kBeginToken),
                                             field(kEndRequest), field(kEndToken));
    const int32_t* table = p.block_table + r * p.block_table_stride_b;
    // Pages of >= 64 keys: the block id of this stage's first tile, read here, before the tile
    // loop whose bounds wait for the seqlen (any tile below the capacity has a table entry), so
    // the two loads are in flight together at a request's start.
    int first_block = 0;
    if constexpr (!kSmallPages) {
      const int t0 = piece.tile_begin + stage * Traits::kBlockN;
      if (t0 < p.capacity) first_block = table[(t0 / p.page_size) * p.block_table_stride_n];
    }
    // The request's seqlen and first block id have arrived (what the first issue waits for).
    trace.mark_request_after(p, 2, r - field(kBeginRequest), 4 + stage, piece.seqlen + first_block);
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
        if (i == 0 && it == stage) {
          trace.mark_request(p, 2, r - field(kBeginRequest), 2 * stage + 1);
        }
      }
    }
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

}  // namespace dense_decode_detail
}  // namespace openmla::cuda::sm90
