// The ring fill (fills.cuh): raw bytes by cp.async into shared memory, decoded from there.
#pragma once

#include "cuda/sm90/sparse_decode/fill_token_stream.cuh"

namespace openmla::cuda::sm90 {
namespace sparse_decode_detail {

// --- the ring fill (SparseKernelPlan::ring; NOTES.md) ---
// The register fills hold at most a round's raw bytes (registers), so a round's DRAM round trip
// is paid (or hidden under one round's decode) each round. Here the raw bytes go by cp.async
// into a ring of rounds in shared memory (traits.h kRingBytes: 3 rounds at d 576, 4 at d 512, 8
// of fp4's; no registers held per key in flight), issued kRounds - 1 rounds ahead, and are
// decoded from there into the kernel's ONE bf16 stage, whose rounds (keys 0-31, 32-63) have full
// and empty barriers of their own, so the compute warpgroups start a tile's S = Q K^T on its first
// round while the second is decoded and hand a round back as soon as both P V halves over its keys
// are done (kernel.cuh). Warp w owns keys 8 w .. 8 w + 7 of every round, in the ring and in the
// stage (the token fill's lane mapping: lane l key 8 w + l / 4, quarter q = l % 4), so the ring
// needs only warp-level synchronisation. A key's record: data at 0, scales at ring_scale_at, RoPE
// (bf16) at ring_rope_at, stride ring_key_bytes (64 mod 128: a quarter-warp's 2 keys x 4 quarters
// read 8 different 16 B bank groups).
template <int D, int kCodec>
constexpr int ring_scale_at() {
  return kCodec == static_cast<int>(Codec::kFP8_Model1) ? 448
         : kCodec == static_cast<int>(Codec::kFP4)      ? 256
                                                        : 512;
}
template <int D, int kCodec>
constexpr bool ring_has_rope() {
  return D == 576 || kCodec == static_cast<int>(Codec::kFP8_Model1);
}
template <int D, int kCodec>
constexpr int ring_rope_at() {
  return ring_scale_at<D, kCodec>() + 16;
}
template <int D, int kCodec>
constexpr int ring_key_bytes() {
  return ring_has_rope<D, kCodec>() ? 704 : kCodec == static_cast<int>(Codec::kFP4) ? 320 : 576;
}
template <class Traits, int kCodec>
constexpr int ring_rounds() {
  constexpr int n =
      Traits::kRingBytes / (Traits::kRingRoundKeys * ring_key_bytes<Traits::kHeadDimQK, kCodec>());
  return n > 8 ? 8 : n;
}

template <int kPending>
__device__ __forceinline__ void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr));
  return v;
}

// A key's scales into its ring record (lanes q = 0 / 0-1 of the key; nothing read for an
// invalid key), and where its bf16 RoPE part starts (the cache's base for an invalid key).
template <int D, int kCodec>
__device__ __forceinline__ void ring_issue_scales(const uint8_t* scale, bool ok, int q,
                                                  uint32_t rec) {
  constexpr int kAt = ring_scale_at<D, kCodec>();
  if constexpr (kCodec == static_cast<int>(Codec::kFP8_Model1)) {  // 8 B of e8m0
    if (q == 0) {
      asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(rec + kAt), "l"(scale),
                   "r"(ok ? 8 : 0)
                   : "memory");
    }
  } else if constexpr (kCodec == static_cast<int>(Codec::kFP4)) {  // 32 B of e4m3
    if (q < 2) cp_async16_u32(rec + kAt + 16 * q, scale + 16 * q, ok);
  } else {  // 16 B: fp8_v32's 4 floats, fp8_mx's 16 e8m0
    if (q == 0) cp_async16_u32(rec + kAt, scale, ok);
  }
}
__device__ __forceinline__ const uint8_t* ring_rope_src(const SparseCacheParams& c, int slot,
                                                        bool ok) {
  const uint8_t* rope = c.base;
  if (ok) {
    int block, offset;
    block_offset(c, slot, &block, &offset);
    rope += static_cast<int64_t>(block) * c.block_stride + c.rope_offset +
            static_cast<int64_t>(offset) * c.rope_stride;
  }
  return rope;
}

