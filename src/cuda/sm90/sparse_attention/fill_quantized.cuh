// The producer of the standard order (kernel.cuh; NOTES.md "The fill"): walks the CTA's tiles,
// looks each key up, loads its bytes once, decodes them to bf16 and stores them into a stage in
// the layout wgmma reads. Quantised keys (fp8_v32, fp8_model1, fp8_mx, fp4) go through
// registers; bf16 keys (fill_bf16.cuh) are copied by cp.async.
//
// Thread mapping: producer warp w, lane l owns key kr = 8 w + (l & 7) of every round of 32 keys
// and, of its bytes, the quarter c = l >> 3: fp8 codes 64 e + 16 c .. + 15 for each e (dims
// 64 e + 16 c: chunks 2c, 2c + 1 of piece e), fp4 codes 64 e + 16 c .. + 15 for e < 4 (dims
// 128 e + 32 c: piece 2e + c/2), bf16 RoPE bytes 32 c .. + 31. A warp's load instruction reads
// 64 contiguous bytes of 8 keys; its stores hit 8 different 16-byte bank groups per 8 lanes.
//
// A CTA alone fills both rounds of a tile; in a cluster (traits.h kCluster 2) CTA rank r fills
// round r (keys 32 r .. 32 r + 31) into its own stage and, by st.async, into its peer's, each
// store completing its bytes on the peer's full barrier: every key is loaded and decoded once,
// nothing waits for a copy. Pipelining: a key's index is read two tiles ahead, its record goes
// to L2 one tile ahead, its bytes to registers one round ahead (loaded right after the previous
// round is stored, so the loads are in flight while the producer waits for the next stage).
// Invalid keys (index < 0 or >= the cache's slots, past the list's count) are never read: zero
// rows and a 0 bit in the stage's mask.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cutlass/arch/barrier.h>

#include "cuda/common/kv_codec.cuh"
#include "cuda/sm90/attention/primitives.cuh"
#include "cuda/sm90/sparse_attention/cluster.cuh"
#include "cuda/sm90/sparse_attention/fill_bf16.cuh"
#include "cuda/sm90/sparse_attention/key_decode.cuh"
#include "cuda/sm90/sparse_attention/problem.cuh"

