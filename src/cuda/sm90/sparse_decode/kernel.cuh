// SM90 sparse MLA decode: a gathering, dequantising producer warpgroup and two wgmma warpgroups.
// Design and numbers: NOTES.md; compile-time choices: traits.h; the producer: producer.cuh.
//
// Grid (m_blocks, num_splits, problems), 384 threads, one CTA per SM. A problem is one query
// token and its index list (sparse mode), or one request's s_q tokens and its first L cache
// positions through the block table (dense mode, dense decode over a KVCache: params.h). CTA
// (m, s, q) serves rows [64 m, 64 m + 64) of problem q (heads; in dense mode token-major
// (j, h) pairs) over split s of its key list. Per tile k (stage k % 2):
//   WG2: gathers and dequantises the tile's 64 keys into the stage (producer.cuh: the token fill
//        of quantised caches, bf16 keys by cp.async, or the warp-per-key fill)
//   WG0: S = Q K^T (the PV of tile k-1 completes under it), keys the mask drops -> -inf, the
//        running max, P = exp(S - m) to registers and to shared memory with O's row factors;
//        O_L *= factor; O_L += P V_L (issued, completed under the next QK^T)
//   WG1: P and the factors from shared memory; O_R *= factor; O_R += P V_R
// A stage goes back to the producer once both warpgroups' wgmmas on it are done. With a CTA pair
// (h_q 128 and other even m-block counts over quantised caches: pair.cuh) each CTA's producer
// decodes half of every tile into both CTAs' stages. bf16 tiles (bf16 caches, sparse prefill's
// kv) may run the seesaw order instead (traits.h kSeesaw; consume below): each compute
// warpgroup computes S for alternate tiles and both tiles' P V for its half of d_v (staggered
// maxima with kStagger). A split that is the problem's only one writes out (bf16, attention sink
// applied) and lse; otherwise its normalised fp32 partial and lse go to the workspace for the
// combine kernel (launch.cu).
#pragma once

#include <cuda.h>

#include <cstdint>

#include <cute/tensor.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "cuda/common/smem_opt_in.h"
#include "cuda/sm90/attention/fragments.cuh"
#include "cuda/sm90/attention/mma.cuh"
#include "cuda/sm90/attention/primitives.cuh"
#include "cuda/sm90/attention/softmax.cuh"
#include "cuda/sm90/sparse_decode/params.h"
#include "cuda/sm90/sparse_decode/producer.cuh"
#include "cuda/sm90/sparse_decode/traits.h"

namespace openmla::cuda::sm90 {
namespace sparse_decode_detail {

using namespace attention;  // the shared softmax, MMA and barrier helpers

enum : uint32_t {
  kBarP0 = 1,       // WG0 -> WG1: P and the factors of a stage-0 tile (256)
  kBarP1 = 2,       // the same for stage 1 (256)
  kBarQ = 3,        // inside WG0: Q in shared memory (128)
  kBarEpi = 4,      // row sums published (256); 5: the producer's kBarFill (producer.cuh)
  kBarMax = 6,      // the seesaw order: both warpgroups' tile row maxima (and row sums) (256)
  kBarMaxFinal = 7, // the stagger (kStagger): WG1 -> WG0, the round's final row max (256)
};

// The problem's Q rows [64 m, 64 m + 64) into shared memory (padding rows are zeros), by WG0.
template <class Traits>
__device__ __forceinline__ void load_q(const SparseDecodeParams& p,
                                       typename Traits::SharedStorage& smem, int problem,
                                       int m_block, int t) {
  constexpr int kChunksPerRow = Traits::kHeadDimQK / 8;
  constexpr int kChunks = Traits::kBlockM * kChunksPerRow;
  constexpr int kPerThread = kChunks / 128;
  constexpr int kBatch = kPerThread % 12 == 0 ? 12 : 8;
  static_assert(kChunks % 128 == 0 && kPerThread % kBatch == 0);
  const char* q = static_cast<const char*>(p.q);
  char* base = reinterpret_cast<char*>(smem.q);
#pragma unroll 1
  for (int b = 0; b < kPerThread; b += kBatch) {
    uint4 v[kBatch];
#pragma unroll
    for (int e = 0; e < kBatch; ++e) {
      const int idx = (b + e) * 128 + t;
      const int row = idx / kChunksPerRow, ch = idx % kChunksPerRow;
      const Row r = row_of<Traits::kDense>(p, problem, m_block * Traits::kBlockM + row);
      v[e] = make_uint4(0u, 0u, 0u, 0u);
      if (r.ok) {
        const int64_t off = r.i * p.q_stride_b + r.j * p.q_stride_s + r.h * p.q_stride_h + ch * 8;
        v[e] = __ldg(reinterpret_cast<const uint4*>(q + off * 2));
      }
    }
#pragma unroll
    for (int e = 0; e < kBatch; ++e) {
      const int idx = (b + e) * 128 + t;
      const int row = idx / kChunksPerRow, ch = idx % kChunksPerRow;
      *reinterpret_cast<uint4*>(base + (ch / 8) * Traits::kPieceBytes +
                                swizzled_offset(row, ch % 8)) = v[e];
    }
  }
}

// kFp16 (traits.h): Q's rows in place as fp16, row r times 2^-e_r (e_r from the row's largest
// bf16 exponent field: every |value| then below 2^15), d 576's RoPE piece kept bf16 (times 2^-e_r,
// exactly); e_r into smem.row_sum[r] (as int bits: free until the epilogue's row sums). By WG0,
// two threads a row, after load_q's stores are visible to all of WG0.
template <class Traits>
__device__ __forceinline__ void q_rows_to_fp16(typename Traits::SharedStorage& smem, int t) {
  constexpr int kPieces = Traits::kNumPieces, kHalf = (kPieces + 1) / 2;
  const int row = t >> 1, half = t & 1;
  char* base = reinterpret_cast<char*>(smem.q) + row * 128;
  uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const int pc = half * kHalf + i;
    if (pc >= kPieces) break;
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      const uint4 v = *reinterpret_cast<const uint4*>(base + pc * Traits::kPieceBytes + 16 * c);
      m = __vmaxu2(m, v.x & 0x7F807F80u);
      m = __vmaxu2(m, v.y & 0x7F807F80u);
      m = __vmaxu2(m, v.z & 0x7F807F80u);
      m = __vmaxu2(m, v.w & 0x7F807F80u);
    }
  }
  uint32_t f = max(m & 0xFFFFu, m >> 16) >> 7;
  f = max(f, __shfl_xor_sync(0xffffffffu, f, 1));
  const int e = min(max(static_cast<int>(f) - 126 - 15, -60), 60);
  const float down = exp2_int(-e);
  const uint32_t down_bf16 = static_cast<uint32_t>(127 - e) << 7 | static_cast<uint32_t>(127 - e) << 23;
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const int pc = half * kHalf + i;
    if (pc >= kPieces) break;
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      uint4* at = reinterpret_cast<uint4*>(base + pc * Traits::kPieceBytes + 16 * c);
      uint4 v = *at;
      if (Traits::kRopeBf16 && pc == kPieces - 1) {
        v.x = mul_bf16x2(v.x, down_bf16), v.y = mul_bf16x2(v.y, down_bf16);
        v.z = mul_bf16x2(v.z, down_bf16), v.w = mul_bf16x2(v.w, down_bf16);
      } else {
        auto f16 = [&](uint32_t w) {
          return f16x2_of(__uint_as_float(w << 16) * down, __uint_as_float(w & 0xFFFF0000u) * down);
        };
        v.x = f16(v.x), v.y = f16(v.y), v.z = f16(v.z), v.w = f16(v.w);
      }
      *at = v;
    }
  }
  if (half == 0) smem.row_sum[row] = __int_as_float(e);
}

// A stage's full barrier; with a CTA pair the peer's producer arrives on it too (pair.cuh).
__device__ __forceinline__ void wait_full(uint64_t* full, int phase, bool pair) {
  cutlass::arch::ClusterBarrier::wait(full, phase);
  if (pair) fence_async_smem();  // the peer's st.async rows (generic proxy) before wgmma reads
}
// A compute warp is done with a stage: lane 0 arrives on its empty barrier (and the peer's: the
// peer's producer writes into this CTA's stage too).
__device__ __forceinline__ void release_stage(uint64_t* empty, int lane, bool pair) {
  if (lane == 0) {
    cutlass::arch::ClusterBarrier::arrive(empty);
    if (pair) arrive_peer(peer_addr(smem_u32(empty), cluster_rank() ^ 1u));
  }
}