// A thread's part of one key's record into the ring (zeros for an invalid key: nothing read).
template <int D, int kCodec>
__device__ __forceinline__ void ring_issue_key(const SparseCacheParams& c, int slot, bool ok, int q,
                                               uint32_t rec) {
  constexpr int kChunks = stream_chunks<D, kCodec>();
  const TokenPtr t = token_ptr(c, ok ? slot : 0, q);
#pragma unroll
  for (int e = 0; e < kChunks; ++e) cp_async16_u32(rec + 64 * e + 16 * q, t.d + 4 * e, ok);
  ring_issue_scales<D, kCodec>(t.scale, ok, q, rec);
  if constexpr (ring_has_rope<D, kCodec>()) {  // chunks q and q + 4 of the 128 B RoPE part
    const uint8_t* rope = ring_rope_src(c, slot, ok);
    cp_async16_u32(rec + ring_rope_at<D, kCodec>() + 16 * q, rope + 16 * q, ok);
    cp_async16_u32(rec + ring_rope_at<D, kCodec>() + 16 * (q + 4), rope + 16 * (q + 4), ok);
  }
}

// A key's scales from its ring record (stream_scales' words; zeros past them).
template <int D, int kCodec>
__device__ __forceinline__ void ring_load_scales(uint32_t rec, uint32_t (&s)[8]) {
  constexpr int kAt = ring_scale_at<D, kCodec>();
#pragma unroll
  for (int i = 0; i < 8; ++i) s[i] = 0u;
  if constexpr (kCodec == static_cast<int>(Codec::kFP8_Model1)) {
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(s[0]), "=r"(s[1]) : "r"(rec + kAt));
  } else {
#pragma unroll
    for (int i = 0; i < (kCodec == static_cast<int>(Codec::kFP4) ? 2 : 1); ++i) {
      const uint4 v = lds128(rec + kAt + 16 * i);
      s[4 * i] = v.x, s[4 * i + 1] = v.y, s[4 * i + 2] = v.z, s[4 * i + 3] = v.w;
    }
  }
}

// A thread's quarter of one key from its ring record into stage row `row` (the streaming fill's
// decode; RoPE chunks q and q + 4 copied as they are); pieces kPieceStride bytes apart.
template <int D, int kCodec, int kPieceStride = 8192>
__device__ __forceinline__ void ring_decode_key(uint32_t rec, int q, const StageDst& dst, int row) {
  constexpr int kChunks = stream_chunks<D, kCodec>();
  uint32_t s[8];
  ring_load_scales<D, kCodec>(rec, s);
  uint4 raw[kChunks];
#pragma unroll
  for (int e = 0; e < kChunks; ++e) raw[e] = lds128(rec + 64 * e + 16 * q);
  if (stream_fast<D, kCodec>(s)) {
#pragma unroll
    for (int e = 0; e < kChunks; ++e) {
      stream_store_chunk_fast<D, kCodec, kPieceStride>(raw[e], s, e, q, dst, row);
    }
  } else {
#pragma unroll
    for (int e = 0; e < kChunks; ++e) {
      stream_store_chunk<D, kCodec, kPieceStride>(raw[e], s, e, q, dst, row);
    }
  }
  if constexpr (ring_has_rope<D, kCodec>()) {
    char* piece = dst.local + (D == 576 ? 8 : 7) * kPieceStride + row * 128;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int chunk = q + 4 * h;
      *reinterpret_cast<uint4*>(piece + ((chunk ^ (row & 7)) << 4)) =
          lds128(rec + ring_rope_at<D, kCodec>() + 16 * chunk);
    }
  }
}

