// SM90 dense MLA decode: what links the warp roles. Named barriers, the release of a stage's
// parts, the timeline tracer, the walk over a worker's request pieces and the TMA producers.
#pragma once

#include <cuda.h>

#include <cstdint>

#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/sm90/dense_decode/params.h"
#include "cuda/sm90/dense_decode/traits.h"

namespace openmla::cuda::sm90::dense_decode_detail {

// Named barriers (hardware ids; 0 is __syncthreads). Counts in threads.
enum : uint32_t {
  kBarRequest = 1,   // both compute WGs: Q loaded / previous request finished (256)
  kBarP0Ready = 2,   // WG0 -> WG1: P(2k) in shared memory and the running max after it (256)
  kBarP1Ready = 3,   // WG1 -> WG0: P(2k + 1), the max after it and WG0's factor (256)
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
// A part of a stage handed back to its producer warps: lane 0 of each of the 4 warps of the
// releasing warpgroup arrives (the empty barrier counts 4).
__device__ __forceinline__ void release_part(uint64_t* empty, int lane) {
  if (lane == 0) cutlass::arch::ClusterBarrier::arrive(empty);
}
// Every piece of a stage's part landed (phase `phase`). A part is handed back only after its
// pieces of that phase landed, also when nothing reads them (a tile past the piece's end):
// a release may not run ahead of the producer's arrival, or the phases would slip.
template <class Traits>
__device__ __forceinline__ void wait_part(uint64_t* full, int stage, int part, uint32_t phase) {
#pragma unroll
  for (int i = 0; i < Traits::part_num_pieces(stage, part); ++i) {
    cutlass::arch::ClusterBarrier::wait(&full[Traits::part_piece(stage, part, i)], phase);
  }
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
// Producers: lane 0 of warps 8 and 9 fill stage 0 (the even tiles), lane 0 of warps 10 and 11
// stage 1 (the odd tiles), each refilling its pieces of a part as soon as the part is handed
// back, in the stage's part order. (One thread issuing both stages in a fixed order waited for
// the part handed back last while the others sat free; a producer warp holding block ids ahead
// or prefetching into L2 measured no better: NOTES.md v3, v5c, v8.)

// A thread issuing TMA keeps only a few boxes in flight: one thread streams ~32 GB/s into an SM
// from DRAM (~42 from L2) however many slots are free, two threads in two warps twice that
// (openmla_bench_tma_stream, NOTES.md v10). So each stage's pieces are issued by two warps.
constexpr int kIssuersPerStage = 2;

// One part of the tile at key t0 (`valid` keys of it before the piece's end) into `stage`, each
// piece completing its own barrier; this thread issues the part's pieces sub, sub + 2, ...
// Pages of >= 64 keys: one 64-key box per piece (`block` is the tile's block). Smaller pages: one
// box per (page, piece), pages past the last valid key not loaded (the consumers zero those V
// rows and mask those keys).
template <class Traits, bool kSmallPages>
__device__ __forceinline__ void load_part(const DenseDecodeParams& p,
                                          typename Traits::SharedStorage& smem,
                                          const int32_t* table, int block, int row, int kv_head,
                                          int stage, int part, int t0, int valid, uint32_t phase,
                                          int sub, uint64_t hint) {
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  cutlass::arch::ClusterBarrier::wait(&smem.empty[stage][part], phase ^ 1);
  const int n = Traits::part_num_pieces(stage, part);
  // (Loops kept rolled and no divisions: the producers have 40 registers.)
  if constexpr (!kSmallPages) {  // `block`, `row`: the tile's block and first row in it
#pragma unroll 1
    for (int c = sub; c < n; c += kIssuersPerStage) {
      const int piece = Traits::part_piece(stage, part, c);
      uint64_t* full = &smem.full[stage][piece];
      Barrier::arrive_and_expect_tx(full, valid > 0 ? Traits::kPieceBytes : 0);
      if (valid > 0) {
        cute::SM90_TMA_LOAD_4D::copy(&p.tma_k, full, hint,
                                     smem.k[stage] + piece * Traits::kPieceElems,
                                     piece * Traits::kPieceDims, row, kv_head, block);
      }
    }
  } else {  // pages of 8, 16 or 32 keys (2^page_shift): the tile's pages from the table
    const int pages = (valid + p.page_size - 1) >> p.page_shift;
    const int first_page = t0 >> p.page_shift;
#pragma unroll 1
    for (int c = sub; c < n; c += kIssuersPerStage) {
      const int piece = Traits::part_piece(stage, part, c);
      uint64_t* full = &smem.full[stage][piece];
      Barrier::arrive_and_expect_tx(full, static_cast<uint32_t>(pages * p.page_size * 128));
#pragma unroll 1
      for (int j = 0; j < pages; ++j) {
        const int b = table[(first_page + j) * p.block_table_stride_n];
        cute::SM90_TMA_LOAD_4D::copy(
            &p.tma_k, full, hint,
            smem.k[stage] + piece * Traits::kPieceElems + j * p.page_size * Traits::kPieceDims,
            piece * Traits::kPieceDims, 0, kv_head, b);
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
    const RequestPiece piece = request_piece(p, r, field(0), field(1), field(2), field(3));
    const int32_t* table = p.block_table + r * p.block_table_stride_b;
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
        if (valid > 0) block = table[page * p.block_table_stride_n];
        row = t0 - page * p.page_size;
      }
      if (stage == 0) trace.mark(pair, 0);
#pragma unroll 1
      for (int i = 0; i < Traits::kNumParts; ++i) {
        load_part<Traits, kSmallPages>(p, smem, table, block, row, kv_head, stage,
                                       Traits::part_order(stage, i), t0, valid, pair & 1, sub,
                                       hint);
        trace.mark(pair, 1 + stage * Traits::kNumParts + i);  // part issued
      }
    }
  }
}

}  // namespace openmla::cuda::sm90::dense_decode_detail