namespace openmla::cuda::sm90 {
namespace sparse {

using kvcodec::Codec;
constexpr int kV32 = static_cast<int>(Codec::kFP8_V32);
constexpr int kModel1 = static_cast<int>(Codec::kFP8_Model1);
constexpr int kMX = static_cast<int>(Codec::kFP8_MX);
constexpr int kFP4 = static_cast<int>(Codec::kFP4);
constexpr int kBF16 = static_cast<int>(Codec::kBF16);

// One thread's raw bytes of a key (its quarter), as loaded, packed so that a head dimension's
// formats share the fewest registers: fp8_v32 codes w[0..7], its 4 float32 scales w[8], its
// bf16 RoPE bytes w[9..10]; fp8_model1 codes w[0..6], RoPE w[7..8], its 7 e8m0 scales and pad
// byte s8; fp8_mx codes w[0..7], its 16 e8m0 scales w[8]; fp4 codes w[0..3], its 32 e4m3 scales
// w[4..5]. Codes: 16 B at data + 16 c + 64 e; RoPE: bytes 32 c .. + 31.
template <int D>
struct RawQuarter {
  uint4 w[D == 576 ? 11 : 9];
  uint2 s8;
};

__device__ __forceinline__ uint4 ld_nc16(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::evict_last.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
// 16 bytes at `p`: one wide load where the cache is aligned, else byte-exact loads.
__device__ __forceinline__ uint4 load16(const uint8_t* p, bool aligned) {
  if (aligned) return ld_nc16(p);
  uint32_t w[4];
  kvcodec::load_bytes<16>(p, w);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// The loads of one key's quarter (zeros, and no load, for an invalid key).
template <int kCodec, int D>
__device__ __forceinline__ void load_quarter(const SparseCacheParams& c, int slot, bool ok, int q,
                                             RawQuarter<D>& r) {
#pragma unroll
  for (int e = 0; e < (D == 576 ? 11 : 9); ++e) r.w[e] = make_uint4(0u, 0u, 0u, 0u);
  r.s8 = make_uint2(0u, 0u);
  if (!ok) return;
  const TokenAt tok = token_at(c, slot);
  const uint8_t* base = c.base + tok.block_base;
  const uint8_t* data = base + c.data_offset + static_cast<int64_t>(tok.offset) * c.data_stride;
  const uint8_t* scale = base + c.scale_offset + static_cast<int64_t>(tok.offset) * c.scale_stride;
  const uint8_t* rope = base + c.rope_offset + static_cast<int64_t>(tok.offset) * c.rope_stride;
  const bool a = c.aligned;
  constexpr int kChunks = kCodec == kFP4 ? 4 : kCodec == kModel1 ? 7 : 8;
#pragma unroll
  for (int e = 0; e < kChunks; ++e) r.w[e] = load16(data + 16 * q + 64 * e, a);
  if constexpr (kCodec == kV32) {
    r.w[8] = load16(scale, a);
    r.w[9] = load16(rope + 32 * q, a);
    r.w[10] = load16(rope + 32 * q + 16, a);
  } else if constexpr (kCodec == kModel1) {
    r.w[7] = load16(rope + 32 * q, a);
    r.w[8] = load16(rope + 32 * q + 16, a);
    if (a) {
      r.s8 = __ldg(reinterpret_cast<const uint2*>(scale));
    } else {
      uint32_t w[2];
      kvcodec::load_bytes<8>(scale, w);
      r.s8 = make_uint2(w[0], w[1]);
    }
  } else if constexpr (kCodec == kMX) {
    r.w[8] = load16(scale, a);
  } else {
    r.w[4] = load16(scale, a);
    r.w[5] = load16(scale + 16, a);
  }
}

// Where a round's rows go: this CTA's stage (shared window) and, in a cluster, the peer's and
// the peer's full barrier.
struct StageDst {
  uint32_t local, peer, peer_bar;
};
template <int kCluster>
__device__ __forceinline__ void put16(const StageDst& d, uint32_t off, const uint4& v) {
  st_local(d.local + off, v);
  if constexpr (kCluster == 2) st_async_peer(d.peer + off, v, d.peer_bar);
}
// Chunk `ch` (16 B) of key row `row` in piece `piece` (128 B swizzle).
__device__ __forceinline__ uint32_t chunk_at(int piece, int row, int ch) {
  return static_cast<uint32_t>(piece * 8192 + row * 128 + ((ch ^ (row & 7)) << 4));
}
__device__ __forceinline__ uint32_t byte_of(const uint4& v, int i) {
  const uint32_t w = i < 4 ? v.x : i < 8 ? v.y : i < 12 ? v.z : v.w;
  return (w >> (8 * (i & 3))) & 0xFFu;
}
__device__ __forceinline__ float word_f(const uint4& v, int i) {
  return __uint_as_float(i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w);
}

// A key's quarter decoded and stored (row `row` of the stage, quarter q).
template <int kCodec, int kCluster, int D>
__device__ __forceinline__ void store_quarter(const RawQuarter<D>& r, const StageDst& d, int row,
                                              int q) {
  uint32_t out[8];
  if constexpr (kCodec == kFP4) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const uint4 sc = r.w[4 + (e >> 1)];
      const int s0 = 8 * (e & 1) + 2 * q;  // the chunk's two scales (16 dims each)
      const int piece = 2 * e + (q >> 1), ch = 4 * (q & 1);
      e2m1x16_to_bf16(r.w[e].x, r.w[e].y, kvcodec::e4m3_to_float(byte_of(sc, s0)), out);
      put16<kCluster>(d, chunk_at(piece, row, ch), make_uint4(out[0], out[1], out[2], out[3]));
      put16<kCluster>(d, chunk_at(piece, row, ch + 1), make_uint4(out[4], out[5], out[6], out[7]));
      e2m1x16_to_bf16(r.w[e].z, r.w[e].w, kvcodec::e4m3_to_float(byte_of(sc, s0 + 1)), out);
      put16<kCluster>(d, chunk_at(piece, row, ch + 2), make_uint4(out[0], out[1], out[2], out[3]));
      put16<kCluster>(d, chunk_at(piece, row, ch + 3), make_uint4(out[4], out[5], out[6], out[7]));
    }
    return;
  }
  constexpr int kChunks = kCodec == kModel1 ? 7 : 8;
#pragma unroll
  for (int e = 0; e < kChunks; ++e) {
    float scale;
    if constexpr (kCodec == kV32) {
      scale = word_f(r.w[8], e >> 1);
    } else if constexpr (kCodec == kModel1) {
      const uint32_t word = e < 4 ? r.s8.x : r.s8.y;
      scale = kvcodec::e8m0_to_float((word >> (8 * (e & 3))) & 0xFFu);
    } else {
      scale = kvcodec::e8m0_to_float(byte_of(r.w[8], 2 * e + (q >> 1)));
    }
    const uint32_t w[4] = {r.w[e].x, r.w[e].y, r.w[e].z, r.w[e].w};
    e4m3x16_to_bf16(w, scale, out);
    put16<kCluster>(d, chunk_at(e, row, 2 * q), make_uint4(out[0], out[1], out[2], out[3]));
    put16<kCluster>(d, chunk_at(e, row, 2 * q + 1), make_uint4(out[4], out[5], out[6], out[7]));
  }
  if constexpr (kCodec == kV32) {  // bf16 RoPE dims 512-575: piece 8
    put16<kCluster>(d, chunk_at(8, row, 2 * q), r.w[9]);
    put16<kCluster>(d, chunk_at(8, row, 2 * q + 1), r.w[10]);
  } else if constexpr (kCodec == kModel1) {  // bf16 RoPE dims 448-511: piece 7
    put16<kCluster>(d, chunk_at(7, row, 2 * q), r.w[7]);
    put16<kCluster>(d, chunk_at(7, row, 2 * q + 1), r.w[8]);
  }
}

// `f` called with the codec of a quantised cache as a compile-time constant (the formats of a
// head dimension's kernel; fp16 caches have no sparse kernel: launch.cu). Each codec's loads and
// stores sit in a branch of their own, so the registers of one never meet another's.
template <int D, class F>
__device__ __forceinline__ void with_codec(int codec, F&& f) {
  if constexpr (D == 576) {
    f(std::integral_constant<int, kV32>{});
  } else if (codec == kModel1) {
    f(std::integral_constant<int, kModel1>{});
  } else if (codec == kMX) {
    f(std::integral_constant<int, kMX>{});
  } else {
    f(std::integral_constant<int, kFP4>{});
  }
}

// A bf16 key's quarter (d 512: dims 64 e + 16 q .. + 15 of each piece e) through registers into
// row `row` of a stage, 4 pieces' loads in flight at a time.
__device__ __forceinline__ void copy_bf16_quarter(const SparseCacheParams& c, int slot, bool ok,
                                                  int q, uint32_t stage, int row) {
  const uint8_t* data = c.base;
  if (ok) {
    const TokenAt tok = token_at(c, slot);
    data = c.base + tok.block_base + c.data_offset + static_cast<int64_t>(tok.offset) * c.data_stride;
  }
#pragma unroll
  for (int e0 = 0; e0 < 8; e0 += 4) {
    uint4 v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int e = e0 + i / 2;
      v[i] = ok ? load16(data + 128 * e + 32 * q + 16 * (i & 1), c.aligned)
                : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      st_local(stage + chunk_at(e0 + i / 2, row, 2 * q + (i & 1)), v[i]);
    }
  }
}

__device__ __forceinline__ void prefetch_record(const SparseCacheParams& c, int slot) {
  if (c.prefetch_bytes == 0 || !slot_ok(c, slot)) return;
  const TokenAt tok = token_at(c, slot);
  const uint8_t* rec = c.base + tok.block_base + c.data_offset +
                       static_cast<int64_t>(tok.offset) * c.data_stride;
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(rec), "r"(c.prefetch_bytes)
               : "memory");
}

