// What every fill of the sparse decode kernel's shared memory shares (fills.cuh lists the fills):
// a problem's key list and its tiles, a key's slot and bytes, the decoding of its codes into bf16
// and the stores into a stage's pieces (the layout wgmma reads). Invalid keys (index < 0 or >=
// num_slots, or past the token's length) are never read: their rows are zeros and their bit in
// the stage's mask is 0.
#pragma once

#include <cuda_bf16.h>
#include <cutlass/arch/barrier.h>

#include <climits>
#include <cstdint>

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
__device__ __forceinline__ void load_raw(const SparseCacheParams& c, int64_t block_base, int offset,
                                         int lane, RawKey& r) {
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

__device__ __forceinline__ uint32_t bf16x2_splat(float m) {
  const __nv_bfloat162 mm = __float2bfloat162_rn(m);
  return *reinterpret_cast<const uint32_t*>(&mm);
}
__device__ __forceinline__ void e4m3x16_to_bf16(const RawKey& r, float scale, uint32_t (&out)[8]) {
  const float m = scale * 0x1p120f;
  if (m < 0x1p127f) {  // (the bit-level path gives the codec's bf16 for every code but NaN)
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
  if (!(scale == scale)) {
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
  // bf16 of 0, 0.5, 1, 1.5, 2, 3, 4, 6: high bytes 00 3F 3F 3F 40 40 40 40, low 00 00 80 C0 00 40
  // 80 C0
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
__device__ __forceinline__ void decode_raw(int codec, int lane, const RawKey& r, uint32_t (&out)[8],
                                           uint32_t& tail) {
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
  asm volatile(
      "shfl.sync.idx.b32 %0, %0, %2, 0x1f, 0xffffffff;\n\t"
      "shfl.sync.idx.b32 %1, %1, %2, 0x1f, 0xffffffff;"
      : "+r"(lo), "+r"(hi)
      : "r"(src_lane));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

// A bf16 key's row straight into the stage by cp.async (bf16 caches need no decoding, sparse
// prefill's kv among them): the same bytes and places as load_raw + store_row, with no registers
// held, so a whole tile's loads are in flight at once; an invalid key is a zero row. The row's
// address is formed once by the lane that owns the key; the stage row `16 w + key` has the
// 128 B swizzle `key & 7` (a warp's rows start on a multiple of 8), so in the key loop (unrolled by
// 8) the copies need no address math of their own beyond a lane's fixed offsets.
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

}  // namespace sparse_decode_detail
}  // namespace openmla::cuda::sm90
