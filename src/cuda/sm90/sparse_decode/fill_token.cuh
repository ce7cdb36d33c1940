// The token fill of quantised caches (fills.cuh): a key quarter a thread, round by round.
#pragma once

#include "cuda/sm90/sparse_decode/fill_common.cuh"

namespace openmla::cuda::sm90 {
namespace sparse_decode_detail {

// ---- The token fill (quantised caches whose parts are aligned: SparseCacheParams::by_token) ----
// Lane l of producer warp w owns key 8 w + (l >> 2) (round 0) and 32 + 8 w + (l >> 2) (round 1)
// of every tile, and of each key the quarter q = l & 3: fp8 data bytes 64 e + 16 q .. + 15 for
// e = 0 .. 7 (dims 64 e + 16 q ..: piece e), fp4 bytes 64 e + 16 q .. + 15 for e = 0 .. 3 (dims
// 128 e + 32 q ..), the key's scales in one or two small loads, and 32 bytes of its bf16 RoPE
// part (by cp.async straight into the stage: no registers, no decoding). The 4 lanes of a key
// read 64 contiguous bytes an instruction (whole sectors); one 64-bit address a key and a thread
// (the warp-per-key fill needs one a key and a lane), and every load of a round is independent:
// a round (32 keys, half a tile) is in flight at once, where the warp-per-key fill has 16 keys.
// A round's loads are issued before the stage is waited for, and the next tile's bytes go to L2
// a tile ahead by `prefetch.global.L2` (one per 128 B line and thread).

// A thread's raw bytes of one key.
struct TokenRaw {
  uint4 d[8];     // data: fp8 8 x 16 codes; fp4 4 x 32 codes (d[0..3])
  uint32_t s[8];  // scales: fp8_v32 4 floats; fp8_model1 8 e8m0 (7 used); fp8_mx 16 e8m0;
                  // fp4 32 e4m3
};

// kCodec: the cache's kvcodec::Codec when the fill is built for one format (one loop a format:
// no branches over the others, less code), -1 to read it from the cache at run time.
template <int kCodec>
__device__ __forceinline__ int codec_of(const SparseCacheParams& c) {
  return kCodec >= 0 ? kCodec : c.codec;
}

template <int D, int kCodec>
__device__ __forceinline__ void load_token(const SparseCacheParams& c, int slot, int q,
                                           TokenRaw& t) {
  const int codec = codec_of<kCodec>(c);
  int block, offset;
  block_offset(c, slot, &block, &offset);
  const uint8_t* tok = c.base + static_cast<int64_t>(block) * c.block_stride;
  const uint8_t* data = tok + c.data_offset + static_cast<int64_t>(offset) * c.data_stride;
  const uint8_t* scale = tok + c.scale_offset + static_cast<int64_t>(offset) * c.scale_stride;
  const uint4* d = reinterpret_cast<const uint4*>(data + 16 * q);  // + 4 e: bytes 64 e + 16 q
  const uint4* s4 = reinterpret_cast<const uint4*>(scale);
  auto scales16 = [&](int i) {
    const uint4 v = __ldg(s4 + i);
    t.s[4 * i] = v.x, t.s[4 * i + 1] = v.y, t.s[4 * i + 2] = v.z, t.s[4 * i + 3] = v.w;
  };
  if constexpr (D == 576) {  // fp8_v32: 4 float scales (one per 128 dims)
#pragma unroll
    for (int e = 0; e < 8; ++e) t.d[e] = __ldg(d + 4 * e);
    scales16(0);
  } else if (codec == static_cast<int>(Codec::kFP8_Model1)) {  // 448 data bytes, 7 e8m0
#pragma unroll
    for (int e = 0; e < 7; ++e) t.d[e] = __ldg(d + 4 * e);
    const uint2 sc = __ldg(reinterpret_cast<const uint2*>(scale));
    t.s[0] = sc.x;
    t.s[1] = sc.y;
  } else if (codec == static_cast<int>(Codec::kFP8_MX)) {  // 16 e8m0 (one per 32 dims)
#pragma unroll
    for (int e = 0; e < 8; ++e) t.d[e] = __ldg(d + 4 * e);
    scales16(0);
  } else {  // fp4: 256 data bytes, 32 e4m3 (one per 16 dims)
#pragma unroll
    for (int e = 0; e < 4; ++e) t.d[e] = __ldg(d + 4 * e);
    scales16(0);
    scales16(1);
  }
}

// Where a thread's decoded rows go: the stage, and (kPair) the peer CTA's copy of it at the
// same offsets (a shared::cluster address, pair.cuh).
struct StageDst {
  char* local;
  uint32_t peer;      // the peer's stage (shared::cluster)
  uint32_t peer_bar;  // the peer's full barrier of the stage: st.async completes bytes on it
};
// 16 bf16 dims (8 words) into chunks `chunk`, `chunk` + 1 of row `row` of piece `piece` (pieces
// kPieceStride bytes apart: 8 KB in a stage, 4 KB in a round slot).
template <bool kPair, int kPieceStride = 8192>
__device__ __forceinline__ void store_16(const StageDst& dst, int piece, int row, int chunk,
                                         const uint32_t (&v)[8]) {
  const int off = piece * kPieceStride + row * 128;
  const int o0 = off + ((chunk ^ (row & 7)) << 4), o1 = off + (((chunk + 1) ^ (row & 7)) << 4);
  const uint4 lo = make_uint4(v[0], v[1], v[2], v[3]), hi = make_uint4(v[4], v[5], v[6], v[7]);
  if constexpr (kPair) {  // shared-window stores by address (generic ones cost 64-bit registers)
    const uint32_t local = smem_u32(dst.local);
    st_local(local + o0, lo);
    st_local(local + o1, hi);
    st_async_peer(dst.peer + o0, lo, dst.peer_bar);
    st_async_peer(dst.peer + o1, hi, dst.peer_bar);
  } else {
    *reinterpret_cast<uint4*>(dst.local + o0) = lo;
    *reinterpret_cast<uint4*>(dst.local + o1) = hi;
  }
}
// The key's 32 B of RoPE (bf16 dims 16 q .. 16 q + 15 of the RoPE piece) by cp.async; zeros for
// an invalid key (nothing read).
template <int D, int kCodec>
__device__ __forceinline__ void copy_rope_async(const SparseCacheParams& c, int slot, bool ok,
                                                int q, char* stage, int row) {
  const int codec = codec_of<kCodec>(c);
  if (codec != static_cast<int>(Codec::kFP8_V32) && codec != static_cast<int>(Codec::kFP8_Model1)) {
    return;
  }
  const uint8_t* rope = c.base;
  if (ok) {
    int block, offset;
    block_offset(c, slot, &block, &offset);
    rope += static_cast<int64_t>(block) * c.block_stride + c.rope_offset +
            static_cast<int64_t>(offset) * c.rope_stride + 32 * q;
  }
  char* base = stage + (D == 576 ? 8 : 7) * 8192 + row * 128;
  cp_async<16>(base + (((2 * q) ^ (row & 7)) << 4), rope, ok);
  cp_async<16>(base + (((2 * q + 1) ^ (row & 7)) << 4), rope + 16, ok);
}

// A thread's quarter of one key, decoded into the stage. An invalid key's raw words are zeros
// (never loaded): zero codes times a zero (or e8m0 2^-127) scale decode to zeros, so no select.
// A quarter-warp's 8 lanes are 2 keys (rows of different parity) x 4 quarters: 8 different
// 16 B bank groups a store (fp4: 2-way; storing lanes q = 2, 3's halves in the other order
// measured no faster, sparse_decode/NOTES.md).
template <int D, int kCodec, bool kPair>
__device__ __forceinline__ void store_token(const SparseCacheParams& c, const TokenRaw& t, int q,
                                            const StageDst& stage, int row) {
  const int codec = codec_of<kCodec>(c);
  uint32_t v[8];
  auto fp8_chunk = [&](int e, float scale) {  // dims 64 e + 16 q .. + 15: piece e
    RawKey r;
    r.w[0] = t.d[e].x, r.w[1] = t.d[e].y, r.w[2] = t.d[e].z, r.w[3] = t.d[e].w;
    e4m3x16_to_bf16(r, scale, v);
    store_16<kPair>(stage, e, row, 2 * q, v);
  };
  auto byte_of = [](uint32_t w, int i) { return (w >> (8 * i)) & 0xFFu; };
  if constexpr (D == 576) {  // fp8_v32: float scale e / 2
#pragma unroll
    for (int e = 0; e < 8; ++e) fp8_chunk(e, kvcodec::u2f(t.s[e >> 1]));
  } else if (codec == static_cast<int>(Codec::kFP8_Model1)) {  // e8m0 byte e
#pragma unroll
    for (int e = 0; e < 7; ++e) {
      fp8_chunk(e, kvcodec::e8m0_to_float(byte_of(t.s[e >> 2], e & 3)));
    }
  } else if (codec == static_cast<int>(Codec::kFP8_MX)) {  // e8m0 byte 2 e + q / 2
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      fp8_chunk(e, kvcodec::e8m0_to_float(byte_of(t.s[e >> 1], 2 * (e & 1) + (q >> 1))));
    }
  } else {  // fp4: d[e] holds dims 128 e + 32 q .. + 31; half h's e4m3 scale is byte 8 e + 2 q + h
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const uint32_t w = (q >> 1) ? t.s[2 * e + 1] : t.s[2 * e];  // a select, no dynamic index
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        RawKey r;
        r.w[0] = h == 0 ? t.d[e].x : t.d[e].z;
        r.w[1] = h == 0 ? t.d[e].y : t.d[e].w;
        e2m1x16_to_bf16(r, kvcodec::e4m3_to_float(byte_of(w, 2 * (q & 1) + h)), v);
        store_16<kPair>(stage, 2 * e + (q >> 1), row, 4 * (q & 1) + 2 * h, v);
      }
    }
  }
}

