// The streaming token fill (fills.cuh): the token fill's rounds as one stream.
#pragma once

#include "cuda/sm90/sparse_decode/fill_token.cuh"

namespace openmla::cuda::sm90 {
namespace sparse_decode_detail {

// --- the streaming token fill (SparseKernelPlan::stream; NOTES.md) ---
// The fill above waits a DRAM round trip for each round and then decodes it: per round the
// latency and the decode add up. Here the rounds form one stream (a tile's rounds, then the next
// tile's, whatever stage they go to): as a chunk of round n (16 B of data a thread) is decoded
// and stored, the same registers take round n + 1's chunk, and round n + 1's scales are loaded
// before round n's decode starts, so a round's loads are in flight under the previous round's
// decode and no more raw bytes are held than before.

// Where a thread's quarter of a key lives (the data chunks, the scales); nullptr-free: an
// invalid key loads nothing.
struct TokenPtr {
  const uint4* d;  // + 4 e: bytes 64 e + 16 q of the data part
  const uint8_t* scale;
};
__device__ __forceinline__ TokenPtr token_ptr(const SparseCacheParams& c, int slot, int q) {
  int block, offset;
  block_offset(c, slot, &block, &offset);
  const uint8_t* tok = c.base + static_cast<int64_t>(block) * c.block_stride;
  TokenPtr t;
  t.d = reinterpret_cast<const uint4*>(tok + c.data_offset +
                                       static_cast<int64_t>(offset) * c.data_stride + 16 * q);
  t.scale = tok + c.scale_offset + static_cast<int64_t>(offset) * c.scale_stride;
  return t;
}
// Data chunks a thread holds of a key: fp8 8 (fp8_model1 7), fp4 4.
template <int D, int kCodec>
constexpr int stream_chunks() {
  return D == 576                                         ? 8
         : kCodec == static_cast<int>(Codec::kFP8_Model1) ? 7
         : kCodec == static_cast<int>(Codec::kFP4)        ? 4
                                                          : 8;
}
// The key's scales (load_token's), zeros for an invalid key.
template <int D, int kCodec>
__device__ __forceinline__ void stream_scales(const TokenPtr& t, bool ok, uint32_t (&s)[8]) {
  static_assert(kCodec >= 0, "the streaming fill is built for one format");
#pragma unroll
  for (int i = 0; i < 8; ++i) s[i] = 0u;
  if (!ok) return;
  const uint4* s4 = reinterpret_cast<const uint4*>(t.scale);
  if constexpr (kCodec == static_cast<int>(Codec::kFP8_Model1)) {
    const uint2 sc = __ldg(reinterpret_cast<const uint2*>(t.scale));
    s[0] = sc.x;
    s[1] = sc.y;
  } else {
#pragma unroll
    for (int i = 0; i < (kCodec == static_cast<int>(Codec::kFP4) ? 2 : 1); ++i) {
      const uint4 v = __ldg(s4 + i);
      s[4 * i] = v.x, s[4 * i + 1] = v.y, s[4 * i + 2] = v.z, s[4 * i + 3] = v.w;
    }
  }
}
// Chunk e of a thread's quarter of a key, decoded into the stage (store_token's chunk e).
template <int D, int kCodec, int kPieceStride = 8192>
__device__ __forceinline__ void stream_store_chunk(const uint4& raw, const uint32_t (&s)[8], int e,
                                                   int q, const StageDst& dst, int row) {
  auto byte_of = [](uint32_t w, int i) { return (w >> (8 * i)) & 0xFFu; };
  uint32_t v[8];
  if constexpr (kCodec == static_cast<int>(Codec::kFP4)) {
    // d[e] holds dims 128 e + 32 q .. + 31; half h's e4m3 scale is byte 8 e + 2 q + h
    const uint32_t w = (q >> 1) ? s[2 * e + 1] : s[2 * e];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      RawKey r;
      r.w[0] = h == 0 ? raw.x : raw.z;
      r.w[1] = h == 0 ? raw.y : raw.w;
      e2m1x16_to_bf16(r, kvcodec::e4m3_to_float(byte_of(w, 2 * (q & 1) + h)), v);
      store_16<false, kPieceStride>(dst, 2 * e + (q >> 1), row, 4 * (q & 1) + 2 * h, v);
    }
  } else {
    float scale;
    if constexpr (D == 576) {
      scale = kvcodec::u2f(s[e >> 1]);  // fp8_v32: float scale e / 2
    } else if constexpr (kCodec == static_cast<int>(Codec::kFP8_Model1)) {
      scale = kvcodec::e8m0_to_float(byte_of(s[e >> 2], e & 3));  // e8m0 byte e
    } else {
      scale = kvcodec::e8m0_to_float(byte_of(s[e >> 1], 2 * (e & 1) + (q >> 1)));  // fp8_mx
    }
    RawKey r;
    r.w[0] = raw.x, r.w[1] = raw.y, r.w[2] = raw.z, r.w[3] = raw.w;
    e4m3x16_to_bf16(r, scale, v);
    store_16<false, kPieceStride>(dst, e, row, 2 * q, v);
  }
}

// Whether every scale of a thread's key takes the decode's fast path (e4m3x16_to_bf16: scale
// < 2^7; e2m1x16_to_bf16: a non-NaN scale), checked once a round so that the round's loop holds
// the fast path alone (compact code: the codec's float path, inlined per chunk, made the loop
// ~8x longer, and instruction-cache misses were 20% of the producer's samples).
template <int D, int kCodec>
__device__ __forceinline__ bool stream_fast(const uint32_t (&s)[8]) {
  if constexpr (D == 576) {  // 4 float scales < 128 (NaN fails)
    bool fast = true;
#pragma unroll
    for (int i = 0; i < 4; ++i) fast &= kvcodec::u2f(s[i]) < 128.0f;
    return fast;
  } else if constexpr (kCodec == static_cast<int>(Codec::kFP4)) {  // no e4m3 NaN (x7F, xFF)
    uint32_t nan = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) nan |= __vcmpeq4(s[i] & 0x7F7F7F7Fu, 0x7F7F7F7Fu);
    return nan == 0;
  } else {  // e8m0 bytes < 134 (2^7 and NaN, 255, take the float path)
    uint32_t big;
    if constexpr (kCodec == static_cast<int>(Codec::kFP8_Model1)) {  // 7 scales: byte 7 unused
      big = __vcmpgeu4(s[0], 0x86868686u) | (__vcmpgeu4(s[1], 0x86868686u) & 0x00FFFFFFu);
    } else {
      big = __vcmpgeu4(s[0], 0x86868686u) | __vcmpgeu4(s[1], 0x86868686u) |
            __vcmpgeu4(s[2], 0x86868686u) | __vcmpgeu4(s[3], 0x86868686u);
    }
    return big == 0;
  }
}
// stream_store_chunk where stream_fast holds: the fast paths only.
template <int D, int kCodec, int kPieceStride = 8192>
__device__ __forceinline__ void stream_store_chunk_fast(const uint4& raw, const uint32_t (&s)[8],
                                                        int e, int q, const StageDst& dst,
                                                        int row) {
  if constexpr (kCodec == static_cast<int>(Codec::kFP4)) {
    stream_store_chunk<D, kCodec, kPieceStride>(raw, s, e, q, dst, row);  // (one NaN test)
  } else {
    uint32_t mul;
    if constexpr (D == 576) {
      mul = bf16x2_splat(kvcodec::u2f(s[e >> 1]) * 0x1p120f);
    } else {
      // e8m0 byte b: scale 2^(b - 127) (b 0: 2^-127), times 2^120 is bf16 exponent b + 120
      const uint32_t b = kCodec == static_cast<int>(Codec::kFP8_Model1)
                             ? (s[e >> 2] >> (8 * (e & 3))) & 0xFFu
                             : (s[e >> 1] >> (8 * (2 * (e & 1) + (q >> 1)))) & 0xFFu;
      mul = ((b + 120u) << 7) * 0x10001u;
    }
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
    uint32_t v[8];
    e4m3x16_to_bf16_fast(w, mul, v);
    store_16<false, kPieceStride>(dst, e, row, 2 * q, v);
  }
}