template <class Traits>
__device__ __forceinline__ void fill_quantized(const SparseAttentionParams& p,
                                               typename Traits::SharedStorage& smem, int problem,
                                               int split) {
  constexpr int D = Traits::kHeadDimQK;
  constexpr bool kDense = Traits::kDense;
  constexpr int kCluster = Traits::kCluster;
  constexpr int kRounds = 2 / kCluster;  // rounds of 32 keys this CTA fills a tile
  const int warp = threadIdx.x / 32 - 8, lane = threadIdx.x % 32;
  const int kr = 8 * warp + (lane & 7), q = lane >> 3;
  const int rank = kCluster == 2 ? static_cast<int>(cluster_rank()) : 0;
  const Problem prob = problem_of<kDense>(p, problem);
  const int2 range = split_tiles<kDense>(p, prob, split);
  const int n_tiles = range.y - range.x;
  // This thread's key in round j of a tile, and its slot in tile kk of the split (-1 past it).
  auto key_of = [&](int j) { return 32 * (kCluster == 2 ? rank : j) + kr; };
  auto slot_at = [&](int kk, int j) {
    return kk < n_tiles ? slot_of<kDense>(p, tile_at(prob, range.x + kk), prob, key_of(j)) : -1;
  };
  auto cache_at = [&](int kk) -> const SparseCacheParams& {
    return p.cache[tile_at(prob, range.x + kk).cache];
  };

  const uint32_t stage0 = attention::smem_u32(smem.k[0]);
  uint32_t peer_stage0 = 0, peer_full0 = 0, peer_valid0 = 0;
  if constexpr (kCluster == 2) {
    peer_stage0 = peer_addr(stage0, rank ^ 1);
    peer_full0 = peer_addr(attention::smem_u32(&smem.full[0]), rank ^ 1);
    peer_valid0 = peer_addr(attention::smem_u32(&smem.valid[0][0]), rank ^ 1);
  }

  int cur[kRounds], nxt[kRounds];
#pragma unroll
  for (int j = 0; j < kRounds; ++j) {
    cur[j] = slot_at(0, j);
    nxt[j] = slot_at(1, j);
  }
  if (p.l2_prefetch && q == 0 && n_tiles > 0) {
#pragma unroll
    for (int j = 0; j < kRounds; ++j) prefetch_record(cache_at(0), cur[j]);
  }
  // Tile kk of the split, its cache's codec a compile-time constant.
  auto fill_tile = [&](int kk, auto codec) {
    constexpr int kCodec = decltype(codec)::value;
    const int s = kk & 1;
    const SparseCacheParams& c = cache_at(kk);
    int after[kRounds];  // two tiles ahead: the index loads are in flight for a tile
#pragma unroll
    for (int j = 0; j < kRounds; ++j) after[j] = slot_at(kk + 2, j);
    if (p.l2_prefetch && q == 0 && kk + 1 < n_tiles) {
#pragma unroll
      for (int j = 0; j < kRounds; ++j) prefetch_record(cache_at(kk + 1), nxt[j]);
    }
    // The stage is free once the compute warps (of both CTAs in a cluster) are done with it.
    auto wait_stage = [&] {
      cutlass::arch::ClusterBarrier::wait(&smem.empty[s], ((kk >> 1) & 1) ^ 1);
    };
    if constexpr (kCodec == kBF16) {
      // (never in a cluster: launch.cu pairs CTAs only over quantised caches)
      if constexpr (kCluster == 1) {
        wait_stage();
        if constexpr (D == 576) {  // by cp.async (fill_bf16.cuh)
          copy_bf16_tile<D>(c, reinterpret_cast<char*>(smem.k[s]), smem.valid[s], cur[0],
                            cur[1], warp, lane);
          attention::cp_async_track(smem.full[s]);
        } else {
          // At d 512 bf16 tiles reach this kernel only in the dense mode or beside a quantised
          // cache (sparse bf16 grids take the seesaw): through registers, as the quantised
          // quarters (the cp.async copy's addresses beside fp4's decode spilled the producer).
#pragma unroll
          for (int j = 0; j < kRounds; ++j) {
            const bool ok = slot_ok(c, cur[j]);
            copy_bf16_quarter(c, cur[j], ok, q, stage0 + s * Traits::kStageBytes, key_of(j));
            const uint32_t mask = __ballot_sync(0xffffffffu, ok) & 0xFFu;
            if (lane == 0) smem.valid[s][4 * j + warp] = mask;
          }
          attention::fence_async_smem();
        }
        __syncwarp();
        if (lane == 0) cutlass::arch::ClusterBarrier::arrive(&smem.full[s]);
      } else {
        __trap();  // a clear error rather than a hang
      }
    } else {
      RawQuarter<D> raw;
      // The first round's bytes are loaded before the wait for the stage: in flight while the
      // compute warps finish with it.
      bool ok = slot_ok(c, cur[0]);
      load_quarter<kCodec>(c, cur[0], ok, q, raw);
      wait_stage();
      StageDst dst = {stage0 + s * Traits::kStageBytes, 0u, 0u};
      if constexpr (kCluster == 2) {
        dst.peer = peer_stage0 + s * Traits::kStageBytes;
        dst.peer_bar = peer_full0 + s * 8;
        // The peer's round of this tile: its rows and its warps' mask words.
        if (warp == 0 && lane == 0) {
          arrive_expect_tx(attention::smem_u32(&smem.full[s]), Traits::kRoundBytes + 16);
        }
      }
#pragma unroll
      for (int j = 0; j < kRounds; ++j) {
        if (j > 0) {
          ok = slot_ok(c, cur[j]);
          load_quarter<kCodec>(c, cur[j], ok, q, raw);
        }
        const int row = key_of(j);
        store_quarter<kCodec, kCluster>(raw, dst, row, q);
        const uint32_t mask = __ballot_sync(0xffffffffu, ok) & 0xFFu;  // lanes 0-7: c = 0
        if (lane == 0) {
          const int word = 4 * (row >> 5) + warp;
          smem.valid[s][word] = mask;
          if constexpr (kCluster == 2) {
            st_async_peer(peer_valid0 + (8 * s + word) * 4, mask, dst.peer_bar);
          }
        }
      }
      attention::fence_async_smem();  // the stores before wgmma's (async proxy) reads
      __syncwarp();
      if (lane == 0) cutlass::arch::ClusterBarrier::arrive(&smem.full[s]);
    }
#pragma unroll
    for (int j = 0; j < kRounds; ++j) {
      cur[j] = nxt[j];
      nxt[j] = after[j];
    }
  };
  // The tiles in runs of one codec (the main cache's, then the extra cache's), each run a loop
  // of its own: one format's registers never meet another's.
  int kk = 0;
  while (kk < n_tiles) {
    const int codec = cache_at(kk).codec;
    auto run = [&](auto tag) {
      for (; kk < n_tiles && cache_at(kk).codec == codec; ++kk) fill_tile(kk, tag);
    };
    if (codec == kBF16) {
      run(std::integral_constant<int, kBF16>{});
    } else {
      with_codec<D>(codec, run);
    }
  }
  asm volatile("cp.async.wait_all;" ::: "memory");  // no thread leaves with copies in flight
}

}  // namespace sparse
}  // namespace openmla::cuda::sm90