// --- keys staged as fp16 (traits.h kFp16; NOTES.md) ---
// An e4m3 pair becomes an fp16 pair by one cvt (exact: e4m3 is a subset of fp16), then one f16x2
// multiply by the chunk's scale times 2^-e, e the key's exponent: each key is scaled by a power
// of two so its largest magnitude is below 2^15 (fp16's range is 65504), and the compute
// warpgroups multiply S's column by 2^e back in fp32 (kernel.cuh). The RoPE piece stays bf16 at
// d 576 (scaled by 2^-e there, exactly) and becomes fp16 at d 512 (fp8_model1: it is part of V).
__device__ __forceinline__ uint32_t cvt_f16x2_e4m3x2(uint32_t w16) {
  uint32_t d;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(d) : "h"(static_cast<uint16_t>(w16)));
  return d;
}
__device__ __forceinline__ uint32_t mul_f16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
// (lo, hi) as an f16x2 word (round to nearest).
__device__ __forceinline__ uint32_t f16x2_of(float lo, float hi) {
  uint32_t d;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}
// 2^e as a float, e in [-126, 127].
__device__ __forceinline__ float exp2_int(int e) { return __int_as_float((e + 127) << 23); }
// The largest byte of a word.
__device__ __forceinline__ uint32_t max_byte(uint32_t w) {
  const uint32_t m = __vmaxu4(w, w >> 16);
  return __vmaxu4(m, m >> 8) & 0xFFu;
}
// The exponent a key is stored with in fp16 (the key times 2^-e): X with every |value| < 2^X,
// from its scales (e4m3 magnitudes are below 2^9) and, for fp8_model1, from the largest bf16
// exponent field of its RoPE part (`rope_field`: already the whole key's); e = X - 15, clamped to
// [-60, 60] (a zero key's e is -60; scales of NaN or infinity give NaN or infinite keys, as the
// codec does).
template <int D, int kCodec>
__device__ __forceinline__ int f16_key_exp(const uint32_t (&s)[8], uint32_t rope_field) {
  int x;
  if constexpr (D ==
                576) {  // 4 float scales: a scale below 2^(E - 126) gives keys below 2^(E - 117)
    uint32_t e = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) e = max(e, (s[i] >> 23) & 0xFFu);
    x = static_cast<int>(e) - 117;
  } else {
    uint32_t b;  // e8m0: a scale 2^(b - 127) gives keys below 2^(b - 118)
    if constexpr (kCodec == static_cast<int>(Codec::kFP8_Model1)) {  // 7 scales: byte 7 unused
      b = max_byte(__vmaxu4(s[0], s[1] & 0x00FFFFFFu));
    } else {
      b = max_byte(__vmaxu4(__vmaxu4(s[0], s[1]), __vmaxu4(s[2], s[3])));
    }
    x = static_cast<int>(b) - 118;
    if constexpr (kCodec == static_cast<int>(Codec::kFP8_Model1)) {
      x = max(x, static_cast<int>(rope_field) - 126);  // bf16 below 2^(F - 126)
    }
  }
  return min(max(x - 15, -60), 60);
}
// The largest bf16 exponent field of 8 words (16 values).
__device__ __forceinline__ uint32_t bf16_max_field(const uint4 (&v)[2]) {
  uint32_t m = 0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    m = __vmaxu2(m, v[h].x & 0x7F807F80u);
    m = __vmaxu2(m, v[h].y & 0x7F807F80u);
    m = __vmaxu2(m, v[h].z & 0x7F807F80u);
    m = __vmaxu2(m, v[h].w & 0x7F807F80u);
  }
  return max(m & 0xFFFFu, m >> 16) >> 7;
}
// ring_decode_key with the keys staged as fp16, and the key's exponent into `key_exp[row]`.
template <int D, int kCodec, int kPieceStride>
__device__ __forceinline__ void ring_decode_key_f16(uint32_t rec, int q, const StageDst& dst,
                                                    int row, int8_t* key_exp) {
  static_assert(kCodec != static_cast<int>(Codec::kFP4), "SM90 has no e2m1 conversion");
  constexpr int kChunks = stream_chunks<D, kCodec>();
  uint32_t s[8];
  ring_load_scales<D, kCodec>(rec, s);
  uint4 rope[2];
  uint32_t rope_field = 0;
  if constexpr (ring_has_rope<D, kCodec>()) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
      rope[h] = lds128(rec + ring_rope_at<D, kCodec>() + 16 * (q + 4 * h));
    if constexpr (D != 576) {  // the whole key's RoPE: its 4 lanes' largest exponent field
      rope_field = bf16_max_field(rope);
      rope_field = max(rope_field, __shfl_xor_sync(0xffffffffu, rope_field, 1));
      rope_field = max(rope_field, __shfl_xor_sync(0xffffffffu, rope_field, 2));
    }
  }
  const int e = f16_key_exp<D, kCodec>(s, rope_field);
  const float down = exp2_int(-e);
  if (q == 0) key_exp[row] = static_cast<int8_t>(e);
  if constexpr (ring_has_rope<D, kCodec>()) {
    char* piece = dst.local + (D == 576 ? 8 : 7) * kPieceStride + row * 128;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int chunk = q + 4 * h;
      uint4 v = rope[h];
      if constexpr (D == 576) {  // bf16 times 2^-e (exact)
        const uint32_t m = static_cast<uint32_t>(127 - e) << 7 | static_cast<uint32_t>(127 - e)
                                                                     << 23;
        v.x = mul_bf16x2(v.x, m), v.y = mul_bf16x2(v.y, m);
        v.z = mul_bf16x2(v.z, m), v.w = mul_bf16x2(v.w, m);
      } else {  // bf16 -> fp16, times 2^-e
        auto f16 = [&](uint32_t w) {
          return f16x2_of(__uint_as_float(w << 16) * down, __uint_as_float(w & 0xFFFF0000u) * down);
        };
        v.x = f16(v.x), v.y = f16(v.y), v.z = f16(v.z), v.w = f16(v.w);
      }
      *reinterpret_cast<uint4*>(piece + ((chunk ^ (row & 7)) << 4)) = v;
    }
  }
  uint4 raw[kChunks];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) raw[c] = lds128(rec + 64 * c + 16 * q);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    float scale;
    if constexpr (D == 576) {
      scale = kvcodec::u2f(s[c >> 1]);  // fp8_v32: float scale c / 2
    } else if constexpr (kCodec == static_cast<int>(Codec::kFP8_Model1)) {
      scale = kvcodec::e8m0_to_float((s[c >> 2] >> (8 * (c & 3))) & 0xFFu);  // e8m0 byte c
    } else {  // fp8_mx: byte 2 c + q / 2
      scale = kvcodec::e8m0_to_float((s[c >> 1] >> (8 * (2 * (c & 1) + (q >> 1)))) & 0xFFu);
    }
    const float mf = scale * down;
    const uint32_t m = f16x2_of(mf, mf);
    const uint32_t w[4] = {raw[c].x, raw[c].y, raw[c].z, raw[c].w};
    uint32_t v[8];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[2 * k] = mul_f16x2(cvt_f16x2_e4m3x2(w[k] & 0xFFFFu), m);
      v[2 * k + 1] = mul_f16x2(cvt_f16x2_e4m3x2(w[k] >> 16), m);
    }
    store_16<false, kPieceStride>(dst, c, row, 2 * q, v);
  }
}

