// What fills the sparse decode kernel's shared memory (kernel.cuh): the producer warpgroup walks
// a split's tiles of 64 keys, looks each key up in the index list, loads its bytes and
// dequantises them into a stage's bf16 pieces (the layout wgmma reads), and prefetches the next
// tile's keys into L2 while it does. Invalid keys (index < 0 or >= num_slots, or past the
// token's length) are never read: their rows are zeros and their bit in the stage's mask is 0.
#pragma once

#include <cuda_bf16.h>

#include <climits>
#include <cstdint>

#include <cutlass/arch/barrier.h>

#include "cuda/common/kv_codec.cuh"
#include "cuda/sm90/attention/primitives.cuh"
#include "cuda/sm90/sparse_decode/e4m3_decode.cuh"
#include "cuda/sm90/sparse_decode/pair.cuh"
#include "cuda/sm90/sparse_decode/params.h"

namespace openmla::cuda::sm90 {
namespace sparse_decode_detail {

using attention::cp_async;  // (attention/primitives.cuh: the cp.async helpers)
using attention::cp_async16_u32;
using attention::cp_async_track;
using attention::fence_async_smem;
using kvcodec::Codec;

// Problem `q` of the grid (its z): a request's query tokens token0 .. token0 + s_pack - 1 and
// their common key list. Sparse mode: one token; the first n[0] entries of its main index list,
// then the first n[1] of its extra list. Dense mode: the request's s_q tokens; its first n[0]
// cache positions. Each list is cut into 64-key tiles (a tile never mixes the two caches).
struct Problem {
  int i, j0;
  int n[2];
  int tiles0, tiles;
};
__device__ __forceinline__ int counted(const SparseDecodeParams& p, int c, int i) {
  if (p.topk[c] == 0) return 0;
  if (p.lengths[c] == nullptr) return p.topk[c];
  const int n = p.lengths[c][i * p.lengths_stride[c]];
  return n < 0 ? 0 : (n > p.topk[c] ? p.topk[c] : n);
}
template <bool kDense>
__device__ __forceinline__ Problem problem_of(const SparseDecodeParams& p, int q) {
  Problem t;
  if constexpr (kDense) {  // no host check of the lengths: clamped to the block table
    t.i = q;
    t.j0 = 0;
    const int64_t n = p.seqlens[t.i * p.seqlens_stride];
    const int64_t capacity = static_cast<int64_t>(p.max_blocks) * p.cache[0].page_size;
    t.n[0] = static_cast<int>(n < 0 ? 0 : (n > capacity ? capacity : n));
    t.n[1] = 0;
  } else {
    t.i = q / p.s_q;
    t.j0 = q - t.i * p.s_q;
    t.n[0] = counted(p, 0, t.i);
    t.n[1] = counted(p, 1, t.i);
  }
  t.tiles0 = (t.n[0] + 63) / 64;
  t.tiles = t.tiles0 + (t.n[1] + 63) / 64;
  return t;
}
struct Tile {
  int cache, pos0, count;
};
__device__ __forceinline__ Tile tile_at(const Problem& t, int k) {
  const int c = k < t.tiles0 ? 0 : 1;
  const int pos0 = 64 * (c == 0 ? k : k - t.tiles0);
  const int n = c == 0 ? t.n[0] : t.n[1];  // no dynamic index: n stays in registers
  return {c, pos0, min(64, n - pos0)};
}
// The tiles [begin, end) split `split` walks: a fixed count per split (sparse mode, from the
// host), or the request's own tiles spread evenly over the splits (dense mode: lengths vary per
// request and are known on the device only).
template <bool kDense>
__device__ __forceinline__ int2 split_tiles(const SparseDecodeParams& p, const Problem& t,
                                            int split) {
  const int per_split = kDense ? (t.tiles + p.num_splits - 1) / p.num_splits : p.tiles_per_split;
  const int begin = split * per_split;
  return make_int2(begin, max(begin, min(begin + per_split, t.tiles)));
}

// Row f (0 .. 64 m_blocks - 1) of problem q: its query token (i, j) and head h (from q and f
// alone, so the compute warpgroups keep nothing else live for it).
struct Row {
  int token, i, j, h;
  bool ok;  // a real row (f < s_pack * h_q); padding rows are computed and never stored
};
template <bool kDense>
__device__ __forceinline__ Row row_of(const SparseDecodeParams& p, int q, int f) {
  Row r;
  if constexpr (!kDense) {  // one query token a problem: the row is the head
    r.ok = f < p.h_q;
    r.h = f;
    r.token = q;
    r.i = q / p.s_q;
    r.j = q - r.i * p.s_q;
    return r;
  }
  const int jj = f / p.h_q;
  r.ok = jj < p.s_pack;
  r.h = f - jj * p.h_q;
  r.token = q * p.s_pack + jj;
  r.i = r.token / p.s_q;
  r.j = r.token - r.i * p.s_q;
  return r;
}
// The keys of the list row (i, j) may see: causal dense decode's limit, INT_MAX otherwise.
template <bool kDense>
__device__ __forceinline__ int row_limit(const SparseDecodeParams& p, const Problem& t,
                                         const Row& r) {
  return kDense && p.causal ? t.n[0] - p.s_q + 1 + r.j : INT_MAX;
}

// The cache slot entry `pos` of the problem's list names; -1 (never read) past its count, or
// (dense mode) where the block table names a block outside the cache.
template <bool kDense>
__device__ __forceinline__ int slot_of(const SparseDecodeParams& p, const Tile& tile,
                                       const Problem& t, int key) {
  if (key >= tile.count) return -1;
  const int c = tile.cache;
  const int pos = tile.pos0 + key;
  if constexpr (kDense) {
    const SparseCacheParams& cache = p.cache[0];
    const int page = cache.page_shift >= 0 ? pos >> cache.page_shift : pos / cache.page_size;
    const int block = p.block_table[t.i * p.block_table_stride_b + page];
    if (block < 0 || block >= p.num_blocks) return -1;
    return block * cache.page_size + (pos - page * cache.page_size);
  }
  return p.indices[c][t.i * p.indices_stride_b[c] + t.j0 * p.indices_stride_s[c] +
                      static_cast<int64_t>(pos) * p.indices_stride_k[c]];
}

// A valid slot's block and offset in it.
__device__ __forceinline__ void block_offset(const SparseCacheParams& c, int slot, int* block,
                                             int* offset) {
  if (c.page_shift >= 0) {
    *block = slot >> c.page_shift;
    *offset = slot & (c.page_size - 1);
  } else {
    *block = slot / c.page_size;
    *offset = slot - *block * c.page_size;
  }
}

// A lane's raw bytes of one key (lane l owns dims 16l..16l+15, and 512+2l, 513+2l at d 576; the
// lane mapping of kv_codec.cuh): data words, the group scale's bits, the d 576 tail word.
struct RawKey {
  uint32_t w[8];
  uint32_t scale;
  uint32_t tail;
};

template <int D>
__device__ __forceinline__ void load_raw(const SparseCacheParams& c, int64_t block_base,
                                         int offset, int lane, RawKey& r) {
  const uint8_t* tok = c.base + block_base;
  const uint8_t* data = tok + c.data_offset + static_cast<int64_t>(offset) * c.data_stride;
  const uint8_t* scale = tok + c.scale_offset + static_cast<int64_t>(offset) * c.scale_stride;
  const uint8_t* rope = tok + c.rope_offset + static_cast<int64_t>(offset) * c.rope_stride;
  if (c.codec == static_cast<int>(Codec::kBF16)) {
    kvcodec::load_bytes<32>(data + 32 * lane, r.w);
    if constexpr (D == 576) {
      uint32_t t[1];
      kvcodec::load_bytes<4>(data + 1024 + 4 * lane, t);
      r.tail = t[0];
    }
    return;
  }
  if constexpr (D == 576) {  // fp8_v32
    uint32_t w[4], t[1];
    kvcodec::load_bytes<16>(data + 16 * lane, w);
    kvcodec::load_bytes<4>(rope + 4 * lane, t);
#pragma unroll
    for (int k = 0; k < 4; ++k) r.w[k] = w[k];
    r.scale = kvcodec::f2u(kvcodec::load_f32(scale + 4 * (lane >> 3)));
    r.tail = t[0];
  } else if (c.codec == static_cast<int>(Codec::kFP8_Model1)) {
    if (lane < 28) {
      uint32_t w[4];
      kvcodec::load_bytes<16>(data + 16 * lane, w);
#pragma unroll
      for (int k = 0; k < 4; ++k) r.w[k] = w[k];
      r.scale = kvcodec::load_u8(scale + (lane >> 2));
    } else {
      kvcodec::load_bytes<32>(rope + 32 * (lane - 28), r.w);
    }
  } else if (c.codec == static_cast<int>(Codec::kFP8_MX)) {
    uint32_t w[4];
    kvcodec::load_bytes<16>(data + 16 * lane, w);
#pragma unroll
    for (int k = 0; k < 4; ++k) r.w[k] = w[k];
    r.scale = kvcodec::load_u8(scale + (lane >> 1));
  } else {  // fp4
    uint32_t w[2];
    kvcodec::load_bytes<8>(data + 8 * lane, w);
    r.w[0] = w[0];
    r.w[1] = w[1];
    r.scale = kvcodec::load_u8(scale + lane);
  }
}

__device__ __forceinline__ uint32_t bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// OPENMLA_SPARSE_DEQUANT_CODEC=1 builds the codec's float path only (the A/B reference; the
// bit-level paths below give the same bf16 for every code but NaN, see NOTES.md).
#ifndef OPENMLA_SPARSE_DEQUANT_CODEC
#define OPENMLA_SPARSE_DEQUANT_CODEC 0
#endif

__device__ __forceinline__ uint32_t bf16x2_splat(float m) {
  const __nv_bfloat162 mm = __float2bfloat162_rn(m);
  return *reinterpret_cast<const uint32_t*>(&mm);
}
__device__ __forceinline__ void e4m3x16_to_bf16(const RawKey& r, float scale, uint32_t (&out)[8]) {
  const float m = scale * 0x1p120f;
  if (!OPENMLA_SPARSE_DEQUANT_CODEC && m < 0x1p127f) {
    const uint32_t w[4] = {r.w[0], r.w[1], r.w[2], r.w[3]};
    e4m3x16_to_bf16_fast(w, bf16x2_splat(m), out);
    return;
  }
  const uint32_t w[4] = {r.w[0], r.w[1], r.w[2], r.w[3]};
  float f[16];
  kvcodec::detail::decode_e4m3x16(w, scale, f);
#pragma unroll
  for (int k = 0; k < 8; ++k) out[k] = bf16x2(f[2 * k], f[2 * k + 1]);
}

// 16 e2m1 codes (two words, element 2i in the low nibble of byte i) times an e4m3 scale, as 8
// bf16 pairs: each code's bf16 bytes from two 8-entry byte tables (prmt, the magnitude bits as
// selectors), its sign moved in, then one bf16x2 multiply (e2m1 x e4m3 has at most 5
// significant bits: exact in bf16, as the codec's product is).
__device__ __forceinline__ void e2m1x16_to_bf16(const RawKey& r, float scale, uint32_t (&out)[8]) {
  if (OPENMLA_SPARSE_DEQUANT_CODEC || !(scale == scale)) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint32_t bits = r.w[k / 4] >> (8 * (k % 4));
      out[k] = bf16x2(kvcodec::host_mul(kvcodec::e2m1_to_float(bits & 0xFu), scale),
                      kvcodec::host_mul(kvcodec::e2m1_to_float((bits >> 4) & 0xFu), scale));
    }
    return;
  }
  const __nv_bfloat162 ss = __float2bfloat162_rn(scale);
  const uint32_t mul = *reinterpret_cast<const uint32_t*>(&ss);
  // bf16 of 0, 0.5, 1, 1.5, 2, 3, 4, 6: high bytes 00 3F 3F 3F 40 40 40 40, low 00 00 80 C0 00 40 80 C0
  constexpr uint32_t kHi0 = 0x3F3F3F00u, kHi1 = 0x40404040u;
  constexpr uint32_t kLo0 = 0xC0800000u, kLo1 = 0xC0804000u;
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const uint32_t w = r.w[k];
    const uint32_t mags = w & 0x77777777u;
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // nibbles 4h .. 4h + 3
      const uint32_t sel = mags >> (16 * h);
      const uint32_t hi = prmt(kHi0, kHi1, sel), lo = prmt(kLo0, kLo1, sel);
      const uint32_t sw = w >> (16 * h);  // this half's signs at bits 3, 7, 11, 15
      const uint32_t s01 = ((sw << 12) & 0x00008000u) | ((sw << 24) & 0x80000000u);
      const uint32_t s23 = ((sw << 4) & 0x00008000u) | ((sw << 16) & 0x80000000u);
      out[4 * k + 2 * h] = mul_bf16x2(prmt(lo, hi, 0x5140u) | s01, mul);
      out[4 * k + 2 * h + 1] = mul_bf16x2(prmt(lo, hi, 0x7362u) | s23, mul);
    }
  }
}