// The key's bytes (its run of prefetch_bytes from the data part) into L2, a 128 B line a
// thread and 512 B of the run.
__device__ __forceinline__ void prefetch_token_l2(const SparseCacheParams& c, int slot, int q) {
  if (c.prefetch_bytes <= 0 || slot < 0 || slot >= c.num_slots) return;
  int block, offset;
  block_offset(c, slot, &block, &offset);
  const uint8_t* data = c.base + static_cast<int64_t>(block) * c.block_stride + c.data_offset +
                        static_cast<int64_t>(offset) * c.data_stride;
  for (int o = 128 * q; o < c.prefetch_bytes; o += 512) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(data + o));
  }
}

// The named barrier of the producer warpgroup in a CTA pair (ids 1-4 are kernel.cuh's).
constexpr uint32_t kBarFill = 5;

// The pieces of a key a pair's producer decodes (and sends the peer): the data part's 64-dim
// pieces (the RoPE piece goes by cp.async in each CTA).
template <int D, int kCodec>
constexpr int pair_data_pieces() {
  static_assert(kCodec >= 0, "a CTA pair needs the fill built for its format");
  return kCodec == static_cast<int>(Codec::kFP8_Model1) ? 7 : 8;
}

// A token-fill round's key mask into the stage's word: key j's bit is lane 4 j's, gathered into
// bits 0 .. 7.
__device__ __forceinline__ void store_round_mask(bool ok, int lane, uint32_t* word) {
  uint32_t mask = __ballot_sync(0xffffffffu, ok) & 0x11111111u;
  mask = (mask | (mask >> 3)) & 0x03030303u;
  mask = (mask | (mask >> 6)) & 0x000F000Fu;
  mask = (mask | (mask >> 12)) & 0xFFu;
  if (lane == 0) *word = mask;
}

