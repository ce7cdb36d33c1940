// The fills of whole key rows (fills.cuh): a warp per key for any format, and the bf16 halves of
// the seesaw order.
#pragma once

#include "cuda/sm90/sparse_decode/fill_common.cuh"

namespace openmla::cuda::sm90 {
namespace sparse_decode_detail {

// The producer warpgroup (warps 8-11): warp w fills keys 16 w .. 16 w + 15 of every tile.
template <class Traits>
__device__ __forceinline__ void produce(const SparseDecodeParams& p,
                                        typename Traits::SharedStorage& smem, int problem,
                                        int split) {
  constexpr int D = Traits::kHeadDimQK;
  constexpr int kBatch = Traits::kLoadBatch;
  const int warp = threadIdx.x / 32 - 8, lane = threadIdx.x % 32;
  const Problem keys = problem_of<Traits::kDense>(p, problem);
  const int2 range = split_tiles<Traits::kDense>(p, keys, split);
  const int my_key = 16 * warp + (lane & 15);

  // The slot of this lane's key (lanes 0-15) of tile k (-1 past the split), and the L2 prefetch
  // of that key's bytes.
  auto slot_at = [&](int k) {
    if (lane >= 16 || k >= range.y) return -1;
    return slot_of<Traits::kDense>(p, tile_at(keys, k), keys, my_key);
  };
  auto prefetch = [&](int k, int slot) {
    if (lane >= 16 || k >= range.y) return;
    const SparseCacheParams& c = p.cache[tile_at(keys, k).cache];
    if (c.prefetch_bytes > 0 && slot >= 0 && slot < c.num_slots) {
      int block, offset;
      block_offset(c, slot, &block, &offset);
      prefetch_l2(c.base + static_cast<int64_t>(block) * c.block_stride + c.data_offset +
                      static_cast<int64_t>(offset) * c.data_stride,
                  c.prefetch_bytes);
    }
  };

  // Indices run two tiles ahead and bytes one tile ahead: at tile k the index of tile k + 2 is
  // requested (first used a tile later) and tile k + 1's keys, whose indices arrived during tile
  // k - 1, go to L2; so no index load and no DRAM miss sits on a tile's critical path.
  int next_slot = slot_at(range.x + 1);
  int slot = slot_at(range.x);
  prefetch(range.x, slot);
  for (int k = range.x; k < range.y; ++k) {
    const int kk = k - range.x;
    const int stage = kk & 1;
    const int after_next_slot = slot_at(k + 2);
    prefetch(k + 1, next_slot);
    const Tile tile = tile_at(keys, k);
    const SparseCacheParams& c = p.cache[tile.cache];
    const bool valid = lane < 16 && slot >= 0 && slot < c.num_slots;
    const uint32_t mask = __ballot_sync(0xffffffffu, valid) & 0xFFFFu;
    int block = 0, offset = 0;
    if (valid) block_offset(c, slot, &block, &offset);
    const int64_t block_base = static_cast<int64_t>(block) * c.block_stride;

    // The stage is free once both compute warpgroups are done with its previous tile.
    cutlass::arch::ClusterBarrier::wait(&smem.empty[stage], ((kk >> 1) & 1) ^ 1);
    char* dst = reinterpret_cast<char*>(smem.k[stage]);
    if (c.async_copy) {
      // bf16: cp.async straight into the stage; the full barrier completes when the copies land,
      // so the warp goes on to the next tile at once. (Handing a stage over only after the next
      // tile's copies were issued deadlocks from the third tile: that next stage is freed by WG0
      // only once it has this one.)
      // The owning lane (0-15) forms its key's row address once; the warp's copies of key j
      // take it by one 64-bit shuffle (an invalid key copies nothing from the cache's base).
      const uint8_t* my_row =
          c.base +
          (valid ? block_base + c.data_offset + static_cast<int64_t>(offset) * c.data_stride : 0);
      char* rows = dst + 16 * warp * 128;
      if (!Traits::kDense && p.group_fill) {
        // The group fill (produce_halves): lane (i, c) copies 16-byte chunk c of every 128 B
        // piece row of keys i + 4 j, all 16 B copies (the RoPE piece too), a quarter-warp's 8
        // stores in 8 bank groups. (Not in the dense mode, whose producer's 88 registers it
        // would overflow.)
        const int gi = lane >> 3, cc = lane & 7;
        const uint32_t base = smem_u32(rows) + gi * 128;
#pragma unroll 1
        for (int j = 0; j < 4; ++j) {
          const int key = gi + 4 * j;
          const bool ok = (mask >> key) & 1u;
          const uint8_t* row = reinterpret_cast<const uint8_t*>(
                                   shfl_after_wait(reinterpret_cast<uint64_t>(my_row), key)) +
                               16 * cc;
          const uint32_t r = base + 512 * j + ((cc ^ (gi | ((j & 1) << 2))) << 4);
#pragma unroll
          for (int e = 0; e < Traits::kNumPieces; ++e)
            cp_async16_u32(r + e * 8192, row + e * 128, ok);
        }
      } else {
#pragma unroll 4
        for (int key = 0; key < Traits::kKeysPerWarp; ++key) {
          const uint8_t* row = reinterpret_cast<const uint8_t*>(
              __shfl_sync(0xffffffffu, reinterpret_cast<uint64_t>(my_row), key));
          copy_key_async<D>(row, (mask >> key) & 1u, rows + key * 128, key & 7, lane);
        }
      }
      if (lane == 0) {
        smem.valid[stage][2 * warp] = mask & 0xFFu;
        smem.valid[stage][2 * warp + 1] = mask >> 8;
      }
      cp_async_track(smem.full[stage]);
      __syncwarp();
      if (lane == 0) cutlass::arch::ClusterBarrier::arrive(&smem.full[stage]);
      slot = next_slot;
      next_slot = after_next_slot;
      continue;
    }
#pragma unroll 1
    for (int b = 0; b < Traits::kKeysPerWarp; b += kBatch) {
      RawKey raw[kBatch];
#pragma unroll
      for (int e = 0; e < kBatch; ++e) {  // every load of the batch in flight together
        const int key = b + e;
        const int64_t base = __shfl_sync(0xffffffffu, block_base, key);
        const int off = __shfl_sync(0xffffffffu, offset, key);
        if ((mask >> key) & 1u) load_raw<D>(c, base, off, lane, raw[e]);
      }
#pragma unroll
      for (int e = 0; e < kBatch; ++e) {
        const int key = b + e;
        uint32_t v[8] = {0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u};
        uint32_t tail = 0u;
        if ((mask >> key) & 1u) decode_raw<D>(c.codec, lane, raw[e], v, tail);
        store_row<D>(dst, 16 * warp + key, lane, v, tail);
      }
    }
    if (lane == 0) {
      smem.valid[stage][2 * warp] = mask & 0xFFu;
      smem.valid[stage][2 * warp + 1] = mask >> 8;
    }
    fence_async_smem();  // the generic stores before wgmma's (async proxy) reads
    __syncwarp();
    if (lane == 0) cutlass::arch::ClusterBarrier::arrive(&smem.full[stage]);
    slot = next_slot;
    next_slot = after_next_slot;
  }
  // No thread leaves with its copies still in flight.
  asm volatile("cp.async.wait_all;" ::: "memory");
}

// The seesaw kernel's producer (kernel.cuh consume_seesaw; bf16 keys by cp.async, the sparse
// mode). A stage is two halves with barriers of their own (index 2 stage + half): L, dims
// 0-255, which QK^T and WG0's P V read, and R, the rest (dims 256-511 for WG1's P V, and the
// RoPE piece), so a half is refilled as soon as its readers are done with it. A round is the
// tiles 2i (stage 0, WG0's S) and 2i + 1 (stage 1, WG1's S), its halves filled in the order
// they are freed: L0, R1, R0, L1. Warp w fills keys 16 w .. 16 w + 15 of both tiles: lanes
// 0-15 own the even tile's keys, lanes 16-31 the odd tile's; a key's half is one 16 B copy a
// lane (512 contiguous bytes a warp instruction), plus the 128 B RoPE by 8 lanes.
template <class Traits>
__device__ __forceinline__ void produce_halves(const SparseDecodeParams& p,
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
    const bool valid = slot >= 0 && slot < c.num_slots;
    const uint32_t ballot = __ballot_sync(0xffffffffu, valid);
    int block = 0, offset = 0;
    if (valid) block_offset(c, slot, &block, &offset);
    const uint8_t* my_row =
        c.base + (valid ? static_cast<int64_t>(block) * c.block_stride + c.data_offset +
                              static_cast<int64_t>(offset) * c.data_stride
                        : 0);
    // The round has its odd tile (the stagger always: past the end, zeros and a zero mask).
    const bool odd = Traits::kStagger || 2 * it + 1 < n_tiles;
    // Half `h` of tile 2 it + s into stage s, once its readers have freed it.
    auto fill = [&](int s, int h) {
      cutlass::arch::ClusterBarrier::wait(&smem.empty[2 * s + h], (it & 1) ^ 1);
      char* rows = reinterpret_cast<char*>(smem.k[s]) + 16 * warp * 128;
      const uint32_t mask = (ballot >> (16 * s)) & 0xFFFFu;
#pragma unroll 2
      for (int key = 0; key < 16; ++key) {
        const uint8_t* row = reinterpret_cast<const uint8_t*>(
            __shfl_sync(0xffffffffu, reinterpret_cast<uint64_t>(my_row), 16 * s + key));
        const bool ok = (mask >> key) & 1u;
        char* r = rows + key * 128;
        const int sw = key & 7;  // the row's 128 B swizzle (16 w is a multiple of 8)
        cp_async<16>(r + (4 * h + (lane >> 3)) * 8192 + (((lane & 7) ^ sw) << 4),
                     row + 512 * h + 16 * lane, ok);
        if constexpr (D == 576) {
          if (h == 1 && lane < 8) {
            cp_async<16>(r + 8 * 8192 + ((lane ^ sw) << 4), row + 1024 + 16 * lane, ok);
          }
        }
      }
      if (h == 1 && lane == 0) {  // the stage's mask goes with its R half (read after R's wait)
        smem.valid[s][2 * warp] = mask & 0xFFu;
        smem.valid[s][2 * warp + 1] = mask >> 8;
      }
      cp_async_track(smem.full[2 * s + h]);
      __syncwarp();
      if (lane == 0) cutlass::arch::ClusterBarrier::arrive(&smem.full[2 * s + h]);
    };
    // The group fill (params.group_fill): lane (i, c) = (lane / 8, lane % 8) copies 16-byte chunk
    // c of every 128 B piece row of the warp's keys i + 4 j (j = 0 .. 3), so a warp instruction
    // moves 4 keys' rows (4 lines, as the copies above) and a lane takes a key's row address once
    // a fill (a 64-bit shuffle) where the copies above shuffle it for every key and copy; the
    // shared-memory offsets are constants but for the key's swizzle (i + 4 j) & 7, one of two
    // values. A lane's four keys of tile 2 it + s: pieces p0 .. p0 + np - 1, and d 576's RoPE
    // piece where `rope`.
    auto fill_groups = [&](int s, int part, int p0, int np, bool rope) {
      cutlass::arch::ClusterBarrier::wait(&smem.empty[Traits::kParts * s + part], (it & 1) ^ 1);
      const int gi = lane >> 3, cc = lane & 7;
      const uint32_t rows = smem_u32(reinterpret_cast<char*>(smem.k[s])) + (16 * warp + gi) * 128;
      const uint32_t mask = (ballot >> (16 * s)) & 0xFFFFu;
      // (not unrolled: the producer's 40 registers hold one key's addresses at a time)
#pragma unroll 1
      for (int j = 0; j < 4; ++j) {
        const int key = gi + 4 * j;
        const bool ok = (mask >> key) & 1u;
        const uint8_t* row = reinterpret_cast<const uint8_t*>(shfl_after_wait(
                                 reinterpret_cast<uint64_t>(my_row), 16 * s + key)) +
                             16 * cc;
        const uint32_t r = rows + 512 * j + ((cc ^ (gi | ((j & 1) << 2))) << 4);
#pragma unroll
        for (int e = 0; e < np; ++e) cp_async16_u32(r + (p0 + e) * 8192, row + (p0 + e) * 128, ok);
        if (D == 576 && rope) cp_async16_u32(r + 8 * 8192, row + 8 * 128, ok);
      }
      if (rope && lane == 0) {  // the stage's mask goes with its last part
        smem.valid[s][2 * warp] = mask & 0xFFu;
        smem.valid[s][2 * warp + 1] = mask >> 8;
      }
      cp_async_track(smem.full[Traits::kParts * s + part]);
      __syncwarp();
      if (lane == 0) cutlass::arch::ClusterBarrier::arrive(&smem.full[Traits::kParts * s + part]);
    };
    if (p.group_fill) {
      fill_groups(0, 0, 0, 4, false);
      if (odd) fill_groups(1, 1, 4, 4, true);
      fill_groups(0, 1, 4, 4, true);
      if (odd) fill_groups(1, 0, 0, 4, false);
    } else {
      fill(0, 0);
      if (odd) fill(1, 1);
      fill(0, 1);
      if (odd) fill(1, 0);
    }
    slot = next;
  }
  asm volatile("cp.async.wait_all;" ::: "memory");  // no thread leaves with copies in flight
}

}  // namespace sparse_decode_detail
}  // namespace openmla::cuda::sm90