// The lane's 16 dims (and the d 576 tail pair) of a key as bf16.
template <int D>
__device__ __forceinline__ void decode_raw(int codec, int lane, const RawKey& r,
                                           uint32_t (&out)[8], uint32_t& tail) {
  tail = r.tail;
  if (codec == static_cast<int>(Codec::kBF16)) {
#pragma unroll
    for (int k = 0; k < 8; ++k) out[k] = r.w[k];
    return;
  }
  if constexpr (D == 576) {  // fp8_v32: float32 scale, bf16 tail
    e4m3x16_to_bf16(r, kvcodec::u2f(r.scale), out);
  } else if (codec == static_cast<int>(Codec::kFP8_Model1) && lane >= 28) {
#pragma unroll
    for (int k = 0; k < 8; ++k) out[k] = r.w[k];  // bf16 RoPE dims
  } else if (codec == static_cast<int>(Codec::kFP8_Model1) ||
             codec == static_cast<int>(Codec::kFP8_MX)) {
    e4m3x16_to_bf16(r, kvcodec::e8m0_to_float(r.scale), out);
  } else {  // fp4
    e2m1x16_to_bf16(r, kvcodec::e4m3_to_float(r.scale), out);
  }
}

// Row `row` of a stage: the lane's 16 dims are chunks 2 (l % 4), + 1 of piece l / 4 (128 B
// swizzle). Lanes of odd pieces store their second chunk first, so each store instruction covers
// all eight 16 B bank groups of a row (two stores a lane, no conflicts beyond the minimum).
template <int D>
__device__ __forceinline__ void store_row(char* stage, int row, int lane, const uint32_t (&v)[8],
                                          uint32_t tail) {
  const int piece = lane >> 2, c0 = (lane & 3) * 2;
  const bool odd = piece & 1;
  char* base = stage + piece * 8192 + row * 128;
  const uint4 lo = make_uint4(v[0], v[1], v[2], v[3]);
  const uint4 hi = make_uint4(v[4], v[5], v[6], v[7]);
  const int c_first = odd ? c0 + 1 : c0, c_second = odd ? c0 : c0 + 1;
  *reinterpret_cast<uint4*>(base + ((c_first ^ (row & 7)) << 4)) = odd ? hi : lo;
  *reinterpret_cast<uint4*>(base + ((c_second ^ (row & 7)) << 4)) = odd ? lo : hi;
  if constexpr (D == 576) {  // dims 512 + 2l, 513 + 2l: bytes 4l.. of piece 8's row
    *reinterpret_cast<uint32_t*>(stage + 8 * 8192 + row * 128 + (((lane >> 2) ^ (row & 7)) << 4) +
                                 (lane & 3) * 4) = tail;
  }
}