template <class Traits>
__device__ __forceinline__ void* p_buffer(typename Traits::SharedStorage& smem, int stage) {
  if constexpr (Traits::kPInKTile) {
    return smem.k[stage] + 8 * Traits::kPieceElems;  // the tile's RoPE piece
  } else {
    return smem.p[stage];
  }
}

// A stage's key mask: bit j = key j is valid (word b holds keys 8 b .. 8 b + 7 in its low byte).
__device__ __forceinline__ uint64_t stage_valid(const uint32_t (&words)[8]) {
  const uint4 v0 = reinterpret_cast<const uint4*>(words)[0];
  const uint4 v1 = reinterpret_cast<const uint4*>(words)[1];
  return (v0.x | v0.y << 8 | v0.z << 16 | v0.w << 24) |
         static_cast<uint64_t>(v1.x | v1.y << 8 | v1.z << 16 | v1.w << 24) << 32;
}

// The round slots' key mask of a tile (traits.h kSlots): keys 0-31 from slot s0's 4 words, 32-63
// from slot s1's (word w of a slot holds keys 8 w .. 8 w + 7 of its round in its low byte, read
// out of the word by `byte`).
template <class Byte>
__device__ __forceinline__ uint64_t slots_mask(const uint32_t (&words)[12], int s0, int s1,
                                               Byte&& byte) {
  const uint4 a = reinterpret_cast<const uint4*>(words)[s0];
  const uint4 b = reinterpret_cast<const uint4*>(words)[s1];
  return (byte(a.x) | byte(a.y) << 8 | byte(a.z) << 16 | byte(a.w) << 24) |
         static_cast<uint64_t>(byte(b.x) | byte(b.y) << 8 | byte(b.z) << 16 | byte(b.w) << 24)
             << 32;
}
__device__ __forceinline__ uint64_t slots_valid(const uint32_t (&words)[12], int s0, int s1) {
  return slots_mask(words, s0, s1, [](uint32_t x) { return x; });
}
// With two producer warpgroups (traits.h kRing_ 4) byte b of word w holds keys 8 w + 4 b .. + 3
// in its bits 0 .. 3 (bytes 2-3 never written).
__device__ __forceinline__ uint64_t slots_valid8(const uint32_t (&words)[12], int s0, int s1) {
  return slots_mask(words, s0, s1, [](uint32_t x) { return (x & 0xFu) | ((x >> 4) & 0xF0u); });
}

// The round slots' P V (attention/mma.cuh gemm_pv_by_slots) as 64 x 128 groups (traits.h
// kRing_ 4: the kernel's 512 threads leave too few registers for one 64 x 256 wgmma's operands).
template <class Traits, class Mma, class TP, class TV, class TO>
__device__ __forceinline__ void gemm_pv_by_slots_128(Mma& mma, TP& tOrP, TV const& tOrV0,
                                                     TV const& tOrV1, TO& tOrO) {
  using namespace cute;
  auto layout = partition_fragment_C(mma, Shape<Int<64>, Int<128>>{}).layout();
  static_assert(decltype(size(layout))::value * 2 == decltype(size(tOrO))::value);
  Tensor o0 = make_tensor(tOrO.data(), layout);
  Tensor o1 = make_tensor(tOrO.data() + decltype(size(layout))::value, layout);
  pv_by_round_groups(mma, tOrP, tOrO, [&](int k) {
    auto const& v = k < 2 ? tOrV0 : tOrV1;
    const int kb = k & 1;
    gemm(mma, tOrP(_, _, k), v(_, _, kb), o0);
    gemm(mma, tOrP(_, _, k), at_offset(v, 2 * Traits::kSlotPieceBytes)(_, _, kb), o1);
  });
}

// A round slot's RoPE piece (d 576; dead once the slot's QK^T is done): half of P lives there,
// the keys of that round (attention/fragments.cuh store_p_halves).
template <class Traits>
__device__ __forceinline__ void* slot_rope(typename Traits::SharedStorage& smem, int slot) {
  return smem.k[0] + slot * Traits::kSlotElems + 8 * (Traits::kSlotPieceBytes / 2);
}

// The slots in a CTA pair's round of 32 keys (traits.h kPairSlots): its key mask (bit j = key j
// of the round), and where its P (64 x 32) crosses to WG1: at d 576 the slot's RoPE piece (dead
// once the round's QK^T is done), at d 512 the P buffer (WG0 writes a round's P only after WG1
// took the previous one).
__device__ __forceinline__ uint32_t slot_round_valid(const uint32_t (&words)[12], int s) {
  const uint4 a = reinterpret_cast<const uint4*>(words)[s];
  return a.x | a.y << 8 | a.z << 16 | a.w << 24;
}
template <class Traits>
__device__ __forceinline__ void* round_p_buffer(typename Traits::SharedStorage& smem, int slot) {
  if constexpr (Traits::kPInKTile) {
    return slot_rope<Traits>(smem, slot);
  } else {
    return smem.p[0];
  }
}

// The seesaw order's P of stage s: at d 576 stage 0's in its RoPE piece (in its R half, which
// WG1, the reader, frees) and stage 1's in a buffer of its own (its RoPE piece is in stage 1's R
// half, which WG1 frees before WG0 has read P); at d 512 a buffer each.
template <class Traits>
__device__ __forceinline__ void* seesaw_p_buffer(typename Traits::SharedStorage& smem, int s) {
  if constexpr (Traits::kPInKTile) {
    return s == 0 ? static_cast<void*>(smem.k[0] + 8 * Traits::kPieceElems)
                  : static_cast<void*>(smem.p[0]);
  } else {
    return smem.p[s];
  }
}

// Scores of keys the producer found invalid (a clear bit of `valid`: bit j is key j of the tile
// or round) or at or past a row's causal limit (the dense mode's cut rows: `limit_of(r)`, the
// tile-relative limit of the thread's row r) set to -inf.
template <class Mask, class TS, class TC, class LimitOf>
__device__ __forceinline__ void mask_scores(TS& S, TC const& cS_rc, Mask valid, bool cut_rows,
                                            LimitOf&& limit_of) {
  using namespace cute;
  if (valid != ~Mask(0) || cut_rows) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int cut = cut_rows ? limit_of(r) : INT_MAX;
#pragma unroll
      for (int c = 0; c < size<1>(S); ++c) {
        const int key = get<1>(cS_rc(r, c));
        if (!((valid >> key) & Mask(1)) || key >= cut) S(r, c) = -INFINITY;
      }
    }
  }
}
// One step of the online softmax's row maxima over S: the exact max (m_true), the lazy running
// max (m_run), P's exp2 base and O's rescale factor of each of the thread's two rows.
template <class TS>
__device__ __forceinline__ void running_max_step(TS const& S, float max_thr, float sl2,
                                                 float (&m_true)[2], float (&m_run)[2],
                                                 float (&base)[2], float (&factor)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float mx = quad_max(row_reduce<true>(S, r));
    m_true[r] = fmaxf(m_true[r], mx);
    const float m_new = lazy_max(m_run[r], mx, max_thr);
    base[r] = max_base(m_new, sl2);
    factor[r] = exp2_approx(m_run[r] * sl2 - base[r]);
    m_run[r] = m_new;
  }
}