// A token-fill stage handed to the compute warpgroups once a warp has stored its rounds: the
// generic stores made visible to wgmma, (kPair) the CTA's round sent to the peer, and the full
// barrier arrived on once the warp's RoPE copies land.
template <class Traits, bool kPair, int kCodec>
__device__ __forceinline__ void hand_over_token_stage(typename Traits::SharedStorage& smem,
                                                      int stage, const StageDst& dst, int warp,
                                                      int lane, int rank) {
  constexpr int D = Traits::kHeadDimQK;
  fence_async_smem();  // the generic stores before wgmma's (and the bulk copies') reads
  if constexpr (kPair) {
    // The round's rows into the peer's stage once all four warps have stored theirs: a piece's
    // rows 32 rank .. 32 rank + 31 are 4 KB contiguous, the round's mask words 16 B.
    attention::bar_sync(kBarFill, 128);
    if (warp == 0 && lane == 0) {
      const uint32_t off = 32 * rank * 128, src = smem_u32(dst.local) + off;
#pragma unroll 1
      for (int e = 0; e < pair_data_pieces<D, kCodec>(); ++e) {
        bulk_to_peer(dst.peer + off + e * 8192, src + e * 8192, 4096, dst.peer_bar);
      }
      const uint32_t mask_words = smem_u32(&smem.valid[stage][4 * rank]);
      bulk_to_peer(peer_addr(mask_words, rank ^ 1), mask_words, 16, dst.peer_bar);
    }
  }
  cp_async_track(smem.full[stage]);  // and the RoPE copies land before the stage is full
  __syncwarp();
  if (lane == 0) {
    if constexpr (kPair) {
      // The peer's bulk copies of its round (its 32 keys' decoded pieces and 4 mask words)
      // complete on this barrier too: each warp expects a quarter of their bytes.
      cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(
          &smem.full[stage], 8 * 128 * pair_data_pieces<D, kCodec>() + 4);
    } else {
      cutlass::arch::ClusterBarrier::arrive(&smem.full[stage]);
    }
  }
}