__device__ __forceinline__ void prefetch_l2(const void* p, int bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

// A 64-bit warp shuffle as volatile asm: it stays after the barrier wait before it (ptxas moves
// plain shuffles above the wait, holding every fill's addresses across it: spills at the
// seesaw producer's 40 registers).
__device__ __forceinline__ uint64_t shfl_after_wait(uint64_t v, int src_lane) {
  uint32_t lo = static_cast<uint32_t>(v), hi = static_cast<uint32_t>(v >> 32);
  asm volatile("shfl.sync.idx.b32 %0, %0, %2, 0x1f, 0xffffffff;\n\t"
               "shfl.sync.idx.b32 %1, %1, %2, 0x1f, 0xffffffff;"
               : "+r"(lo), "+r"(hi)
               : "r"(src_lane));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

// A bf16 key's row straight into the stage by cp.async (bf16 caches need no decoding, sparse
// prefill's kv among them): the same bytes and places as load_raw + store_row, with no registers
// held, so a whole tile's loads are in flight at once; an invalid key is a zero row. The row's
// address is formed once by the lane that owns the key; the stage row `16 w + key` has the
// 128 B swizzle `key & 7` (a warp's rows start on a multiple of 8), so in the key loop (unrolled by 8) the copies need no address math of their own beyond a lane's fixed offsets.
template <int D>
__device__ __forceinline__ void copy_key_async(const uint8_t* row, bool valid, char* stage_row,
                                               int swizzle, int lane) {
  const int piece = lane >> 2, c0 = (lane & 3) * 2;
  char* base = stage_row + piece * 8192;
  cp_async<16>(base + ((c0 ^ swizzle) << 4), row + 32 * lane, valid);
  cp_async<16>(base + (((c0 + 1) ^ swizzle) << 4), row + 32 * lane + 16, valid);
  if constexpr (D == 576) {  // dims 512 + 2l, 513 + 2l
    cp_async<4>(stage_row + 8 * 8192 + ((piece ^ swizzle) << 4) + (lane & 3) * 4,
                row + 1024 + 4 * lane, valid);
  }
}

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
  if (codec != static_cast<int>(Codec::kFP8_V32) &&
      codec != static_cast<int>(Codec::kFP8_Model1)) {
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

// --- the streaming token fill (OPENMLA_SPARSE_STREAM=1; NOTES.md "the streaming fill") ---
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
  return D == 576 ? 8
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
  if (OPENMLA_SPARSE_DEQUANT_CODEC) return false;
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

// --- the ring fill (OPENMLA_SPARSE_RING=1; NOTES.md "the ring fill") ---
// The register fills hold at most a round's raw bytes (registers), so a round's DRAM round trip
// is paid (or hidden under one round's decode) each round. Here the raw bytes go by cp.async
// into a ring of rounds in shared memory (traits.h kRingBytes: 3 rounds at d 576, 4 at d 512, 8
// of fp4's; no registers held per key in flight), issued kRounds - 1 rounds ahead, and are
// decoded from there into the kernel's ONE bf16 stage, whose rounds (keys 0-31, 32-63) have full and empty barriers of their own, so the
// compute warpgroups start a tile's S = Q K^T on its first round while the second is decoded
// and hand a round back as soon as both P V halves over its keys are done (kernel.cuh).
// Warp w owns keys 8 w .. 8 w + 7 of every round, in the ring and in the stage (the token fill's
// lane mapping: lane l key 8 w + l / 4, quarter q = l % 4), so the ring needs only warp-level
// synchronisation. A key's record: data at 0, scales at ring_scale_at, RoPE (bf16) at
// ring_rope_at, stride ring_key_bytes (64 mod 128: a quarter-warp's 2 keys x 4 quarters read 8
// different 16 B bank groups).
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
  constexpr int n = Traits::kRingBytes / (Traits::kRingRoundKeys * ring_key_bytes<Traits::kHeadDimQK, kCodec>());
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
      asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(rec + kAt),
                   "l"(scale), "r"(ok ? 8 : 0) : "memory");
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

// --- the round slots decoded by two producer warpgroups (traits.h kRing_ 4, OPENMLA_SPARSE_WIDE=1) ---
// Eight producer warps; lane l of warp w owns key 4 w + l / 8 of every round and, of it, the
// eighth q = l % 8: data bytes 128 e + 16 q for every e (the 8 lanes of a key read 128
// contiguous bytes of the ring an instruction: one key a quarter-warp, any record stride), 16 B of
// its RoPE part, and (lanes 0-1) its scales. The same ring records and rounds as
// produce_by_ring's; twice the warps decode them, each warp into its 4 rows of the slot.
// (First written for the one-stage ring in session 29, measured 0.85-0.97x there and removed in
// session 30: the one stage serialised the decode with the MMA, which the slots no longer do.)
template <int D, int kCodec>
constexpr int ring_data_bytes() {
  return kCodec == static_cast<int>(Codec::kFP8_Model1) ? 448
         : kCodec == static_cast<int>(Codec::kFP4)      ? 256
                                                        : 512;
}
// ring_issue_key with eighths, sharing its scale and RoPE pieces.
template <int D, int kCodec>
__device__ __forceinline__ void ring_issue_key8(const SparseCacheParams& c, int slot, bool ok,
                                                int q, uint32_t rec) {
  constexpr int kData = ring_data_bytes<D, kCodec>();
  const TokenPtr t = token_ptr(c, ok ? slot : 0, 0);
#pragma unroll
  for (int e = 0; e < (kData + 127) / 128; ++e) {
    if (128 * e + 16 * q < kData) cp_async16_u32(rec + 128 * e + 16 * q, t.d + 8 * e + q, ok);
  }
  ring_issue_scales<D, kCodec>(t.scale, ok, q, rec);
  if constexpr (ring_has_rope<D, kCodec>()) {  // chunk q of the 128 B RoPE part
    const uint8_t* rope = ring_rope_src(c, slot, ok);
    cp_async16_u32(rec + ring_rope_at<D, kCodec>() + 16 * q, rope + 16 * q, ok);
  }
}
// 16 bf16 dims (8 words) into chunks `chunk`, `chunk` + 1 of row `row` of piece `piece`, the
// second one first where `hi_first` (so a quarter-warp's stores cover all 8 bank groups).
// (`stage`: a shared-window address: generic pointers cost the 48-register producer 64-bit
// registers.)
template <int kPieceStride>
__device__ __forceinline__ void store_16_ordered(uint32_t stage, int piece, int row, int chunk,
                                                 const uint32_t (&v)[8], bool hi_first) {
  const uint32_t off = stage + piece * kPieceStride + row * 128;
  const uint32_t o0 = off + ((chunk ^ (row & 7)) << 4), o1 = off + (((chunk + 1) ^ (row & 7)) << 4);
  const uint4 lo = make_uint4(v[0], v[1], v[2], v[3]), hi = make_uint4(v[4], v[5], v[6], v[7]);
  if (hi_first) {
    st_local(o1, hi);
    st_local(o0, lo);
  } else {
    st_local(o0, lo);
    st_local(o1, hi);
  }
}
// A thread's chunk e of its eighth q of a key into row `row` of the slot. Chunk e holds dims
// 128 e + 16 q .. (fp4: 256 e + 32 q ..), i.e. the token fill's chunk 2 e + q / 4 of quarter
// q % 4 (store_token's places and scales).
template <int D, int kCodec, bool kFast, int kPieceStride>
__device__ __forceinline__ void ring_decode_chunk8(const uint4& raw, const uint32_t (&s)[8], int e,
                                                   int q, uint32_t stage, int row) {
  const int b = q >> 2, qq = q & 3;
  uint32_t v[8];
  if constexpr (kCodec == static_cast<int>(Codec::kFP4)) {
    // token-fill chunk E = 2 e + b: half h's e4m3 scale is byte 2 (qq & 1) + h of word
    // s[2 E + (qq >> 1)] = s[4 e + (2 b + (qq >> 1))]: a select, no dynamic index
    const int k = 2 * b + (qq >> 1);
    const uint32_t w = k == 0 ? s[4 * e] : k == 1 ? s[4 * e + 1] : k == 2 ? s[4 * e + 2] : s[4 * e + 3];
#pragma unroll
    for (int h0 = 0; h0 < 2; ++h0) {
      const int h = h0 ^ b;  // the 8 lanes of a key on 8 bank groups (with the order below)
      RawKey r;
      r.w[0] = h == 0 ? raw.x : raw.z;
      r.w[1] = h == 0 ? raw.y : raw.w;
      const uint32_t sb = (w >> (8 * (2 * (qq & 1) + h))) & 0xFFu;
      e2m1x16_to_bf16(r, kvcodec::e4m3_to_float(sb), v);
      store_16_ordered<kPieceStride>(stage, 2 * (2 * e + b) + (qq >> 1), row, 4 * (qq & 1) + 2 * h,
                                     v, (qq >> 1) & 1);
    }
  } else {
    uint32_t byte = 0;  // the e8m0 formats' scale byte
    float scale = 0.f;
    if constexpr (D == 576) {
      scale = kvcodec::u2f(s[e]);  // 128 dims a float scale
    } else if constexpr (kCodec == static_cast<int>(Codec::kFP8_Model1)) {
      byte = (s[e >> 1] >> (8 * (2 * (e & 1) + b))) & 0xFFu;  // 64 dims a scale
    } else {
      byte = (s[e] >> (8 * (2 * b + (qq >> 1)))) & 0xFFu;  // fp8_mx: 32 dims a scale
    }
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
    if constexpr (kFast) {
      const uint32_t mul = D == 576 ? bf16x2_splat(scale * 0x1p120f) : ((byte + 120u) << 7) * 0x10001u;
      e4m3x16_to_bf16_fast(w, mul, v);
    } else {
      RawKey r;
      r.w[0] = w[0], r.w[1] = w[1], r.w[2] = w[2], r.w[3] = w[3];
      e4m3x16_to_bf16(r, D == 576 ? scale : kvcodec::e8m0_to_float(byte), v);
    }
    store_16_ordered<kPieceStride>(stage, 2 * e + b, row, 2 * qq, v, b);  // b: the odd piece's lanes
  }
}
template <int D, int kCodec, int kPieceStride>
__device__ __forceinline__ void ring_decode_key8(uint32_t rec, int q, uint32_t stage, int row) {
  // (opaque to the compiler: its stores' addresses are formed here each round rather than
  // hoisted out of the round loop into registers the 48-register producer lacks)
  asm volatile("" : "+r"(stage), "+r"(row));
  constexpr int kData = ring_data_bytes<D, kCodec>();
  constexpr int kChunks = (kData + 127) / 128;
  uint32_t s[8];
  ring_load_scales<D, kCodec>(rec, s);
  uint4 raw[kChunks];
#pragma unroll
  for (int e = 0; e < kChunks; ++e) {
    raw[e] = 128 * e + 16 * q < kData ? lds128(rec + 128 * e + 16 * q) : make_uint4(0u, 0u, 0u, 0u);
  }
  const bool fast = stream_fast<D, kCodec>(s);
#pragma unroll
  for (int e = 0; e < kChunks; ++e) {
    if (128 * e + 16 * q >= kData) continue;  // (fp8_model1's last 64 B: its RoPE piece)
    if (fast) {
      ring_decode_chunk8<D, kCodec, true, kPieceStride>(raw[e], s, e, q, stage, row);
    } else {
      ring_decode_chunk8<D, kCodec, false, kPieceStride>(raw[e], s, e, q, stage, row);
    }
  }
  if constexpr (ring_has_rope<D, kCodec>()) {
    const uint32_t piece = stage + (D == 576 ? 8 : 7) * kPieceStride + row * 128;
    st_local(piece + ((q ^ (row & 7)) << 4), lds128(rec + ring_rope_at<D, kCodec>() + 16 * q));
  }
}
// A round's key mask of a wide warp (4 keys: lanes 0, 8, 16, 24) into bits 0 .. 3 of `byte`
// (the other warp of the pair writes the word's other byte).
__device__ __forceinline__ void store_round_mask8(bool ok, int lane, uint8_t* byte) {
  uint32_t mask = __ballot_sync(0xffffffffu, ok) & 0x01010101u;
  mask = (mask | (mask >> 7)) & 0x00030003u;
  mask = (mask | (mask >> 14)) & 0xFu;
  if (lane == 0) *byte = static_cast<uint8_t>(mask);
}

// --- keys staged as fp16 (traits.h kFp16, OPENMLA_SPARSE_FP16=1; NOTES.md lever 2) ---
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
  if constexpr (D == 576) {  // 4 float scales: a scale below 2^(E - 126) gives keys below 2^(E - 117)
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
    for (int h = 0; h < 2; ++h) rope[h] = lds128(rec + ring_rope_at<D, kCodec>() + 16 * (q + 4 * h));
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
        const uint32_t m = static_cast<uint32_t>(127 - e) << 7 | static_cast<uint32_t>(127 - e) << 23;
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
  // Two decoding warpgroups (kRing_ 4): 8 warps, 4 keys a warp and a round, 8 lanes a key.
  constexpr bool kWide = Traits::kProducerWarpgroups == 2;
  const int q = kWide ? lane & 7 : lane & 3;
  const int row0 = kWide ? 4 * warp + (lane >> 3) : 8 * warp + (lane >> 2);
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
      if constexpr (kWide) {
        ring_issue_key8<D, kCodec>(c, slot, ok, q, ring + (n % kRounds) * kRoundBytes);
      } else {
        ring_issue_key<D, kCodec>(c, slot, ok, q, ring + (n % kRounds) * kRoundBytes);
      }
    }
    cp_async_commit();  // (an empty group past the end: the wait below counts groups)
    ok_bits = ok_bits << 1 | (ok ? 1u : 0u);
  };
  // Indices two rounds ahead of the round being issued (their loads are DRAM round trips too).
#pragma unroll 1
  for (int n = 0; n < kRounds - 1; ++n) issue(n, slot_at(n));
  // (two producer warpgroups: indices one round ahead of their issue, not two: the 48-register
  // producer has no register for the second)
  int slot_a = slot_at(kRounds - 1), slot_b = kWide ? 0 : slot_at(kRounds);
#pragma unroll 1
  for (int n = 0; n < n_rounds; ++n) {
    [[maybe_unused]] const int r = n & 1, kk = n >> 1;  // (the one stage's round, tile)
    __syncwarp();  // every lane's reads of round n - 1's records (the slot reissued now) are done
    issue(n + kRounds - 1, slot_a);
    if constexpr (kWide) {
      slot_a = slot_at(n + kRounds);
    } else {
      slot_a = slot_b;
      slot_b = slot_at(n + kRounds + 1);
    }
    cp_async_wait_group<kRounds - 1>();  // this thread's copies of round n have landed
    __syncwarp();                         // and every lane's
    const bool ok = (ok_bits >> (kRounds - 1)) & 1u;
    if constexpr (kSlots) {
      if constexpr (kWide) slot = n % 3, use = n / 3;  // (formed afresh: registers, not state)
      // The slot is free once both compute warpgroups are done with its previous round.
      cutlass::arch::ClusterBarrier::wait(&smem.empty[slot], (use & 1) ^ 1);
      StageDst in_slot = dst;
      in_slot.local += slot * Traits::kSlotBytes;
      if constexpr (kWide) {
        ring_decode_key8<D, kCodec, Traits::kSlotPieceBytes>(
            ring + (n % kRounds) * kRoundBytes, q, smem_u32(smem.k[0]) + slot * Traits::kSlotBytes,
            row0);
        store_round_mask8(
            ok, lane, reinterpret_cast<uint8_t*>(&smem.valid[0][4 * slot + (warp >> 1)]) + (warp & 1));
      } else {
        if constexpr (Traits::kFp16) {
          ring_decode_key_f16<D, kCodec, Traits::kSlotPieceBytes>(
              ring + (n % kRounds) * kRoundBytes, q, in_slot, row0, smem.key_exp + 32 * slot);
        } else {
          ring_decode_key<D, kCodec, Traits::kSlotPieceBytes>(ring + (n % kRounds) * kRoundBytes,
                                                              q, in_slot, row0);
        }
        store_round_mask(ok, lane, &smem.valid[0][4 * slot + warp]);
      }
      fence_async_smem();  // the generic stores before wgmma's reads
      __syncwarp();
      if (lane == 0) cutlass::arch::ClusterBarrier::arrive(&smem.full[slot]);
      if constexpr (!kWide) {
        if (++slot == 3) slot = 0, ++use;
      }
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

// The round slots in a CTA pair (traits.h kPairSlots; OPENMLA_SPARSE_PAIRSLOTS=1): the protocol
// model-checked by tests/models/ring_sync_model.py --pair (sparse_decode/NOTES.md). CTA rank r's producer
// walks every round n of the split: its own rounds (n % 2 = r) it copies into its raw ring (one
// own round ahead), decodes into its slot n % 3 and bulk-copies that slot (its 4 KB pieces and its
// 4 mask words) into the peer's slot n % 3, completing the bytes on the peer's full barrier, and
// arrives on its own full barrier once the copy has read its source (at d 576 WG0 writes P over
// the slot's RoPE piece after the round's QK^T); for the peer's rounds each warp arrives on its
// own full barrier expecting a quarter of the copy's bytes. Every round first waits for the slot's
// empty barrier: both CTAs' compute warps (16) release it.
template <class Traits, int kCodec>
__device__ __forceinline__ void produce_by_ring_pair(const SparseDecodeParams& p,
                                                     typename Traits::SharedStorage& smem,
                                                     int problem, int split) {
  static_assert(Traits::kPairSlots);
  constexpr int D = Traits::kHeadDimQK;
  constexpr int kRounds = ring_rounds<Traits, kCodec>();
  constexpr int kKeyBytes = ring_key_bytes<D, kCodec>();
  constexpr int kRoundBytes = Traits::kRingRoundKeys * kKeyBytes;
  static_assert(kRounds >= 2 && kRounds * kRoundBytes <= Traits::kRingBytes);
  constexpr uint32_t kCopyBytes = Traits::kNumPieces * Traits::kSlotPieceBytes + 16;
  const int warp = threadIdx.x / 32 - 8, lane = threadIdx.x % 32;
  const int q = lane & 3;
  const int row0 = 8 * warp + (lane >> 2);
  const int rank = static_cast<int>(cluster_rank());
  const Problem keys = problem_of<Traits::kDense>(p, problem);
  const int2 range = split_tiles<Traits::kDense>(p, keys, split);
  const int n_rounds = 2 * (range.y - range.x);
  const int n_own = range.y - range.x;  // own round m is round 2 m + rank: keys 32 rank .. of tile m
  auto slot_at = [&](int m) {
    if (m >= n_own) return -1;
    return slot_of<Traits::kDense>(p, tile_at(keys, range.x + m), keys, row0 + 32 * rank);
  };
  const uint32_t ring = smem_u32(smem.ring) + row0 * kKeyBytes;  // + (m % kRounds) kRoundBytes
  uint32_t ok_bits = 0u;
  auto issue = [&](int m, int slot) {
    bool ok = false;
    if (m < n_own) {
      const SparseCacheParams& c = p.cache[tile_at(keys, range.x + m).cache];
      ok = slot >= 0 && slot < c.num_slots;
      ring_issue_key<D, kCodec>(c, slot, ok, q, ring + (m % kRounds) * kRoundBytes);
    }
    cp_async_commit();
    ok_bits = ok_bits << 1 | (ok ? 1u : 0u);
  };
#pragma unroll 1
  for (int m = 0; m < kRounds - 1; ++m) issue(m, slot_at(m));
  int slot_a = slot_at(kRounds - 1);
  StageDst dst;
  dst.local = reinterpret_cast<char*>(smem.k[0]);
  dst.peer = 0u;
  dst.peer_bar = 0u;
#pragma unroll 1
  for (int n = 0; n < n_rounds; ++n) {
    const int s = n % 3, use = n / 3;
    cutlass::arch::ClusterBarrier::wait(&smem.empty[s], (use & 1) ^ 1);  // both CTAs released it
    if ((n & 1) != rank) {  // the peer's round: its copy completes this barrier's bytes
      __syncwarp();
      if (lane == 0) {
        cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&smem.full[s],
                                                                       kCopyBytes / 4);
      }
      continue;
    }
    const int m = n >> 1;
    __syncwarp();  // every lane's reads of own round m - 1's records (the record reissued now)
    issue(m + kRounds - 1, slot_a);
    slot_a = slot_at(m + kRounds);
    cp_async_wait_group<kRounds - 1>();  // this thread's copies of own round m have landed
    __syncwarp();                         // and every lane's
    const bool ok = (ok_bits >> (kRounds - 1)) & 1u;
    StageDst in_slot = dst;
    in_slot.local += s * Traits::kSlotBytes;
    ring_decode_key<D, kCodec, Traits::kSlotPieceBytes>(ring + (m % kRounds) * kRoundBytes, q,
                                                        in_slot, row0);
    store_round_mask(ok, lane, &smem.valid[0][4 * s + warp]);
    fence_async_smem();  // the generic stores before wgmma's and the bulk copy's reads
    __syncwarp();
    // Each warp sends its own rows as soon as they are stored: rows 8 w .. 8 w + 7 of every
    // piece (1 KB each, contiguous) by bulk copies and its mask word by st.async, a quarter of
    // the bytes the peer's full barrier expects (no named barrier across the four warps).
    if (lane == 0) {
      const uint32_t peer = rank ^ 1;
      const uint32_t peer_bar = peer_addr(smem_u32(&smem.full[s]), peer);
      const uint32_t src = smem_u32(in_slot.local) + warp * 8 * 128;
#pragma unroll 1
      for (int e = 0; e < Traits::kNumPieces; ++e) {
        const uint32_t rows = src + e * Traits::kSlotPieceBytes;
        bulk_to_peer(peer_addr(rows, peer), rows, 8 * 128, peer_bar);
      }
      const uint32_t* mask_word = &smem.valid[0][4 * s + warp];
      st_async_peer(peer_addr(smem_u32(mask_word), peer), *mask_word, peer_bar);
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
      // At d 576 WG0 writes P over the slot's RoPE piece once the round's QK^T is done: the
      // warp hands its rows to the consumers only once its copies have read them. At d 512
      // nothing writes the slot before its next fill, which waits for both CTAs' consumers,
      // hence for the copies.
      if constexpr (Traits::kPInKTile) {
        asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
      }
      cutlass::arch::ClusterBarrier::arrive(&smem.full[s]);
    }
  }
  asm volatile("cp.async.wait_all;" ::: "memory");  // no thread leaves with copies in flight
}

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
          c.base + (valid ? block_base + c.data_offset + static_cast<int64_t>(offset) * c.data_stride
                          : 0);
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
          for (int e = 0; e < Traits::kNumPieces; ++e) cp_async16_u32(r + e * 8192, row + e * 128, ok);
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
      const uint32_t rows =
          smem_u32(reinterpret_cast<char*>(smem.k[s])) + (16 * warp + gi) * 128;
      const uint32_t mask = (ballot >> (16 * s)) & 0xFFFFu;
      // (not unrolled: the producer's 40 registers hold one key's addresses at a time)
#pragma unroll 1
      for (int j = 0; j < 4; ++j) {
        const int key = gi + 4 * j;
        const bool ok = (mask >> key) & 1u;
        const uint8_t* row = reinterpret_cast<const uint8_t*>(
                                 shfl_after_wait(reinterpret_cast<uint64_t>(my_row), 16 * s + key)) +
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