// The compute warpgroups (wg 0 or 1).
template <class Traits>
__device__ __forceinline__ void consume(const SparseDecodeParams& p,
                                        typename Traits::SharedStorage& smem, int wg, int m_block,
                                        int split, int problem) {
  using namespace cute;
  using Element = typename Traits::Element;
  using KElement = typename Traits::KElement;  // Q, K and P in the MMAs (fp16 with kFp16)
  KElement* const q_op = reinterpret_cast<KElement*>(smem.q);
  KElement* const k_op = reinterpret_cast<KElement*>(smem.k[0]);
  const int t = threadIdx.x - wg * 128;
  const int lane = t % 32;
  constexpr bool kDense = Traits::kDense;
  const Problem keys = problem_of<kDense>(p, problem);
  const int2 range = split_tiles<kDense>(p, keys, split);
  const int n_tiles = range.y - range.x;

  typename Traits::TiledMmaQK mma_qk;
  typename Traits::TiledMmaPV mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(t);
  auto thr_pv = mma_pv.get_thread_slice(t);

  Tensor sQ = make_tensor(make_smem_ptr(q_op), typename Traits::SmemLayoutQ{});
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);  // (MMA,1,D/16)
  Tensor tSrK = thr_qk.partition_fragment_B(
      make_tensor(make_smem_ptr(k_op), typename Traits::SmemLayoutK{}));  // (MMA,1,D/16)
  Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<64>, Int<64>>{});
  Tensor S = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));  // (2,16)
  Tensor cS = make_identity_tensor(Shape<Int<64>, Int<64>>{});
  Tensor tScS = thr_qk.partition_C(cS);
  Tensor cS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));  // (2,16) -> (row,key)

  Tensor sP_shape = make_tensor(make_smem_ptr(q_op), typename Traits::SmemLayoutP{});
  Tensor tOrP = thr_pv.partition_fragment_A(sP_shape);  // (MMA,1,4)
  Tensor tOrV = thr_pv.partition_fragment_B(
      make_tensor(make_smem_ptr(k_op + wg * 4 * Traits::kPieceElems),
                  typename Traits::SmemLayoutV{}));  // (MMA,1,4)
  // The ring fill's S = Q K^T by round (traits.h kRing): a round's 64 x 32 block of S is the
  // first (keys 0-31) or second half of the 64 x 64 accumulator's registers (its n8 blocks 0-3
  // and 4-7), so the two rounds' wgmmas write into tSrS itself.
  typename Traits::TiledMmaQKRound mma_qkr;
  auto thr_qkr = mma_qkr.get_thread_slice(t);
  Tensor tSrQr = thr_qkr.partition_fragment_A(sQ);
  Tensor tSrKr = thr_qkr.partition_fragment_B(
      make_tensor(make_smem_ptr(k_op), typename Traits::SmemLayoutKRound{}));
  Tensor tSrSr = partition_fragment_C(mma_qkr, Shape<Int<64>, Int<32>>{});
  static_assert(decltype(size(tSrSr))::value * 2 == decltype(size(tSrS))::value);
  // The slots in a CTA pair's 32-key tiles (traits.h kPairSlots): S of a round as rows and keys,
  // and its P as the A operand of a P V over one slot (2 k-blocks).
  [[maybe_unused]] Tensor Sr = make_tensor(tSrSr.data(), acc_rowcol(tSrSr.layout()));  // (2,8)
  [[maybe_unused]] Tensor cSr_rc = make_tensor(
      thr_qkr.partition_C(make_identity_tensor(Shape<Int<64>, Int<32>>{})).data(),
      acc_rowcol(thr_qkr.partition_C(make_identity_tensor(Shape<Int<64>, Int<32>>{})).layout()));
  [[maybe_unused]] Tensor tOrPr = thr_pv.partition_fragment_A(
      make_tensor(make_smem_ptr(q_op), typename Traits::SmemLayoutPRound{}));  // (MMA,1,2)
  // The round slots (traits.h kSlots): round n of the CTA's list is in slot n % 3, its (n / 3)-th
  // use; a warpgroup's V of a slot is its 4 pieces of 32 keys (MN-major), 2 k-blocks. Each
  // warpgroup releases each round once (WG0 an even round after its tile's P V, an odd one
  // after the next tile's first QK^T; WG1 both after its P V), so the producer's decode of
  // round n waits only for round n - 3, whose releases need rounds up to n - 2: no cycle. P of a
  // tile (d 576: in its two slots' RoPE pieces, dead after the tile's QK^T; d 512: p[0]) and the
  // row factors are overwritten only by the next tile's softmax, after its round 1 was decoded
  // into the slot WG1 released once it had loaded them.
  constexpr bool kSlots = Traits::kSlots;
  Tensor tOrVs = thr_pv.partition_fragment_B(
      make_tensor(make_smem_ptr(k_op + wg * 4 * (Traits::kSlotPieceBytes / 2)),
                  typename Traits::SmemLayoutVSlot{}));  // (MMA,1,2)
  // Two producer warpgroups (kRing_ 4): a slot's V as 64 x 128 groups (gemm_pv_by_slots_128).
  [[maybe_unused]] typename Traits::TiledMmaPV128 mma_pv128;
  [[maybe_unused]] auto tOrVs128 = mma_pv128.get_thread_slice(t).partition_fragment_B(
      make_tensor(make_smem_ptr(smem.k[0] + wg * 4 * (Traits::kSlotPieceBytes / 2)),
                  typename Traits::SmemLayoutVSlot128{}));  // (MMA,1,2)
  Tensor tOrO = partition_fragment_C(mma_pv, Shape<Int<64>, Int<Traits::kVHalfDims>>{});
  Tensor O = make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));  // (2,128)
  Tensor cO = make_identity_tensor(Shape<Int<64>, Int<Traits::kVHalfDims>>{});
  Tensor tOcO = thr_pv.partition_C(cO);
  Tensor cO_rc = make_tensor(tOcO.data(), acc_rowcol(tOcO.layout()));

  int mrow[2];  // the thread's two rows of the m-block
