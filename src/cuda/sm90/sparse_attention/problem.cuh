// What a CTA of the sparse attention kernels works on: its problem (one query token and its index
// lists, or in dense mode one request's query tokens and its first L cache positions), the
// problem's 64-key tiles and the split of them the CTA walks, the query row (token, head) of each
// of its 64 rows, and the cache slot each key names. Shared by every role of kernel.cuh.
#pragma once

#include <climits>
#include <cstdint>

#include "cuda/sm90/sparse_attention/params.h"

namespace openmla::cuda::sm90 {
namespace sparse {

// Problem `q` of the grid (its z): query tokens token0 .. token0 + s_pack - 1 of request i and
// their common key list. Sparse mode: one token; the first n[0] entries of its main index list,
// then the first n[1] of its extra list. Dense mode: the request's s_q tokens; its first n[0]
// cache positions. Each list is cut into 64-key tiles (a tile never mixes the two caches).
struct Problem {
  int i, j0;
  int n[2];
  int tiles0, tiles;
};

__device__ __forceinline__ int counted(const SparseAttentionParams& p, int c, int i) {
  if (p.topk[c] == 0) return 0;
  if (p.lengths[c] == nullptr) return p.topk[c];
  const int n = p.lengths[c][i * p.lengths_stride[c]];
  return n < 0 ? 0 : (n > p.topk[c] ? p.topk[c] : n);
}

template <bool kDense>
__device__ __forceinline__ Problem problem_of(const SparseAttentionParams& p, int q) {
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
__device__ __forceinline__ int2 split_tiles(const SparseAttentionParams& p, const Problem& t,
                                            int split) {
  const int per_split = kDense ? (t.tiles + p.num_splits - 1) / p.num_splits : p.tiles_per_split;
  const int begin = split * per_split;
  return make_int2(begin, max(begin, min(begin + per_split, t.tiles)));
}

// Row f (0 .. 64 m_blocks - 1) of problem q: its query token (i, j) and head h.
struct Row {
  int token, i, j, h;
  bool ok;  // a real row (f < s_pack * h_q); padding rows are computed and never stored
};
template <bool kDense>
__device__ __forceinline__ Row row_of(const SparseAttentionParams& p, int q, int f) {
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
// The keys row (i, j) may see: causal dense decode's limit, INT_MAX otherwise.
template <bool kDense>
__device__ __forceinline__ int row_limit(const SparseAttentionParams& p, const Problem& t,
                                         const Row& r) {
  return kDense && p.causal ? t.n[0] - p.s_q + 1 + r.j : INT_MAX;
}

// The cache slot key `key` of `tile` names; -1 (never read) past the tile's count, or (dense
// mode) where the block table names a block outside the cache. (Sparse mode: the index as given;
// the fill checks it against the cache's slots.)
template <bool kDense>
__device__ __forceinline__ int slot_of(const SparseAttentionParams& p, const Tile& tile,
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

// A valid slot's token: the byte offset of its block, and its place in the block.
struct TokenAt {
  int64_t block_base;
  int offset;
};
__device__ __forceinline__ TokenAt token_at(const SparseCacheParams& c, int slot) {
  int block, offset;
  if (c.page_shift >= 0) {
    block = slot >> c.page_shift;
    offset = slot & (c.page_size - 1);
  } else {
    block = slot / c.page_size;
    offset = slot - block * c.page_size;
  }
  return {static_cast<int64_t>(block) * c.block_stride, offset};
}
__device__ __forceinline__ bool slot_ok(const SparseCacheParams& c, int slot) {
  return slot >= 0 && slot < c.num_slots;
}

}  // namespace sparse
}  // namespace openmla::cuda::sm90