// kPair (pair.cuh): this CTA decodes only round `rank` of each tile (32 keys) and stores it into
// both CTAs' stages; the RoPE copies (cp.async, local only) still cover both rounds.
template <class Traits, bool kPair, int kCodec>
__device__ __forceinline__ void produce_by_token(const SparseDecodeParams& p,
                                                 typename Traits::SharedStorage& smem, int problem,
                                                 int split) {
  constexpr int D = Traits::kHeadDimQK;
  const int warp = threadIdx.x / 32 - 8, lane = threadIdx.x % 32;
  const int q = lane & 3;
  const int row0 = 8 * warp + (lane >> 2);
  const Problem keys = problem_of<Traits::kDense>(p, problem);
  const int2 range = split_tiles<Traits::kDense>(p, keys, split);
  const int rank = kPair ? static_cast<int>(cluster_rank()) : 0;
  auto slot_at = [&](int k, int r) {
    if (k >= range.y) return -1;
    return slot_of<Traits::kDense>(p, tile_at(keys, k), keys, row0 + 32 * r);
  };

  // Indices two tiles ahead and bytes into L2 one tile ahead (as the warp-per-key fill): at tile
  // k the indices of tile k + 2 are requested and tile k + 1's keys, whose indices arrived during
  // tile k - 1, go to L2.
  int slot0 = slot_at(range.x, 0), slot1 = slot_at(range.x, 1);
  int next0 = slot_at(range.x + 1, 0), next1 = slot_at(range.x + 1, 1);
  for (int k = range.x; k < range.y; ++k) {
    const int kk = k - range.x;
    const int stage = kk & 1;
    const int after0 = slot_at(k + 2, 0), after1 = slot_at(k + 2, 1);
    const Tile tile = tile_at(keys, k);
    const SparseCacheParams& c = p.cache[tile.cache];
    StageDst dst;
    dst.local = reinterpret_cast<char*>(smem.k[stage]);
    dst.peer = kPair ? peer_addr(smem_u32(dst.local), rank ^ 1) : 0u;
    dst.peer_bar = kPair ? peer_addr(smem_u32(&smem.full[stage]), rank ^ 1) : 0u;
    // One round (32 keys) in flight at a time: the other round's raw bytes do not fit the
    // producer's registers on top of them (ptxas spills), hence `unroll 1`. A pair's CTA does
    // one round.
#pragma unroll 1
    for (int r = kPair ? rank : 0; r < (kPair ? rank + 1 : 2); ++r) {
      const int slot = r == 0 ? slot0 : slot1;
      const bool ok = slot >= 0 && slot < c.num_slots;
      TokenRaw t;
      if (ok) {
        load_token<D, kCodec>(c, slot, q, t);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          t.d[e] = make_uint4(0u, 0u, 0u, 0u);
          t.s[e] = 0u;
        }
      }
      if (kPair || r == 0) {
        // The next tile's keys (this CTA's) into L2 while this tile's loads are in flight.
        if (k + 1 < range.y) {
          const SparseCacheParams& cn = p.cache[tile_at(keys, k + 1).cache];
          if (!kPair || r == 0) prefetch_token_l2(cn, next0, q);
          if (!kPair || r == 1) prefetch_token_l2(cn, next1, q);
        }
        // The stage is free once both compute warpgroups (of both CTAs) are done with its
        // previous tile.
        cutlass::arch::ClusterBarrier::wait(&smem.empty[stage], ((kk >> 1) & 1) ^ 1);
      }
      if constexpr (kPair) {
        const int other = r == 0 ? slot1 : slot0;
        copy_rope_async<D, kCodec>(c, other, other >= 0 && other < c.num_slots, q, dst.local,
                                   row0 + 32 * (r ^ 1));
      }
      copy_rope_async<D, kCodec>(c, slot, ok, q, dst.local, row0 + 32 * r);
      store_token<D, kCodec, false>(c, t, q, dst, row0 + 32 * r);
      store_round_mask(ok, lane, &smem.valid[stage][4 * r + warp]);
    }
    hand_over_token_stage<Traits, kPair, kCodec>(smem, stage, dst, warp, lane, rank);
    slot0 = next0;
    slot1 = next1;
    next0 = after0;
    next1 = after1;
  }
  asm volatile("cp.async.wait_all;" ::: "memory");  // no thread leaves with copies in flight
}

}  // namespace sparse_decode_detail
}  // namespace openmla::cuda::sm90