// produce_by_token with the rounds streamed (above); the same stages, barriers, masks, RoPE
// copies, L2 prefetch and (kPair) exchange. A round whose scales all take the fast path
// (stream_fast) runs a loop of the fast path alone; otherwise each chunk picks.
template <class Traits, bool kPair, int kCodec>
__device__ __forceinline__ void produce_by_token_stream(const SparseDecodeParams& p,
                                                        typename Traits::SharedStorage& smem,
                                                        int problem, int split) {
  constexpr int D = Traits::kHeadDimQK;
  constexpr int kChunks = stream_chunks<D, kCodec>();
  const int warp = threadIdx.x / 32 - 8, lane = threadIdx.x % 32;
  const int q = lane & 3;
  const int row0 = 8 * warp + (lane >> 2);
  const Problem keys = problem_of<Traits::kDense>(p, problem);
  const int2 range = split_tiles<Traits::kDense>(p, keys, split);
  const int rank = kPair ? static_cast<int>(cluster_rank()) : 0;
  const int r_first = kPair ? rank : 0, r_last = kPair ? rank : 1;
  auto slot_at = [&](int k, int r) {
    if (k >= range.y) return -1;
    return slot_of<Traits::kDense>(p, tile_at(keys, k), keys, row0 + 32 * r);
  };
  auto valid = [](const SparseCacheParams& c, int slot) { return slot >= 0 && slot < c.num_slots; };

  int slot0 = slot_at(range.x, 0), slot1 = slot_at(range.x, 1);
  int next0 = slot_at(range.x + 1, 0), next1 = slot_at(range.x + 1, 1);
  // The stream's first round, loaded whole.
  uint4 raw[kChunks];
  uint32_t s[8];
  {
    const int slot = r_first == 0 ? slot0 : slot1;
    const SparseCacheParams& c = p.cache[tile_at(keys, range.x).cache];
    const bool ok = range.x < range.y && valid(c, slot);
    const TokenPtr t = token_ptr(c, ok ? slot : 0, q);
    stream_scales<D, kCodec>(t, ok, s);
#pragma unroll
    for (int e = 0; e < kChunks; ++e) raw[e] = ok ? __ldg(t.d + 4 * e) : make_uint4(0u, 0u, 0u, 0u);
  }
  for (int k = range.x; k < range.y; ++k) {
    const int kk = k - range.x;
    const int stage = kk & 1;
    const int after0 = slot_at(k + 2, 0), after1 = slot_at(k + 2, 1);
    const Tile tile = tile_at(keys, k);
    const SparseCacheParams& c = p.cache[tile.cache];
    // (k + 1 < range.y here or every next slot is -1)
    const SparseCacheParams& cn = p.cache[tile_at(keys, min(k + 1, range.y - 1)).cache];
    StageDst dst;
    dst.local = reinterpret_cast<char*>(smem.k[stage]);
    dst.peer = kPair ? peer_addr(smem_u32(dst.local), rank ^ 1) : 0u;
    dst.peer_bar = kPair ? peer_addr(smem_u32(&smem.full[stage]), rank ^ 1) : 0u;
#pragma unroll 1
    for (int r = r_first; r <= r_last; ++r) {
      const int slot = r == 0 ? slot0 : slot1;
      const bool ok = valid(c, slot);
      // The stream's next round: this tile's second (unpaired, r 0), else the next tile's first.
      const bool same_tile = !kPair && r == 0;
      const int nslot = same_tile ? slot1 : (r_first == 0 ? next0 : next1);
      const SparseCacheParams& cc = same_tile ? c : cn;
      const bool nok = valid(cc, nslot);
      const TokenPtr nt = token_ptr(cc, nok ? nslot : 0, q);
      uint32_t ns[8];
      stream_scales<D, kCodec>(nt, nok, ns);
      if (r == r_first) {
        // The next tile's keys (this CTA's) into L2 while this tile's loads are in flight.
        if (k + 1 < range.y) {
          if (!kPair || r == 0) prefetch_token_l2(cn, next0, q);
          if (!kPair || r == 1) prefetch_token_l2(cn, next1, q);
        }
        // The stage is free once both compute warpgroups (of both CTAs) are done with its
        // previous tile.
        cutlass::arch::ClusterBarrier::wait(&smem.empty[stage], ((kk >> 1) & 1) ^ 1);
      }
      if constexpr (kPair) {
        const int other = r == 0 ? slot1 : slot0;
        copy_rope_async<D, kCodec>(c, other, valid(c, other), q, dst.local, row0 + 32 * (r ^ 1));
      }
      copy_rope_async<D, kCodec>(c, slot, ok, q, dst.local, row0 + 32 * r);
      if (stream_fast<D, kCodec>(s)) {
#pragma unroll
        for (int e = 0; e < kChunks; ++e) {
          stream_store_chunk_fast<D, kCodec>(raw[e], s, e, q, dst, row0 + 32 * r);
          raw[e] = nok ? __ldg(nt.d + 4 * e) : make_uint4(0u, 0u, 0u, 0u);
        }
      } else {
#pragma unroll
        for (int e = 0; e < kChunks; ++e) {
          stream_store_chunk<D, kCodec>(raw[e], s, e, q, dst, row0 + 32 * r);
          raw[e] = nok ? __ldg(nt.d + 4 * e) : make_uint4(0u, 0u, 0u, 0u);
        }
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) s[i] = ns[i];
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