#pragma unroll
  for (int r = 0; r < 2; ++r) mrow[r] = get<0>(cS_rc(r, 0));
  // Causal dense decode: the keys the m-block's first row may see (rows of later query tokens
  // see more: each row's limit waits in shared memory for the tiles that cut one). One register
  // in the loop: WG0 has no more.
  const int first_limit = row_limit<kDense>(p, keys, row_of<kDense>(p, problem, m_block * 64));
  const float sl2 = p.scale_log2;
  clear(tOrO);
  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.f, 0.f};
  float m_true[2] = {-INFINITY, -INFINITY};  // the exact row max (m_run is lazy), for max_logits
  // kFp16: O is kept in units of 2^-e_ref, e_ref the largest key exponent seen (P's column j
  // times 2^(e_j - e_ref) <= 1); S's entry (r, j) times 2^(q_exp[r] + e_j) back to the true score.
  // Neither is held in registers (WG0 has none to spare): Q's row exponents stay in
  // smem.row_sum until the epilogue, e_ref in smem.o_exp[warp] (each warp its own: they run
  // apart; every lane writes the same value).

  if constexpr (Traits::kSeesaw) {
    // Seesaw order (bf16 tiles by cp.async, the sparse mode; launch.cu): WG w computes S for the
    // tiles of stage w (WG0 even, WG1 odd), the two share their row maxima, and each adds both
    // tiles' P V for its half of d_v, its own P from registers and the other's through shared
    // memory. The tensor pipe's work per tile is split evenly (a QK^T and half of two PVs each),
    // where the default order gives WG0 the QK^T and PV_L and WG1 only PV_R. A stage's halves
    // have barriers of their own (producer.cuh produce_halves): L (dims 0-255) is read by the
    // owner's QK^T and WG0's PVs, R (the rest) by the owner's QK^T and WG1's PVs, so each half
    // goes back to the producer as soon as its readers are done.
    if (wg == 0) {
      load_q<Traits>(p, smem, problem, m_block, t);
      fence_async_smem();
    }
    bar_sync(kBarQ, 256);
    float* xmax = reinterpret_cast<float*>(smem.rescale);  // [wg][64 rows]; WG1's sums at 128
    const float max_thr = 8.f / sl2;
    const int own = wg, other = wg ^ 1;   // this warpgroup's stage (its S), the other's
    const int first_half = wg, second_half = wg ^ 1;  // WG0 waits for L first, WG1 for R
    // The half of each stage this warpgroup's PVs read (L for WG0, R for WG1); the owner's QK^T
    // also reads the other half of its own stage.
    const int pv_half = wg;
    // S += Q K^T over half `kHalf` of this warpgroup's stage (the first half zeroes S).
    auto qk_half = [&](auto half, bool first) {
      constexpr int kHalf = decltype(half)::value;
      constexpr int k0 = kHalf == 0 ? 0 : 16, k1 = kHalf == 0 ? 16 : Traits::kHeadDimQK / 16;
      auto tSrK_s = at_offset(tSrK, own * Traits::kStageBytes);
#pragma unroll
      for (int k = k0; k < k1; ++k) {
        mma_qk.accumulate_ = first && k == k0 ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
        gemm(mma_qk, tSrQ(_, _, k), tSrK_s(_, _, k), tSrS);
      }
    };
    // WG0 reads its stage's L half first, WG1 its R half (the producer's order: L0 R1 R0 L1).
    auto qk_first = [&] {
      if (wg == 0) {
        qk_half(std::integral_constant<int, 0>{}, true);
      } else {
        qk_half(std::integral_constant<int, 1>{}, true);
      }
    };
    auto qk_second = [&] {
      if (wg == 0) {
        qk_half(std::integral_constant<int, 1>{}, false);
      } else {
        qk_half(std::integral_constant<int, 0>{}, false);
      }
    };
    // S = Q K^T of this warpgroup's tile (stage `own`), the keys the mask drops set to -inf, and
    // its row maxima. The owner's QK^T is then done with the half its PVs do not read. Each wait
    // sits on the one path through, so ptxas sees no wgmma in flight past it (C7515).
    auto own_qk = [&](int phase, float (&mx)[2]) {
      wait_full(&smem.full[2 * own + first_half], phase, false);
      warpgroup_fence_operand(tSrS);
      warpgroup_arrive();
      qk_first();
      warpgroup_commit_batch();
      wait_full(&smem.full[2 * own + second_half], phase, false);
      warpgroup_arrive();
      qk_second();
      warpgroup_commit_batch();
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);
      const uint64_t valid = stage_valid(smem.valid[own]);  // written with the R half (last part)
      release_stage(&smem.empty[2 * own + (pv_half ^ 1)], lane, false);
      if (valid != ~0ull) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
#pragma unroll
          for (int c = 0; c < size<1>(S); ++c) {
            if (!((valid >> get<1>(cS_rc(r, c))) & 1ull)) S(r, c) = -INFINITY;
          }
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) mx[r] = quad_max(row_reduce<true>(S, r));
    };
    const int n_iter = (n_tiles + 1) / 2;
    if constexpr (Traits::kStagger) {
      // Staggered maxima: WG0 sets the round's max from its own tile alone and issues its P V at
      // once; WG1 takes that max, folds in its tile's and publishes the round's final max, so
      // WG1's softmax runs under WG0's P V instead of beside it. WG0 brings O_L and its row sums
      // to the final max after its P V; WG1 scales WG0's P as it loads it. With the lazy max the
      // final max is nearly always WG0's, and both corrections are skipped.
      // One loop for both warpgroups, so own_qk is inlined at one call site (two left its wgmmas
      // in a function of their own, serialised).
      // An odd count's last round has a stage-1 tile too, every key masked (the producer fills
      // it with zeros): no path in the round depends on a tile count (with such branches WG1
      // spilled).
      for (int it = 0; it < n_iter; ++it) {
        float mx[2];
        own_qk(it & 1, mx);
        float base[2], factor[2], sum[2] = {0.f, 0.f};
        if (wg == 0) {
          float m_first[2];
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            m_true[r] = fmaxf(m_true[r], mx[r]);
            m_first[r] = lazy_max(m_run[r], mx[r], max_thr);
            base[r] = max_base(m_first[r], sl2);
            factor[r] = exp2_approx(m_run[r] * sl2 - base[r]);
          }
          if (lane % 4 == 0) {
#pragma unroll
            for (int r = 0; r < 2; ++r) xmax[mrow[r]] = m_first[r];
          }
          bar_arrive(kBarMax, 256);
          softmax_to_p<Element>(S, tSrS, base, sl2, sum, tOrP);
          store_p(seesaw_p_buffer<Traits>(smem, 0), tOrP, t);
          bar_arrive(kBarP0, 256);
#pragma unroll
          for (int r = 0; r < 2; ++r) l_run[r] = l_run[r] * factor[r] + sum[r];
          rescale_rows(O, factor);
          gemm_pv(mma_pv, tOrP, tOrV, tOrO);
          wait_pv(tOrO, tOrP);
          release_stage(&smem.empty[0], lane, false);  // L0
          bar_sync(kBarMaxFinal, 256);  // WG1's final max of the round
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            m_run[r] = xmax[64 + mrow[r]];
            // 1 exactly when the max stayed (x - x); 0 when no key was seen yet (O_L is 0)
            factor[r] = exp2_approx(m_first[r] * sl2 - max_base(m_run[r], sl2));
            l_run[r] *= factor[r];
          }
          rescale_rows_if(O, factor);
          bar_sync(kBarP1, 256);
          load_p(seesaw_p_buffer<Traits>(smem, 1), tOrP, t);
          gemm_pv(mma_pv, tOrP, at_offset(tOrV, Traits::kStageBytes), tOrO);
          wait_pv(tOrO, tOrP);
          release_stage(&smem.empty[2], lane, false);  // L1
        } else {
          bar_sync(kBarMax, 256);  // WG0's max of the round
          float pscale[2];
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const float m_first = xmax[mrow[r]];
            m_true[r] = fmaxf(m_true[r], mx[r]);
            const float m_final = lazy_max(m_first, mx[r], max_thr);
            base[r] = max_base(m_final, sl2);
            factor[r] = exp2_approx(m_run[r] * sl2 - base[r]);
            pscale[r] = exp2_approx(m_first * sl2 - base[r]);  // WG0's P to the final max
            m_run[r] = m_final;
          }
          if (lane % 4 == 0) {
#pragma unroll
            for (int r = 0; r < 2; ++r) xmax[64 + mrow[r]] = m_run[r];
          }
          bar_arrive(kBarMaxFinal, 256);
          softmax_to_p<Element>(S, tSrS, base, sl2, sum, tOrP);
          store_p(seesaw_p_buffer<Traits>(smem, 1), tOrP, t);
          bar_arrive(kBarP1, 256);
