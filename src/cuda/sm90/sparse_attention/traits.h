// Compile-time choices of the SM90 sparse attention kernel (kernel.cuh; design: NOTES.md).
//
// A CTA serves 64 rows (query heads; in dense mode token-major (token, head) pairs) of one
// problem over a split of its key list, in tiles of 64 keys, with three warpgroups: the producer
// (WG2) fills a stage with a tile's keys as bf16; WG0 and WG1 compute in one of two orders
// (kSeesaw). Two stages. With kCluster 2, the CTAs of m-blocks 2c and 2c + 1 (which read the same
// keys) form a cluster and each producer decodes half of every tile into both CTAs' stages.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

#include "cuda/sm90/attention/mla_tiles.h"

namespace openmla::cuda::sm90 {

// kHeadDimQK_: 576 (fp8_v32 and bf16 caches) or 512 (fp8_model1, fp8_mx, fp4 and bf16).
// kDense_: keys through a block table, a request's query tokens packed into the rows.
// kCluster_: 1, or 2 (the crossover: each CTA decodes half of every quantised tile).
// kSeesaw_: the seesaw order (bf16 tiles only, one m-block; order_seesaw.cuh), else the
// standard order (order_standard.cuh).
template <int kHeadDimQK_, bool kDense_, int kCluster_, bool kSeesaw_ = false>
struct SparseTraits : attention::MlaTiles<cute::bfloat16_t, 64, 64, kHeadDimQK_, 256> {
  using Element = cute::bfloat16_t;
  static constexpr int kHeadDimQK = kHeadDimQK_;
  static constexpr bool kDense = kDense_;
  static constexpr int kCluster = kCluster_;
  static constexpr bool kSeesaw = kSeesaw_;
  static_assert(kHeadDimQK == 576 || kHeadDimQK == 512);
  static_assert(kCluster == 1 || kCluster == 2);
  static_assert(!kSeesaw || (kCluster == 1 && !kDense), "the seesaw serves bf16 sparse tiles");
  static constexpr int kHeadDimV = 512;
  static constexpr int kVHalfDims = 256;  // dims of O per compute warpgroup

  static constexpr int kBlockM = 64;  // rows per CTA: one wgmma M
  static constexpr int kBlockN = 64;  // keys per tile (one stage)
  // A tile is pieces of 64 keys x 64 dims (8 KB, 128 B rows, 128 B swizzle): wgmma reads K
  // (K-major) and V (MN-major) from them. Key k is row k of every piece.
  static constexpr int kPieceDims = 64;
  static constexpr int kNumPieces = kHeadDimQK / kPieceDims;  // 9 or 8
  static constexpr int kPieceBytes = kBlockN * kPieceDims * 2;
  static constexpr int kTileElems = kBlockN * kHeadDimQK;
  static constexpr int kStageBytes = kTileElems * 2;
  static constexpr int kStages = 2;
  // The bf16 bytes of the 32 keys (a round) one CTA of a cluster decodes into its peer's stage.
  static constexpr int kRoundBytes = 32 * kHeadDimQK * 2;
  // P (64 x 64 bf16, K-major, 128 B swizzle) crosses from WG0 to WG1. At d 576 it lives in the
  // stage's RoPE piece (dead once QK^T is done; Q and two stages leave no room for more), at
  // d 512 in buffers of its own.
  static constexpr bool kPInKTile = kNumPieces > 8;

  // Barriers: the standard order a full and an empty barrier a stage; the seesaw one a half
  // stage (L: dims 0-255, R: the rest).
  static constexpr int kBarriers = kSeesaw ? 2 * kStages : kStages;

  static constexpr int kNumThreads = 384;
  // setmaxnreg (a 384-thread CTA launches with 168 a thread: 504 per thread slot). The standard
  // order: WG0 holds S, P, half of O and Q's descriptors (the dense mode also its rows' limits);
  // WG1 half of O and the descriptors of its P V; the producer a key's raw quarter. Splits every
  // form compiles to without a spill (ptxas -v, CUDA 13): sparse 232 / 176 / 96 (240 / 168 / 96
  // spills at d 512), dense 240 / 168 / 96 (232 / 176 / 96 spills); 160 for WG1 spills both.
  // The seesaw: both compute warpgroups hold S, P and half of O (232), the producer copies (40).
  static constexpr int kWg0Registers = kSeesaw || !kDense ? 232 : 240;
  static constexpr int kWg1Registers = kSeesaw ? 232 : kDense ? 168 : 176;
  static constexpr int kProducerRegisters = kSeesaw ? 40 : 96;
  static_assert(kWg0Registers + kWg1Registers + kProducerRegisters <= 504);

  // WG1's P V with P from shared memory (the standard order): 64 x 256 x 16, both from smem.
  using TiledMmaPVss = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float,
                                 cute::Shape<cute::_64, cute::_256, cute::_64>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::MN>()));

  struct SharedStorage {
    alignas(1024) Element q[kBlockM * kHeadDimQK];
    alignas(1024) Element k[kStages][kTileElems];  // [stage][piece][64 keys][64 dims]
    // P of a stage at d 512 (the seesaw at d 576: stage 1's; stage 0's is in its RoPE piece).
    alignas(1024) Element p[kPInKTile ? 1 : kStages][kPInKTile && !kSeesaw ? 8 : kBlockM * kBlockN];
    // WG0 -> WG1: O's row factors of a tile, thread-major (the seesaw: both warpgroups' row
    // maxima [2][64] and WG1's row sums [64])
    float2 rescale[kSeesaw ? 1 : kStages][kSeesaw ? 96 : 128];
    float row_sum[kBlockM];  // WG0 -> WG1 in the epilogue (and the sink's lse)
    float row_lse[kBlockM];
    // Dense mode: each row's causal limit and (j << 16 | h), ~0 for padding rows.
    int row_limit[kDense ? kBlockM : 1];
    uint32_t row_code[kDense ? kBlockM : 1];
    // Per stage: bit j of word b is key 8 b + j valid (words: a cluster's peer writes its own
    // by st.async, whose smallest store is 4 bytes).
    alignas(16) uint32_t valid[kStages][8];
    // full: the producer filled it (4 warp arrivals; with a cluster one more, which expects the
    // peer's bytes); empty: the compute warps are done with it (8 warps; with a cluster both
    // CTAs' 16). The seesaw: per half stage.
    alignas(8) uint64_t full[kBarriers];
    uint64_t empty[kBarriers];
  };
  static constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage)) + 1024;
  static_assert(kSmemBytes <= 232448, "exceeds the 227 KB of shared memory a block may use");
};

}  // namespace openmla::cuda::sm90