template <class Traits, int kCodec>
__device__ __forceinline__ void produce_by_ring(const SparseDecodeParams& p,
                                                typename Traits::SharedStorage& smem, int problem,
                                                int split) {
  static_assert(Traits::kRing && Traits::kStages == 1);
  constexpr int D = Traits::kHeadDimQK;
  constexpr int kRounds = ring_rounds<Traits, kCodec>();
  constexpr int kKeyBytes = ring_key_bytes<D, kCodec>();
  constexpr int kRoundBytes = Traits::kRingRoundKeys * kKeyBytes;
  static_assert(kRounds >= 2 && kRounds * kRoundBytes <= Traits::kRingBytes);
  const int warp = threadIdx.x / 32 - 8, lane = threadIdx.x % 32;
  const int q = lane & 3;
  const int row0 = 8 * warp + (lane >> 2);
  const Problem keys = problem_of<Traits::kDense>(p, problem);
  const int2 range = split_tiles<Traits::kDense>(p, keys, split);
  const int n_rounds = 2 * (range.y - range.x);
  // Round n: tile range.x + n / 2, keys 32 (n % 2) .. + 31; this thread's key and its slot.
  auto slot_at = [&](int n) {
    if (n >= n_rounds) return -1;
    const int k = range.x + (n >> 1);
    return slot_of<Traits::kDense>(p, tile_at(keys, k), keys, row0 + 32 * (n & 1));
  };
  const uint32_t ring = smem_u32(smem.ring) + row0 * kKeyBytes;  // + (n % kRounds) kRoundBytes
  // The round slots (Traits::kSlots): round n into slot n % 3, its (n / 3)-th use.
  constexpr bool kSlots = Traits::kSlots;
  int slot = 0, use = 0;
  StageDst dst;
  dst.local = reinterpret_cast<char*>(smem.k[0]);
  dst.peer = 0u;
  dst.peer_bar = 0u;
  // Whether this thread's key of round n was valid: bit (issued rounds - 1 - n) of `ok_bits`.
  uint32_t ok_bits = 0u;
  auto issue = [&](int n, int slot) {
    bool ok = false;
    if (n < n_rounds) {
      const SparseCacheParams& c = p.cache[tile_at(keys, range.x + (n >> 1)).cache];
      ok = slot >= 0 && slot < c.num_slots;
      ring_issue_key<D, kCodec>(c, slot, ok, q, ring + (n % kRounds) * kRoundBytes);
    }
    cp_async_commit();  // (an empty group past the end: the wait below counts groups)
    ok_bits = ok_bits << 1 | (ok ? 1u : 0u);
  };
  // Indices two rounds ahead of the round being issued (their loads are DRAM round trips too).
#pragma unroll 1
  for (int n = 0; n < kRounds - 1; ++n) issue(n, slot_at(n));
  int slot_a = slot_at(kRounds - 1), slot_b = slot_at(kRounds);
#pragma unroll 1
  for (int n = 0; n < n_rounds; ++n) {
    [[maybe_unused]] const int r = n & 1, kk = n >> 1;  // (the one stage's round, tile)
    __syncwarp();  // every lane's reads of round n - 1's records (the slot reissued now) are done
    issue(n + kRounds - 1, slot_a);
    slot_a = slot_b;
    slot_b = slot_at(n + kRounds + 1);
    cp_async_wait_group<kRounds - 1>();  // this thread's copies of round n have landed
    __syncwarp();                        // and every lane's
    const bool ok = (ok_bits >> (kRounds - 1)) & 1u;
    if constexpr (kSlots) {
      // The slot is free once both compute warpgroups are done with its previous round.
      cutlass::arch::ClusterBarrier::wait(&smem.empty[slot], (use & 1) ^ 1);
      StageDst in_slot = dst;
      in_slot.local += slot * Traits::kSlotBytes;
      if constexpr (Traits::kFp16) {
        ring_decode_key_f16<D, kCodec, Traits::kSlotPieceBytes>(
            ring + (n % kRounds) * kRoundBytes, q, in_slot, row0, smem.key_exp + 32 * slot);
      } else {
        ring_decode_key<D, kCodec, Traits::kSlotPieceBytes>(ring + (n % kRounds) * kRoundBytes, q,
                                                            in_slot, row0);
      }
      store_round_mask(ok, lane, &smem.valid[0][4 * slot + warp]);
      fence_async_smem();  // the generic stores before wgmma's reads
      __syncwarp();
      if (lane == 0) cutlass::arch::ClusterBarrier::arrive(&smem.full[slot]);
      if (++slot == 3) slot = 0, ++use;
    } else {
      // The round's rows of the stage are free once both compute warpgroups are done with them.
      cutlass::arch::ClusterBarrier::wait(&smem.empty[r], (kk & 1) ^ 1);
      ring_decode_key<D, kCodec>(ring + (n % kRounds) * kRoundBytes, q, dst, row0 + 32 * r);
      store_round_mask(ok, lane, &smem.valid[0][4 * r + warp]);
      fence_async_smem();  // the generic stores before wgmma's reads
      __syncwarp();
      if (lane == 0) cutlass::arch::ClusterBarrier::arrive(&smem.full[r]);
    }
  }
  asm volatile("cp.async.wait_all;" ::: "memory");  // no thread leaves with copies in flight
}

}  // namespace sparse_decode_detail
}  // namespace openmla::cuda::sm90