#pragma unroll
          for (int r = 0; r < 2; ++r) l_run[r] = l_run[r] * factor[r] + sum[r];
          rescale_rows(O, factor);
          gemm_pv(mma_pv, tOrP, at_offset(tOrV, Traits::kStageBytes), tOrO);
          wait_pv(tOrO, tOrP);
          release_stage(&smem.empty[3], lane, false);  // R1
          bar_sync(kBarP0, 256);
          load_p(seesaw_p_buffer<Traits>(smem, 0), tOrP, t);
          if (__any_sync(0xffffffffu, pscale[0] != 1.f || pscale[1] != 1.f)) {
            // Through S's registers (free here): the fragment's word k holds S's flat 2k, 2k+1.
            Tensor P32 = recast<uint32_t>(tOrP);
#pragma unroll
            for (int k = 0; k < size(P32); ++k) {
              tSrS(2 * k) = __uint_as_float(P32(k) << 16);
              tSrS(2 * k + 1) = __uint_as_float(P32(k) & 0xFFFF0000u);
            }
            rescale_rows(S, pscale);
#pragma unroll
            for (int k = 0; k < size(P32); ++k) {
              P32(k) = pack2<Element>(tSrS(2 * k), tSrS(2 * k + 1));
            }
          }
          gemm_pv(mma_pv, tOrP, tOrV, tOrO);
          wait_pv(tOrO, tOrP);
          release_stage(&smem.empty[1], lane, false);  // R0
        }
      }
    } else {
      for (int it = 0; it < n_iter; ++it) {
        // With an odd tile count WG1 has no tile in the last round.
        const bool mine = 2 * it + wg < n_tiles, theirs = 2 * it + other < n_tiles;
        float mx[2] = {-INFINITY, -INFINITY};
        if (mine) own_qk(it & 1, mx);
        // Both warpgroups derive the same running max from both tiles' row maxima.
        if (lane % 4 == 0) {
#pragma unroll
          for (int r = 0; r < 2; ++r) xmax[wg * 64 + mrow[r]] = mx[r];
        }
        bar_sync(kBarMax, 256);
        float factor[2], base[2], sum[2] = {0.f, 0.f};
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float o = xmax[other * 64 + mrow[r]];
          const float both = wg == 0 ? fmaxf(mx[r], o) : fmaxf(o, mx[r]);  // the same in both
          m_true[r] = fmaxf(m_true[r], both);
          const float m_new = lazy_max(m_run[r], both, max_thr);
          base[r] = max_base(m_new, sl2);
          factor[r] = exp2_approx(m_run[r] * sl2 - base[r]);
          m_run[r] = m_new;
        }
        if (mine) {
          softmax_to_p<Element>(S, tSrS, base, sl2, sum, tOrP);
          store_p(seesaw_p_buffer<Traits>(smem, own), tOrP, t);
          bar_arrive(wg == 0 ? kBarP0 : kBarP1, 256);
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) l_run[r] = l_run[r] * factor[r] + sum[r];
        rescale_rows(O, factor);
        if (mine) {
          gemm_pv(mma_pv, tOrP, at_offset(tOrV, own * Traits::kStageBytes), tOrO);
          wait_pv(tOrO, tOrP);
          release_stage(&smem.empty[2 * own + pv_half], lane, false);
        }
        if (theirs) {
          bar_sync(wg == 0 ? kBarP1 : kBarP0, 256);
          load_p(seesaw_p_buffer<Traits>(smem, other), tOrP, t);
          gemm_pv(mma_pv, tOrP, at_offset(tOrV, other * Traits::kStageBytes), tOrO);
          wait_pv(tOrO, tOrP);
          release_stage(&smem.empty[2 * other + pv_half], lane, false);
        }
      }
    }
    // The row sums: each warpgroup's over its own tiles, in the same running max's units.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l_run[r] = quad_sum(l_run[r]);
      if (wg == 1 && lane % 4 == 0) {
        xmax[128 + mrow[r]] = l_run[r];
        // The stagger's maxima are each warpgroup's own tiles' (WG0's slot is read by now).
        if constexpr (Traits::kStagger) xmax[mrow[r]] = m_true[r];
      }
    }
    bar_sync(kBarMax, 256);
    if (wg == 0) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if constexpr (Traits::kStagger) m_true[r] = fmaxf(m_true[r], xmax[mrow[r]]);
        if (lane % 4 == 0) smem.row_sum[mrow[r]] = l_run[r] + xmax[128 + mrow[r]];
      }
    }
  } else if (wg == 0) {
    load_q<Traits>(p, smem, problem, m_block, t);
    if constexpr (kDense) {  // the rows' query tokens, heads and limits, divided out once
      if (t < 64) {
        const Row r = row_of<kDense>(p, problem, m_block * 64 + t);
        smem.row_limit[t] = row_limit<kDense>(p, keys, r);
        smem.row_code[t] = r.ok ? static_cast<uint32_t>(r.j) << 16 | r.h : ~0u;
      }
    }
    if constexpr (Traits::kFp16) {
      bar_sync(kBarQ, 128);  // every thread's Q stores before the rows are read
      q_rows_to_fp16<Traits>(smem, t);
      if (t < 4) smem.o_exp[t] = -60;
    }
    fence_async_smem();
    bar_sync(kBarQ, 128);
    const float max_thr = 8.f / sl2;
    if constexpr (Traits::kPairSlots) {
      // The round slots in a CTA pair (traits.h kPairSlots) walk 32-key tiles, one round each:
      // round n's slot goes back after its own P V, so the decode of round n + 3 (by either
      // CTA's producer) waits for round n alone, two rounds before it is needed. (With 64-key
      // tiles it waited for the tile holding the slot's previous round: each tile's second
      // round was decoded only once the previous tile was done, in series with the MMAs.)
      // P and the row factors cross to WG1 a round at a time: WG0 writes round n + 1's only
      // after WG1 took round n's (named barrier P1). WG0 hands each round back after its own
      // P V (below).
      const int n_rounds = 2 * n_tiles;
      for (int n = 0; n < n_rounds; ++n) {
        const int s = n % 3;
        wait_full(&smem.full[s], (n / 3) & 1, false);
        warpgroup_fence_operand(tSrSr);
        warpgroup_arrive();
        auto tSrQ_r = at_offset(tSrQr, 0);
        auto tSrK_r = at_offset(tSrKr, s * Traits::kSlotBytes);
#pragma unroll
        for (int k = 0; k < Traits::kHeadDimQK / 16; ++k) {
          mma_qkr.accumulate_ = k == 0 ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
          gemm(mma_qkr, tSrQ_r(_, _, k), tSrK_r(_, _, k), tSrSr);
        }
        warpgroup_commit_batch();
        warpgroup_wait<0>();
        warpgroup_fence_operand(tSrSr);
        warpgroup_fence_operand(tOrO);
        const uint32_t valid = slot_round_valid(smem.valid[0], s);
        const int pos0 = 64 * range.x + 32 * n;
        const bool cut_rows = kDense && first_limit - pos0 < 32;
        mask_scores(Sr, cSr_rc, valid, cut_rows,
                    [&](int r) { return smem.row_limit[mrow[r]] - pos0; });
        float factor[2], base[2], sum[2];
        running_max_step(Sr, max_thr, sl2, m_true, m_run, base, factor);
        softmax_to_p<Element>(Sr, tSrSr, base, sl2, sum, tOrPr);
#pragma unroll
        for (int r = 0; r < 2; ++r) l_run[r] = l_run[r] * factor[r] + sum[r];
        if (n > 0) bar_sync(kBarP1, 256);  // WG1 has taken round n - 1's P and factors
        store_p(round_p_buffer<Traits>(smem, s), tOrPr, t);
        smem.rescale[0][t] = make_float2(factor[0], factor[1]);
        bar_arrive(kBarP0, 256);
        rescale_rows_if(O, factor);
        gemm_pv(mma_pv, tOrPr, at_offset(tOrVs, s * Traits::kSlotBytes), tOrO);
        // The round goes back as soon as its P V is done, not under the next round's QK^T: so
        // the slot of round n + 3 never waits for round n + 1 to arrive (the paired slots lost
        // 13-15% with that wait on their chain: NOTES.md).
        wait_pv(tOrO, tOrPr);
        release_stage(&smem.empty[s], lane, true);
      }
    } else {
      for (int kk = 0; kk < n_tiles; ++kk) {
        const int stage = Traits::kRing ? 0 : kk & 1;
        if constexpr (Traits::kRing) {
          // S = Q K^T round by round, each as soon as its keys are decoded; the previous tile's
          // P V over round 1 (issued before) completes under round 0's and hands round 1 back.
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            Tensor S_r = make_tensor(tSrS.data() + r * size(tSrSr), tSrSr.layout());
            const int n = 2 * kk + r;  // (the round slots: round n is in slot n % 3)
            wait_full(&smem.full[kSlots ? n % 3 : r], kSlots ? (n / 3) & 1 : kk & 1, false);
            warpgroup_fence_operand(S_r);
            warpgroup_arrive();
            // (Q's descriptors formed afresh each round: held across both, they spill WG0)
            auto tSrQ_r = at_offset(tSrQr, 0);
            auto tSrK_r = at_offset(tSrKr, kSlots ? (n % 3) * Traits::kSlotBytes : r * 32 * 128);
#pragma unroll
            for (int k = 0; k < Traits::kHeadDimQK / 16; ++k) {
              if constexpr (Traits::kRopeBf16) {
                if (k >= 32) {  // d 576's RoPE piece: bf16 (traits.h kFp16)
                  typename Traits::TiledMmaQKRoundBf16 mma_rope;
                  auto thr_rope = mma_rope.get_thread_slice(t);
                  auto tSrQb = thr_rope.partition_fragment_A(
                      make_tensor(make_smem_ptr(smem.q), typename Traits::SmemLayoutQ{}));
                  auto tSrKb = at_offset(
                      thr_rope.partition_fragment_B(make_tensor(
                          make_smem_ptr(smem.k[0]), typename Traits::SmemLayoutKRound{})),
                      (n % 3) * Traits::kSlotBytes);
                  mma_rope.accumulate_ = GMMA::ScaleOut::One;
                  gemm(mma_rope, tSrQb(_, _, k), tSrKb(_, _, k), S_r);
                  continue;
                }
              }
              mma_qkr.accumulate_ = k == 0 ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
              gemm(mma_qkr, tSrQ_r(_, _, k), tSrK_r(_, _, k), S_r);
            }
            warpgroup_commit_batch();
            if (r == 0 && kk > 0) {
              warpgroup_wait<1>();
              release_stage(&smem.empty[kSlots ? (n + 2) % 3 : 1], lane,
                            Traits::kPairSlots);  // round n - 1
            }
          }
        } else {
          wait_full(&smem.full[stage], (kk >> 1) & 1, p.pair);
          // S = Q K^T. The previous tile's PV (issued before it) completes first: its stage goes
          // back to the producer while this QK^T still runs, so the next fill starts a QK^T
          // earlier.
          warpgroup_fence_operand(tSrS);
          warpgroup_arrive();
          auto tSrK_s = at_offset(tSrK, stage * Traits::kStageBytes);
#pragma unroll
          for (int k = 0; k < Traits::kHeadDimQK / 16; ++k) {
            mma_qk.accumulate_ = k == 0 ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
            gemm(mma_qk, tSrQ(_, _, k), tSrK_s(_, _, k), tSrS);
          }
          warpgroup_commit_batch();
          if (kk > 0) {
            warpgroup_wait<1>();
            release_stage(&smem.empty[stage ^ 1], lane, p.pair);
          }
        }
        warpgroup_wait<0>();
        warpgroup_fence_operand(tSrS);
        warpgroup_fence_operand(tOrO);
        // kFp16: key j of the tile (round slot s0 or s1) and its exponent.
        [[maybe_unused]] auto key_exp = [&](int c) {
          const int key = get<1>(cS_rc(0, c));
          return static_cast<int>(
              smem.key_exp[32 * (key < 32 ? (2 * kk) % 3 : (2 * kk + 1) % 3) + (key & 31)]);
        };
        [[maybe_unused]] int e_tile = -60;
        if constexpr (Traits::kFp16) {  // S back to the true scores; the tile's largest exponent
          int q_exp[2];
#pragma unroll
          for (int r = 0; r < 2; ++r) q_exp[r] = __float_as_int(smem.row_sum[mrow[r]]);
#pragma unroll
          for (int c = 0; c < size<1>(S); ++c) {
            const int e = key_exp(c);
            e_tile = max(e_tile, e);
#pragma unroll
            for (int r = 0; r < 2; ++r) S(r, c) *= exp2_int(q_exp[r] + e);
          }
          e_tile = max(e_tile, __shfl_xor_sync(0xffffffffu, e_tile, 1));
          e_tile = max(e_tile, __shfl_xor_sync(0xffffffffu, e_tile, 2));
        }
        // Keys the producer found invalid (or past the list's count) never count, nor keys past
        // a row's causal limit (dense mode, s_q > 1).
        uint64_t valid;
        if constexpr (Traits::kProducerWarpgroups == 2) {
          valid = slots_valid8(smem.valid[0], (2 * kk) % 3, (2 * kk + 1) % 3);
        } else if constexpr (kSlots) {
          valid = slots_valid(smem.valid[0], (2 * kk) % 3, (2 * kk + 1) % 3);
        } else {
          valid = stage_valid(smem.valid[stage]);
        }
        const int pos0 = 64 * (range.x + kk);
        const bool cut_rows = kDense && first_limit - pos0 < 64;
        mask_scores(S, cS_rc, valid, cut_rows,
                    [&](int r) { return smem.row_limit[mrow[r]] - pos0; });
        float factor[2], base[2], sum[2];
        running_max_step(S, max_thr, sl2, m_true, m_run, base, factor);
        if constexpr (Traits::kFp16) {
          // O's units move to the largest exponent so far (its rows times 2^(e_ref - e_next),
          // beside the softmax factor; the row sums only by that), then P's column j times
          // 2^(e_j - e_ref) <= 1.
          int* const e_ref = smem.o_exp + t / 32;
          const int e_prev = *e_ref, e_next = max(e_prev, e_tile);
          const float ratio = exp2_int(e_prev - e_next);
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            l_run[r] *= factor[r];
            factor[r] *= ratio;
          }
          *e_ref = e_next;
          // (read back each time, volatile: a register held through the softmax spills WG0)
          softmax_to_p_cols<KElement>(S, tSrS, base, sl2, sum, tOrP, [&](int c) {
            return exp2_int(key_exp(c) - *static_cast<volatile int*>(e_ref));
          });
#pragma unroll
          for (int r = 0; r < 2; ++r) l_run[r] += sum[r];
        } else {
          softmax_to_p<Element>(S, tSrS, base, sl2, sum, tOrP);
#pragma unroll
          for (int r = 0; r < 2; ++r) l_run[r] = l_run[r] * factor[r] + sum[r];
        }
        if constexpr (kSlots && Traits::kPInKTile) {
          store_p_halves(slot_rope<Traits>(smem, (2 * kk) % 3),
                         slot_rope<Traits>(smem, (2 * kk + 1) % 3), tOrP, t);
        } else {
          store_p(p_buffer<Traits>(smem, stage), tOrP, t);
        }
        smem.rescale[stage][t] = make_float2(factor[0], factor[1]);
        bar_arrive(stage == 0 ? kBarP0 : kBarP1, 256);
        rescale_rows_if(O, factor);
        if constexpr (Traits::kProducerWarpgroups == 2) {
          const int s0 = (2 * kk) % 3;
          gemm_pv_by_slots_128<Traits>(mma_pv128, tOrP, at_offset(tOrVs128, s0 * Traits::kSlotBytes),
                                       at_offset(tOrVs128, (2 * kk + 1) % 3 * Traits::kSlotBytes),
                                       tOrO);
          warpgroup_wait<1>();
          // round 0's keys (round 1's: above)
          release_stage(&smem.empty[s0], lane, Traits::kPairSlots);
        } else if constexpr (kSlots) {
          const int s0 = (2 * kk) % 3;
          gemm_pv_by_slots(mma_pv, tOrP, at_offset(tOrVs, s0 * Traits::kSlotBytes),
                           at_offset(tOrVs, (2 * kk + 1) % 3 * Traits::kSlotBytes), tOrO);
          warpgroup_wait<1>();
          // round 0's keys (round 1's: above)
          release_stage(&smem.empty[s0], lane, Traits::kPairSlots);
        } else if constexpr (Traits::kRing) {
          gemm_pv_by_round(mma_pv, tOrP, tOrV, tOrO);
          warpgroup_wait<1>();
          release_stage(&smem.empty[0], lane, false);  // round 0's keys (round 1's: above)
        } else {
          gemm_pv(mma_pv, tOrP, at_offset(tOrV, stage * Traits::kStageBytes), tOrO);
        }
      }
    }
    wait_pv(tOrO, tOrP);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l_run[r] = quad_sum(l_run[r]);
      if (lane % 4 == 0) smem.row_sum[mrow[r]] = l_run[r];
    }
  } else {
    if constexpr (Traits::kPairSlots) {  // 32-key tiles, a round each (WG0's branch above)
      const int n_rounds = 2 * n_tiles;
      for (int n = 0; n < n_rounds; ++n) {
        const int s = n % 3;
        bar_sync(kBarP0, 256);
        wait_full(&smem.full[s], (n / 3) & 1, false);
        load_p(round_p_buffer<Traits>(smem, s), tOrPr, t);
        const float2 f = smem.rescale[0][t];
        if (n + 1 < n_rounds) bar_arrive(kBarP1, 256);  // WG0 may write round n + 1's
        const float factor[2] = {f.x, f.y};
        rescale_rows_if(O, factor);
        gemm_pv(mma_pv, tOrPr, at_offset(tOrVs, s * Traits::kSlotBytes), tOrO);
        wait_pv(tOrO, tOrPr);
        release_stage(&smem.empty[s], lane, true);
      }
    } else {
      for (int kk = 0; kk < n_tiles; ++kk) {
        const int stage = Traits::kRing ? 0 : kk & 1;
        bar_sync(stage == 0 ? kBarP0 : kBarP1, 256);
        if constexpr (kSlots) {
          wait_full(&smem.full[(2 * kk) % 3], (2 * kk / 3) & 1, false);
          wait_full(&smem.full[(2 * kk + 1) % 3], ((2 * kk + 1) / 3) & 1, false);
        } else if constexpr (Traits::kRing) {
          wait_full(&smem.full[0], kk & 1, false);
          wait_full(&smem.full[1], kk & 1, false);
        } else {
          wait_full(&smem.full[stage], (kk >> 1) & 1, p.pair);
        }
        if constexpr (kSlots && Traits::kPInKTile) {
          load_p_halves(slot_rope<Traits>(smem, (2 * kk) % 3),
                        slot_rope<Traits>(smem, (2 * kk + 1) % 3), tOrP, t);
        } else {
          load_p(p_buffer<Traits>(smem, stage), tOrP, t);
        }
        const float2 f = smem.rescale[stage][t];
        const float factor[2] = {f.x, f.y};
        rescale_rows_if(O, factor);
        if constexpr (kSlots) {  // each round's keys handed back as its P V completes
          const int s0 = (2 * kk) % 3, s1 = (2 * kk + 1) % 3;
          if constexpr (Traits::kProducerWarpgroups == 2) {
            gemm_pv_by_slots_128<Traits>(mma_pv128, tOrP, at_offset(tOrVs128, s0 * Traits::kSlotBytes),
                                         at_offset(tOrVs128, s1 * Traits::kSlotBytes), tOrO);
          } else {
            gemm_pv_by_slots(mma_pv, tOrP, at_offset(tOrVs, s0 * Traits::kSlotBytes),
                             at_offset(tOrVs, s1 * Traits::kSlotBytes), tOrO);
          }
          warpgroup_wait<1>();
          release_stage(&smem.empty[s0], lane, Traits::kPairSlots);
          wait_pv(tOrO, tOrP);
          release_stage(&smem.empty[s1], lane, Traits::kPairSlots);
        } else if constexpr (Traits::kRing) {  // each round's keys handed back as its P V completes
          gemm_pv_by_round(mma_pv, tOrP, tOrV, tOrO);
          warpgroup_wait<1>();
          release_stage(&smem.empty[0], lane, false);
          wait_pv(tOrO, tOrP);
          release_stage(&smem.empty[1], lane, false);
        } else {
          gemm_pv(mma_pv, tOrP, at_offset(tOrV, stage * Traits::kStageBytes), tOrO);
          wait_pv(tOrO, tOrP);
          release_stage(&smem.empty[stage], lane, p.pair);
        }
      }
    }
  }
  bar_sync(kBarEpi, 256);

  // ---- epilogue: normalise; out + lse (one split) or the split's partial ----
  // (kFp16: the problem and split read again here, so WG0 holds neither through its loop)
  const int problem_e = Traits::kFp16 ? p.problem0 + static_cast<int>(blockIdx.z) : problem;
  const int split_e = Traits::kFp16 ? static_cast<int>(blockIdx.y) : split;
  Row rows[2];  // the query token and head of each of the thread's rows
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if constexpr (kDense) {  // from WG0's table (no division by h_q with O live)
      const uint32_t code = smem.row_code[mrow[r]];
      rows[r].ok = code != ~0u;
      rows[r].i = problem_e;
      rows[r].j = static_cast<int>(code >> 16);
      rows[r].h = static_cast<int>(code & 0xFFFFu);
      rows[r].token = problem_e * p.s_q + rows[r].j;
    } else {
      rows[r] = row_of<kDense>(p, problem_e, m_block * 64 + mrow[r]);
    }
  }
  const bool single = p.num_splits == 1;
  float lse[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = smem.row_sum[mrow[r]];
    float inv = l > 0.f ? 1.f / l : 0.f;
    if constexpr (Traits::kFp16) inv *= exp2_int(smem.o_exp[0]);  // O's units (e_ref)
    // m_run is WG0's; WG1 needs only the lse for the sink, so it reads it back below.
    lse[r] = l > 0.f ? m_run[r] * p.scale + logf(l) : (single ? INFINITY : -INFINITY);
#pragma unroll
    for (int c = 0; c < size<1>(O); ++c) O(r, c) *= inv;
  }
  if (wg == 0 && lane % 4 == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const Row& w = rows[r];
      if (!w.ok) continue;
      const float max_logit = m_true[r] == -INFINITY ? -INFINITY : m_true[r] * p.scale;
      if (single) {
        p.lse[w.i * p.lse_stride_b + w.h * p.lse_stride_h + w.j * p.lse_stride_s] = lse[r];
        if (p.max_logits != nullptr) {
          p.max_logits[w.i * p.max_logits_stride_b + w.h * p.max_logits_stride_h +
                       w.j * p.max_logits_stride_s] = max_logit;
        }
      } else {
        const int64_t at = (static_cast<int64_t>(split_e) * p.tokens + w.token) * p.h_q + w.h;
        p.lse_partial[at] = lse[r];
        if (p.max_logits != nullptr) p.max_partial[at] = max_logit;
      }
    }
  }
  if (single && p.sink != nullptr) {
    // WG1's lse: WG0's rows, published through row_sum's neighbour (the max) would cost a
    // barrier; the factor only needs lse, which WG0 writes to smem.rescale after the loop.
    if (wg == 0) {
      if (lane % 4 == 0) {
#pragma unroll
        for (int r = 0; r < 2; ++r) reinterpret_cast<float*>(smem.rescale)[mrow[r]] = lse[r];
      }
    }
    bar_sync(kBarEpi, 256);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float l = reinterpret_cast<const float*>(smem.rescale)[mrow[r]];
      float f = 0.f;
      if (rows[r].ok && l != INFINITY) {
        f = 1.f / (1.f + expf(p.sink[rows[r].h * p.sink_stride] - l));
      }
#pragma unroll
      for (int c = 0; c < size<1>(O); ++c) O(r, c) *= f;
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const Row& w = rows[r];
    if (!w.ok) continue;
    if (single) {
      char* out = static_cast<char*>(p.out) +
                  (w.i * p.out_stride_b + w.j * p.out_stride_s + w.h * p.out_stride_h +
                   wg * Traits::kVHalfDims) * 2;
#pragma unroll
      for (int c = 0; c < size<1>(O); c += 2) {
        const int col = get<1>(cO_rc(r, c));
        *reinterpret_cast<uint32_t*>(out + col * 2) = pack2<Element>(O(r, c), O(r, c + 1));
      }
    } else {
      float* out = p.o_partial +
                   ((static_cast<int64_t>(split_e) * p.tokens + w.token) * p.h_q + w.h) * 512 +
                   wg * Traits::kVHalfDims;
#pragma unroll
      for (int c = 0; c < size<1>(O); c += 2) {
        const int col = get<1>(cO_rc(r, c));
        *reinterpret_cast<float2*>(out + col) = make_float2(O(r, c), O(r, c + 1));
      }
    }
  }
}

}  // namespace sparse_decode_detail

