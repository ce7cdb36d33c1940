// Compile-time choices of the SM90 sparse MLA decode kernel (docs/semantics.md; NOTES.md beside this).
//
// A CTA serves up to 64 query heads of one query token (one m-block; h_q 128 is two CTAs) over
// one split of that token's key list, in tiles of 64 keys. Three warpgroups: WG2 gathers the
// tile's keys through the index list and dequantises them into bf16 shared memory (two stages);
// WG0 computes S = Q K^T, the online softmax and O_L += P V_L (dims 0-255); WG1 takes P through
// shared memory and computes O_R += P V_R (dims 256-511). Heads past h_q are zero rows of the
// 64-row wgmma (h_q 8-32 pad the MMA, never the gather or the dequantisation, which are per key).
#pragma once

#include <cstdint>
#include <type_traits>

#include <cute/tensor.hpp>

#include "cuda/sm90/attention/mla_tiles.h"

namespace openmla::cuda::sm90 {

// The smem layouts and wgmma atoms (SmemLayoutQ/K/V/P, TiledMmaQK/PV) are the shared MLA tiles
// (attention/mla_tiles.h): 64 heads, 64-key tiles, 256 V dims per compute warpgroup.
// kDense_: the dense mode (params.h), keys through a block table, a request's s_q query tokens
// packed into the rows: its own instantiation, so sparse decode's registers are untouched.
// kSeesaw_: the compute warpgroups in seesaw order (kernel.cuh consume_seesaw; bf16 tiles by
// cp.async only, the sparse mode): each computes S for alternate tiles and both halves' P V, so
// both hold S, P and half of O, and the producer, copies only, needs few registers.
// kStagger_: the seesaw with staggered maxima (kernel.cuh consume; sparse prefill's order).
// kRing_: 1 the ring fill (fill_ring.cuh produce_by_ring): quantised
// keys' raw bytes by cp.async into a ring of rounds (32 keys) in shared memory, decoded from there
// into ONE bf16 stage whose two rounds have barriers of their own (kernel.cuh: S = Q K^T by
// round); 2 the same decoded into THREE round slots (NOTES.md),
// so the decode of round n + 2 runs while the compute warpgroups hold rounds n and n + 1; 3 the
// round slots with the keys staged as fp16 (SparseTuning::fp16, the dense mode; NOTES.md: the
// fp8 formats' codes by one cvt a pair, each key and Q's rows scaled by powers of two into fp16's
// range, S and P scaled back in fp32; at d 576 the RoPE piece stays bf16); 0 not.
template <int kHeadDimQK_, bool kDense_ = false, bool kSeesaw_ = false, bool kStagger_ = false,
          int kRing_ = 0, bool kFused_ = false>
struct SparseDecodeTraits
    : attention::MlaTiles<std::conditional_t<kRing_ == 3, cute::half_t, cute::bfloat16_t>, 64, 64,
                          kHeadDimQK_, 256> {
  using Element = cute::bfloat16_t;  // the output's type, and the keys' in every form but kFp16
  // The MMAs' operand type of Q, K and P: fp16 with kFp16 (but d 576's RoPE piece: bf16).
  static constexpr bool kFp16 = kRing_ == 3;
  using KElement = std::conditional_t<kFp16, cute::half_t, cute::bfloat16_t>;
  static constexpr int kHeadDimQK = kHeadDimQK_;
  static constexpr bool kDense = kDense_;
  static constexpr bool kSeesaw = kSeesaw_;
  static constexpr bool kStagger = kStagger_;
  static_assert(kSeesaw || !kStagger, "the stagger is an order of the seesaw");
  // kFused_: the fused V4 attention's steps (params.h SparseFusedParams), in instantiations of
  // their own (instantiations/fused_d512_sm90.cu) so the plain kernels carry no fused code: d 512
  // sparse mode, quantised caches (standard order, round slots) and bf16 kv (the staggered
  // seesaw; launch.cu never gives a fused launch the plain seesaw, which has no registers left).
  static constexpr bool kFused = kFused_;
  static_assert(!kFused || (kHeadDimQK_ == 512 && !kDense_ && (!kSeesaw_ || kStagger_)),
                "the fused steps exist for the d 512 sparse forms a fused call runs");
  static constexpr bool kRing = kRing_ > 0;
  static constexpr bool kSlots = kRing_ >= 2;
  static_assert(kRing_ >= 0 && kRing_ <= 3);
  static_assert(!(kRing && kSeesaw), "the ring fill serves quantised keys, the seesaw bf16 ones");
  // A stage's buffers with barriers of their own: the seesaw's halves (L: dims 0-255, R: the
  // rest).
  static constexpr int kParts = 2;
  static_assert(!(kDense && kSeesaw), "the seesaw order serves the sparse mode only");
  static constexpr int kHeadDimV = 512;
  static_assert(kHeadDimQK == 576 || kHeadDimQK == 512);

  static constexpr int kBlockM = 64;  // heads per CTA: one wgmma M
  static constexpr int kBlockN = 64;  // keys per tile (one stage)
  // A tile is stored as pieces of 64 keys x 64 dims (8 KB, 128 B rows, 128 B swizzle), the
  // layout wgmma reads K (K-major) and V (MN-major) from.
  static constexpr int kPieceDims = 64;
  static constexpr int kNumPieces = kHeadDimQK / kPieceDims;  // 9 or 8
  static constexpr int kPieceElems = kBlockN * kPieceDims;
  static constexpr int kPieceBytes = kPieceElems * 2;
  static constexpr int kTileElems = kBlockN * kHeadDimQK;
  static constexpr int kStageBytes = kTileElems * 2;
  static constexpr int kStages = kRing ? 1 : 2;
  // The round slots (kSlots): slot s holds a round's 32 keys as 9 (8) pieces of 32 rows x 64
  // dims (4 KB each, the stage's layout with half its rows), at s * kSlotBytes of k[0].
  static constexpr int kSlotKeys = 32;
  static constexpr int kSlotElems = kSlotKeys * kHeadDimQK;
  static constexpr int kSlotBytes = kSlotElems * 2;
  static constexpr int kSlotPieceBytes = kSlotKeys * 128;
  static constexpr int kStageElems = kSlots ? 3 * kSlotElems : kTileElems;
  // The ring fill: a round is 32 keys; a key's raw record (data, scales, RoPE) is at most 704 B
  // (fp8_v32, fp8_model1; a stride of 64 mod 128 B, so the 2 keys x 4 quarters of a quarter-warp
  // read 8 different 16 B bank groups). Three such rounds at d 576 (Q and the stage take the
  // rest), four at d 512 (227 KB exactly in the dense mode); fp4's 320 B records: eight. With
  // the round slots two (the third slot takes the room).
  static constexpr int kRingRoundKeys = 32;
  static constexpr int kRingBytes =
      kRing ? (kSlots ? 2 : kHeadDimQK == 576 ? 3 : 4) * kRingRoundKeys * 704 : 16;
  // The ring's S = Q K^T by round: a round's keys are rows 32 r .. 32 r + 31 of every piece
  // (the K tile's layout with 32 rows and the same 8 KB piece stride; a slot's pieces are 4 KB
  // apart), 64 x 32 x 16 wgmma.
  using SmemLayoutKRound = decltype(cute::composition(
      cute::Swizzle<3, 4, 3>{}, cute::smem_ptr_flag_bits<16>{},
      cute::Layout<cute::Shape<cute::Shape<cute::_8, cute::_4>,
                               cute::Shape<cute::_64, cute::Int<kHeadDimQK / 64>>>,
                   cute::Stride<cute::Stride<cute::_64, cute::_512>,
                                cute::Stride<cute::_1, cute::Int<kSlots ? 2048 : 4096>>>>{}));
  // A slot's V for a warpgroup's P V: 256 dims x 32 keys, MN-major, atoms along keys first
  // (attention/mla_tiles.h SmemLayoutV with 32 keys: one 4 KB piece per 64 dims).
  using SmemLayoutVSlot = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_MN_SW128_Atom<cute::bfloat16_t>{}, cute::Shape<cute::_256, cute::_32>{},
      cute::Step<cute::_2, cute::_1>{}));
  using TiledMmaQKRound = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<KElement, KElement, float,
                                 cute::Shape<cute::_64, cute::_32, cute::_64>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::K>()));
  // kFp16 at d 576: the RoPE piece's k-blocks (32-35) by bf16 wgmma into the same S.
  using TiledMmaQKRoundBf16 = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float,
                                 cute::Shape<cute::_64, cute::_32, cute::_64>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::K>()));
  static constexpr bool kRopeBf16 = kFp16 && kHeadDimQK == 576;
  // Full / empty barriers: per stage, per part of a stage (the seesaw) or per round (the ring).
  static constexpr int kBarriers = kSeesaw ? kParts * kStages : kSlots ? 3 : kRing ? 2 : kStages;
  // P (64 x 64 bf16) crosses from WG0 to WG1. At d 576 it lives in the stage's RoPE piece (dead
  // once QK^T is done; Q + two tiles leave no room for more), at d 512 in buffers of its own.
  static constexpr bool kPInKTile = kNumPieces > 8;

  static constexpr int kNumThreads = 384;
  static constexpr int kVHalfDims = kHeadDimV / 2;
  // setmaxnreg: WG0 (S, P and half of O) 232, WG1 (half of O and P) 176, the producer 96:
  // 504 per thread slot = the 384 x 168 the CTA launches with. The dense mode's WG0 keeps its
  // problem's row bookkeeping too and spills at 232: 240, with the producer at 88 (no spill).
  // The seesaw order: 216 + 216 + 72.
  // The ring's WG0 holds Q's descriptors of the round-by-round QK^T too: 240 as the dense
  // mode's (its producer, decoding from shared memory, fits 88).
  // kFp16: WG0 also scales S and P by the keys' exponents: 256, its producer 72.
  static constexpr int kWg0Registers =
      kSeesaw ? 232 : kFp16 ? 256 : kDense || kRing ? 240 : 232;
  static constexpr int kWg1Registers = kSeesaw ? 232 : 176;
  static constexpr int kProducerRegisters =
      kSeesaw ? 40 : kFp16 ? 72 : kDense || kRing ? 88 : 96;
  // Keys a producer warp loads before it decodes them (each lane holds <= 10 words a key).
  static constexpr int kKeysPerWarp = kBlockN / 4;  // 16
  static constexpr int kLoadBatch = 4;

  static_assert(kBlockM == 64 && kBlockN == 64 && kVHalfDims == 256,
                "the shape of the MlaTiles base");

  struct SharedStorage {
    alignas(1024) Element q[kBlockM * kHeadDimQK];
    alignas(1024) Element k[kStages][kStageElems];  // [stage][piece][64 keys][64 dims]
    // The seesaw order at d 576: stage 0's P in its RoPE piece, stage 1's here.
    alignas(16) Element p[kPInKTile ? 1 : kStages][kPInKTile && !kSeesaw ? 8 : kBlockM * kBlockN];
    // WG0 -> WG1: O's row factors of the tile, thread-major (the seesaw order: both warpgroups'
    // tile row maxima [wg][64] and WG1's row sums [64])
    float2 rescale[kSeesaw ? 1 : kStages][kSeesaw ? 96 : 128];
    float row_sum[kBlockM];        // WG0 -> WG1 in the epilogue
    // Dense mode: each row's causal limit (inside WG0) and (j << 16 | h), ~0 for padding rows.
    int row_limit[kDense ? kBlockM : 1];
    uint32_t row_code[kDense ? kBlockM : 1];
    // per stage: bit j of word b = key 8 b + j is valid (words, so a CTA pair's peer can write
    // its own with st.async, whose smallest store is 4 bytes)
    // (the round slots: words 4 s .. 4 s + 3 for slot s, keys 8 w .. 8 w + 7 of its round)
    alignas(16) uint32_t valid[kStages][kSlots ? 12 : 8];
    // the producer filled the stage (4 warp arrivals; with a CTA pair, also the peer's bytes)
    // (the seesaw order: per part, kParts stage + part, fill_rows.cuh produce_halves)
    // (the ring: per round of the one stage, produce_by_ring)
    alignas(8) uint64_t full[kBarriers];
    // the compute warpgroups are done with it (8 warps; 16 with a CTA pair: both CTAs' warps)
    uint64_t empty[kBarriers];
    // the ring fill's raw records (fill_ring.cuh produce_by_ring)
    alignas(kRing ? 128 : 16) uint8_t ring[kRingBytes];
    // kFp16: each key's exponent e (its fp16 row is the key times 2^-e), per slot and key of the
    // round, written by the producer with the slot; O's exponent, per WG0 warp (the epilogue's,
    // WG0 -> WG1: warp 0's).
    int8_t key_exp[kFp16 ? 3 * 32 : 1];
    int o_exp[4];
    // The fused op (kFused): the token's cos/sin row (cos in [0, 32), sin after), loaded by WG0
    // with Q, read by Q's RoPE and by WG1's output RoPE; fused_bad: its position is outside the
    // cache (fused_q.cuh).
    float fused_cs[kFused ? 64 : 1];
    int fused_bad;
  };
  static constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage)) + 1024;
  static_assert(kSmemBytes <= 232448, "exceeds the 227 KB of shared memory a block may use");
};

}  // namespace openmla::cuda::sm90
