// bf16 keys (bf16 caches, sparse prefill's kv) need no decoding: they are copied into a stage by
// cp.async, no registers held, a whole tile in flight. Two fills: a tile at a time
// (copy_bf16_tile, the standard order's producer for bf16 tiles: fill_quantized.cuh) and the
// seesaw's half stages (fill_halves, order_seesaw.cuh). Both copy by 8-lane groups: lane
// (g, c) = (lane / 8, lane % 8) copies 16-byte chunk c of each 128 B piece row of one key, so a
// warp instruction moves 4 keys' rows and 8 lanes' stores hit 8 bank groups. An invalid key is
// a zero row (cp.async with no source bytes) and a 0 bit in the stage's mask.
#pragma once

#include <cstdint>

#include <cutlass/arch/barrier.h>

#include "cuda/common/kv_codec.cuh"
#include "cuda/sm90/attention/primitives.cuh"
#include "cuda/sm90/sparse_attention/problem.cuh"

namespace openmla::cuda::sm90 {
namespace sparse {

// A 64-bit warp shuffle as volatile asm: it stays after the barrier wait before it (ptxas moved
// plain shuffles above the wait, holding every fill's addresses across it).
__device__ __forceinline__ uint64_t shfl_after_wait(uint64_t v, int src_lane) {
  uint32_t lo = static_cast<uint32_t>(v), hi = static_cast<uint32_t>(v >> 32);
  asm volatile("shfl.sync.idx.b32 %0, %0, %2, 0x1f, 0xffffffff;\n\t"
               "shfl.sync.idx.b32 %1, %1, %2, 0x1f, 0xffffffff;"
               : "+r"(lo), "+r"(hi)
               : "r"(src_lane));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

// A bf16 key's row (its first byte) in the cache; the cache's base for an invalid key (never
// read: its copies have no source bytes).
__device__ __forceinline__ const uint8_t* bf16_row(const SparseCacheParams& c, int slot, bool ok) {
  if (!ok) return c.base;
  const TokenAt tok = token_at(c, slot);
  return c.base + tok.block_base + c.data_offset + static_cast<int64_t>(tok.offset) * c.data_stride;
}

// 16 bytes of key row `row`, piece `piece`, chunk `ch` of a stage: by cp.async where the cache
// is aligned, else by byte-exact loads and a store (a layout whose rows are not 16 B aligned).
__device__ __forceinline__ void copy_chunk(uint32_t stage, int row, int piece, int ch,
                                           const uint8_t* src, bool ok, bool aligned) {
  const uint32_t dst = stage + piece * 8192 + row * 128 + ((ch ^ (row & 7)) << 4);
  if (aligned) {
    attention::cp_async16_u32(dst, src, ok);
    return;
  }
  uint32_t w[4] = {0u, 0u, 0u, 0u};
  if (ok) kvcodec::load_bytes<16>(src, w);
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(dst), "r"(w[0]), "r"(w[1]),
               "r"(w[2]), "r"(w[3])
               : "memory");
}

// The standard order's bf16 tile: warp w copies the keys of the quantised fill's rows (8 w ..
// 8 w + 7 and 32 + 8 w .. + 7; lane l holds the slots of keys 8 w + (l & 7) and 32 + 8 w +
// (l & 7)) and writes their mask words (w and 4 + w). The caller tracks the copies on the full
// barrier.
template <int D>
__device__ __forceinline__ void copy_bf16_tile(const SparseCacheParams& c, char* stage,
                                               uint32_t* valid_words, int slot0, int slot1,
                                               int warp, int lane) {
  const bool ok0 = slot_ok(c, slot0), ok1 = slot_ok(c, slot1);
  const uint32_t mask0 = __ballot_sync(0xffffffffu, ok0) & 0xFFu;
  const uint32_t mask1 = __ballot_sync(0xffffffffu, ok1) & 0xFFu;
  const uint64_t row0 = reinterpret_cast<uint64_t>(bf16_row(c, slot0, ok0));
  const uint64_t row1 = reinterpret_cast<uint64_t>(bf16_row(c, slot1, ok1));
  const int g = lane >> 3, ch = lane & 7;
  const uint32_t base = attention::smem_u32(stage);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int k = g + 4 * (j & 1);  // the key in its round (0-7)
    const bool second = j >= 2;     // round 1
    const uint8_t* src = reinterpret_cast<const uint8_t*>(
                             shfl_after_wait(second ? row1 : row0, k)) + 16 * ch;
    const bool ok = (((second ? mask1 : mask0) >> k) & 1u) != 0;
    const int row = (second ? 32 : 0) + 8 * warp + k;
#pragma unroll
    for (int e = 0; e < D / 64; ++e) copy_chunk(base, row, e, ch, src + 128 * e, ok, c.aligned);
  }
  if (!c.aligned) attention::fence_async_smem();
  if (lane == 0) {
    valid_words[warp] = mask0;
    valid_words[4 + warp] = mask1;
  }
}

// The seesaw's producer (order_seesaw.cuh; bf16 keys, sparse mode). A stage is two halves with
// barriers of their own (index 2 stage + half): L, dims 0-255, which QK^T and WG0's P V read,
// and R, the rest (dims 256-511 for WG1's P V, and d 576's RoPE piece), so a half is refilled as
// soon as its readers are done with it. A round is the tiles 2i (stage 0, WG0's S) and 2i + 1
// (stage 1, WG1's S), its halves filled in the order they are freed: L0, R1, R0, L1; the odd
// tile of a round always exists (past the list's end: zeros and a zero mask). Warp w fills keys
// 16 w .. 16 w + 15 of both tiles: lanes 0-15 own the even tile's keys, lanes 16-31 the odd's.
template <class Traits>
__device__ __forceinline__ void fill_halves(const SparseAttentionParams& p,
                                            typename Traits::SharedStorage& smem, int problem,
                                            int split) {
  constexpr int D = Traits::kHeadDimQK;
  const int warp = threadIdx.x / 32 - 8, lane = threadIdx.x % 32;
  const Problem keys = problem_of<false>(p, problem);
  const int2 range = split_tiles<false>(p, keys, split);
  const int n_tiles = range.y - range.x;
  const int my_tile = lane >> 4, my_key = 16 * warp + (lane & 15);
  // This lane's key of tile kk of the split (-1 past its end).
  auto slot_at = [&](int kk) {
    return kk < n_tiles ? slot_of<false>(p, tile_at(keys, range.x + kk), keys, my_key) : -1;
  };
  int slot = slot_at(my_tile);
  for (int it = 0; 2 * it < n_tiles; ++it) {
    const int kk = 2 * it + my_tile;
    const int next = slot_at(kk + 2);  // the next round's index, in flight during this one
    const SparseCacheParams& c = p.cache[tile_at(keys, range.x + min(kk, n_tiles - 1)).cache];
    const bool valid = slot_ok(c, slot);
    const uint32_t ballot = __ballot_sync(0xffffffffu, valid);
    const uint8_t* my_row = bf16_row(c, slot, valid);
    // Half part (0: L, pieces 0-3; 1: R, pieces 4-7 and d 576's RoPE piece) of tile 2 it + s
    // into stage s, once its readers have freed it: lane (g, ch) copies chunk ch of every piece
    // row of the warp's keys g + 4 j (j = 0 .. 3).
    auto fill = [&](int s, int part) {
      cutlass::arch::ClusterBarrier::wait(&smem.empty[2 * s + part], (it & 1) ^ 1);
      const int g = lane >> 3, ch = lane & 7;
      const uint32_t stage = attention::smem_u32(smem.k[s]);
      const uint32_t mask = (ballot >> (16 * s)) & 0xFFFFu;
      // (not unrolled: the producer's 40 registers hold one key's addresses at a time)
#pragma unroll 1
      for (int j = 0; j < 4; ++j) {
        const int key = g + 4 * j;
        const bool ok = (mask >> key) & 1u;
        const uint8_t* src = reinterpret_cast<const uint8_t*>(shfl_after_wait(
                                 reinterpret_cast<uint64_t>(my_row), 16 * s + key)) +
                             16 * ch;
        const int row = 16 * warp + key;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int piece = 4 * part + e;
          copy_chunk(stage, row, piece, ch, src + 128 * piece, ok, true);
        }
        if (D == 576 && part == 1) copy_chunk(stage, row, 8, ch, src + 8 * 128, ok, true);
      }
      if (part == 1 && lane == 0) {  // the stage's mask goes with its R half (read after R)
        smem.valid[s][2 * warp] = mask & 0xFFu;
        smem.valid[s][2 * warp + 1] = mask >> 8;
      }
      attention::cp_async_track(smem.full[2 * s + part]);
      __syncwarp();
      if (lane == 0) cutlass::arch::ClusterBarrier::arrive(&smem.full[2 * s + part]);
    };
    fill(0, 0);
    fill(1, 1);
    fill(0, 1);
    fill(1, 0);
    slot = next;
  }
  asm volatile("cp.async.wait_all;" ::: "memory");  // no thread leaves with copies in flight
}

}  // namespace sparse
}  // namespace openmla::cuda::sm90