// The token fill of one format, its rounds streamed where params.stream (producer.cuh).
template <class Traits, bool kPair, int kCodec>
__device__ __forceinline__ void produce_codec(const SparseDecodeParams& p,
                                              typename Traits::SharedStorage& smem, int problem,
                                              int split) {
  using namespace sparse_decode_detail;
  // 1: streamed, each round's loop the fast decode alone where its scales allow
  if (p.stream == 1) return produce_by_token_stream<Traits, kPair, kCodec>(p, smem, problem, split);
  produce_by_token<Traits, kPair, kCodec>(p, smem, problem, split);
}

// The token fill built for the grid's one quantised format (params.fill_codec), or reading the
// format at run time (-1: the caches differ, or OPENMLA_SPARSE_FILL=generic; never paired).
template <class Traits, bool kPair>
__device__ __forceinline__ void produce_quantised(const SparseDecodeParams& p,
                                                  typename Traits::SharedStorage& smem,
                                                  int problem, int split) {
  using namespace sparse_decode_detail;
  using kvcodec::Codec;
  constexpr int kV32 = static_cast<int>(Codec::kFP8_V32), kModel1 = static_cast<int>(Codec::kFP8_Model1);
  constexpr int kMX = static_cast<int>(Codec::kFP8_MX), kFP4 = static_cast<int>(Codec::kFP4);
  if constexpr (Traits::kHeadDimQK == 576) {
    if (p.fill_codec == kV32) return produce_codec<Traits, kPair, kV32>(p, smem, problem, split);
  } else {
    if (p.fill_codec == kModel1) {
      return produce_codec<Traits, kPair, kModel1>(p, smem, problem, split);
    }
    if (p.fill_codec == kMX) return produce_codec<Traits, kPair, kMX>(p, smem, problem, split);
    if (p.fill_codec == kFP4) return produce_codec<Traits, kPair, kFP4>(p, smem, problem, split);
  }
  if constexpr (!kPair) produce_by_token<Traits, false, -1>(p, smem, problem, split);
}

// The ring fill of the grid's one quantised format (launch.cu runs the ring kernel only with a
// fill built for one format).
template <class Traits>
__device__ __forceinline__ void produce_ring(const SparseDecodeParams& p,
                                            typename Traits::SharedStorage& smem, int problem,
                                            int split) {
  using namespace sparse_decode_detail;
  using kvcodec::Codec;
  constexpr int kV32 = static_cast<int>(Codec::kFP8_V32), kModel1 = static_cast<int>(Codec::kFP8_Model1);
  constexpr int kMX = static_cast<int>(Codec::kFP8_MX), kFP4 = static_cast<int>(Codec::kFP4);
  if constexpr (Traits::kPairSlots) {  // (the round slots in a CTA pair)
    if constexpr (Traits::kHeadDimQK == 576) {
      if (p.fill_codec == kV32) return produce_by_ring_pair<Traits, kV32>(p, smem, problem, split);
    } else {
      if (p.fill_codec == kModel1) {
        return produce_by_ring_pair<Traits, kModel1>(p, smem, problem, split);
      }
      if (p.fill_codec == kMX) return produce_by_ring_pair<Traits, kMX>(p, smem, problem, split);
      if (p.fill_codec == kFP4) return produce_by_ring_pair<Traits, kFP4>(p, smem, problem, split);
    }
    __trap();
  }
  if constexpr (Traits::kHeadDimQK == 576) {
    if (p.fill_codec == kV32) return produce_by_ring<Traits, kV32>(p, smem, problem, split);
  } else {
    if (p.fill_codec == kModel1) return produce_by_ring<Traits, kModel1>(p, smem, problem, split);
    if (p.fill_codec == kMX) return produce_by_ring<Traits, kMX>(p, smem, problem, split);
    if constexpr (!Traits::kFp16) {  // (fp4 never stages fp16: SM90 has no e2m1 conversion)
      if (p.fill_codec == kFP4) return produce_by_ring<Traits, kFP4>(p, smem, problem, split);
    }
  }
  __trap();  // (never: the host checks the format) a clear error rather than a hang
}

template <class Traits>
__global__ void __launch_bounds__(Traits::kNumThreads, 1)
    sparse_decode_kernel(const __grid_constant__ SparseDecodeParams params) {
  using namespace sparse_decode_detail;
  using Storage = typename Traits::SharedStorage;
  extern __shared__ __align__(1024) char smem_raw[];
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  Storage& smem =
      *reinterpret_cast<Storage*>(smem_raw + (((smem_base + 1023u) & ~1023u) - smem_base));
  const int m_block = blockIdx.x, split = blockIdx.y, problem = params.problem0 + blockIdx.z;
  const bool pair = params.pair;  // a 2-CTA cluster sharing each tile's decoding (pair.cuh)
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < Traits::kStages; ++s) {
      if constexpr (Traits::kSeesaw) {
        // Per part (kParts s + part; a half's parts alike): filled by the 4 producer warps; L0
        // is freed by WG0's warps alone, R1 by WG1's, R0 and L1 by both (consume, the seesaw).
        constexpr int kPerHalf = Traits::kParts / 2;
#pragma unroll
        for (int part = 0; part < Traits::kParts; ++part) {
          cutlass::arch::ClusterBarrier::init(&smem.full[Traits::kParts * s + part], 4);
          cutlass::arch::ClusterBarrier::init(&smem.empty[Traits::kParts * s + part],
                                              part / kPerHalf == s ? 4 : 8);
        }
      } else if constexpr (Traits::kRing) {
        // per round of the one stage: the 4 producer warps; the 8 compute warps
#pragma unroll
        for (int r = 0; r < Traits::kBarriers; ++r) {  // (the round slots: per slot)
          cutlass::arch::ClusterBarrier::init(&smem.full[r], 4 * Traits::kProducerWarpgroups);
          // (the slots in a CTA pair: both CTAs' compute warps)
          cutlass::arch::ClusterBarrier::init(&smem.empty[r], Traits::kPairSlots ? 16 : 8);
        }
      } else {
        // lane 0 of the 4 producer warps and of the 8 compute warps (of both CTAs of a pair)
        cutlass::arch::ClusterBarrier::init(&smem.full[s], 4);  // (a pair's peer: bytes, pair.cuh)
        cutlass::arch::ClusterBarrier::init(&smem.empty[s], pair ? 16 : 8);
      }
    }
    cutlass::arch::fence_barrier_init();
  }
  if (pair) {
    cluster_sync();  // the peer's barriers exist before anything arrives on them
  } else {
    __syncthreads();
  }
  // The combine grid may launch now; it waits for this grid to finish before reading partials.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);
  if (wg >= 2) {  // the producer warpgroup
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    if constexpr (Traits::kRing) {
      produce_ring<Traits>(params, smem, problem, split);
    } else if constexpr (Traits::kSeesaw) {
      produce_halves<Traits>(params, smem, problem, split);
    } else if (pair) {
      produce_quantised<Traits, true>(params, smem, problem, split);
    } else if (params.by_token) {
      produce_quantised<Traits, false>(params, smem, problem, split);
    } else {
      produce<Traits>(params, smem, problem, split);
    }
  } else if (wg == 1) {
    cutlass::arch::warpgroup_reg_alloc<Traits::kWg1Registers>();
    consume<Traits>(params, smem, 1, m_block, split, problem);
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kWg0Registers>();
    consume<Traits>(params, smem, 0, m_block, split, problem);
  }
  if (pair) cluster_sync();  // the peer may still arrive on this CTA's barriers until here
}

template <class Traits>
cudaError_t launch_sparse_decode_traits(const SparseDecodeParams& params, cudaStream_t stream) {
  auto kernel = sparse_decode_kernel<Traits>;
  if (const cudaError_t err = allow_dynamic_smem(kernel, Traits::kSmemBytes); err != cudaSuccess) {
    return err;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(params.m_blocks, params.num_splits,
                       min(params.problems - params.problem0, 65535));
  config.blockDim = dim3(Traits::kNumThreads);
  config.dynamicSmemBytes = Traits::kSmemBytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  if (params.pair) {  // m-blocks 2c and 2c + 1 as one cluster (pair.cuh)
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = 2;
    attribute[0].val.clusterDim.y = 1;
    attribute[0].val.clusterDim.z = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&config, kernel, params);
}

// The ring fill's kernel (params.ring; its own instantiations, instantiations/ring_*.cu).
template <int kHeadDimQK, bool kDense>
cudaError_t launch_sparse_decode_ring(const SparseDecodeParams& params, cudaStream_t stream) {
  if (params.ring == 2) {  // decoded into three round slots (traits.h kSlots)
    return launch_sparse_decode_traits<
        SparseDecodeTraits<kHeadDimQK, kDense, false, false, 2>>(params, stream);
  }
  if (params.ring == 3) {  // the slots with the keys staged as fp16 (traits.h kFp16)
    return launch_sparse_decode_traits<
        SparseDecodeTraits<kHeadDimQK, kDense, false, false, 3>>(params, stream);
  }
  if (params.ring == 4) {  // the slots decoded by two producer warpgroups (traits.h kRing_ 4)
    return launch_sparse_decode_traits<
        SparseDecodeTraits<kHeadDimQK, kDense, false, false, 4>>(params, stream);
  }
  if (params.ring == 5) {  // the slots in a CTA pair (traits.h kPairSlots; params.pair)
    return launch_sparse_decode_traits<
        SparseDecodeTraits<kHeadDimQK, kDense, false, false, 5>>(params, stream);
  }
  return launch_sparse_decode_traits<
      SparseDecodeTraits<kHeadDimQK, kDense, false, false, 1>>(params, stream);
}

// Compiled in instantiations/ring_*.cu only (a kernel per d_qk and mode, built in parallel).
extern template cudaError_t launch_sparse_decode_ring<576, false>(const SparseDecodeParams&, cudaStream_t);
extern template cudaError_t launch_sparse_decode_ring<576, true>(const SparseDecodeParams&, cudaStream_t);
extern template cudaError_t launch_sparse_decode_ring<512, false>(const SparseDecodeParams&, cudaStream_t);
extern template cudaError_t launch_sparse_decode_ring<512, true>(const SparseDecodeParams&, cudaStream_t);

// The seesaw order serves grids of bf16 keys by cp.async (params.seesaw, launch.cu); the ring
// fill, quantised keys of one format (params.ring).
template <int kHeadDimQK, bool kDense>
cudaError_t launch_sparse_decode_kernel(const SparseDecodeParams& params, cudaStream_t stream) {
  if (params.ring > 0) return launch_sparse_decode_ring<kHeadDimQK, kDense>(params, stream);
  if constexpr (!kDense) {
    if (params.seesaw && params.stagger) {
      return launch_sparse_decode_traits<SparseDecodeTraits<kHeadDimQK, false, true, true>>(
          params, stream);
    }
    if (params.seesaw) {
      return launch_sparse_decode_traits<SparseDecodeTraits<kHeadDimQK, false, true>>(params,
                                                                                       stream);
    }
  }
  return launch_sparse_decode_traits<SparseDecodeTraits<kHeadDimQK, kDense>>(params, stream);
}

}  // namespace openmla::cuda::sm90
