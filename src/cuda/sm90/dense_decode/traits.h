// Compile-time choices of the SM90 dense MLA decode kernel (docs/semantics.md; NOTES.md beside this).
//
// A CTA serves 64 query rows (row = token * group + head-in-group, group = h_q / h_kv) of one
// (request, kv head) and walks its schedule range of the request's keys in pairs of 64-key
// tiles. Three warpgroups: WG0 and WG1 compute (each owns half of the 64 x 512 fp32 output, 128
// registers a thread), WG2 is the TMA producer. FlashMLA's "seesaw" over a pair: WG0 computes
// S0 = Q K0^T and its softmax while WG1 computes S1 = Q K1^T; each keeps its own P in registers
// (the A operand of a register-sourced wgmma) and hands a copy to the other through shared memory;
// both multiply their half of V0 and V1.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

#include "cuda/sm90/attention/mla_tiles.h"

namespace openmla::cuda::sm90 {

// The smem layouts and wgmma atoms (SmemLayoutQ/K/V/P, TiledMmaQK/PV) are the shared MLA tiles
// (attention/mla_tiles.h): 64 query rows, 64-key tiles, 256 V dims per compute warpgroup.
template <typename Element_, int kHeadDimQK_>
struct DenseDecodeTraits : attention::MlaTiles<Element_, 64, 64, kHeadDimQK_, 256> {
  using Element = Element_;  // cute::bfloat16_t or cute::half_t
  static constexpr int kHeadDimQK = kHeadDimQK_;
  static constexpr int kHeadDimV = 512;
  static_assert(kHeadDimQK == 576 || kHeadDimQK == 512);

  static constexpr int kBlockM = 64;  // query rows per CTA: one wgmma M
  static constexpr int kBlockN = 64;  // keys per tile (one pipeline stage); QK^T is m64n64k16:
                                      // 4 KB of smem operands per 32-clock step, the 128 B/clk
                                      // smem rate exactly (n32 needed 1.5x that: v2-v4)
  // A tile is stored as pieces of 64 keys x 64 dims (8 KB, 128 B rows, one TMA box each), each
  // with its own transaction barrier, so QK^T starts on the first piece that lands. They are
  // handed back in three parts (a release barrier each): V left (pieces 0-3, dims 0-255, WG0's
  // PV), V right (pieces 4-7, WG1's PV) and RoPE (piece 8, d 576 only: free after QK^T).
  static constexpr int kPieceDims = 64;
  static constexpr int kNumPieces = kHeadDimQK / kPieceDims;  // 9 (d 576) or 8 (d 512)
  static constexpr int kNumVPieces = kHeadDimV / kPieceDims;  // 8
  static constexpr int kPartL = 0, kPartR = 1, kPartRope = 2;
  static constexpr int kNumParts = kNumPieces > kNumVPieces ? 3 : 2;
  // The order in which a stage's parts are refilled and then read by QK^T: the order they are
  // handed back (NOTES.md, idea 12). Stage 0: RoPE (WG1 has read P0 from it), V left (WG0's PV on
  // the tile, issued right after its softmax), V right (WG1's PV, run under its next QK^T).
  // Stage 1: RoPE (WG0 has read P1), V right (WG1's PV right after its softmax), V left (WG0's
  // PV, run under its next QK^T).
  static constexpr int part_order(int stage, int i) {
    return kNumParts == 3 ? (stage == 0 ? (i == 0 ? kPartRope : i == 1 ? kPartL : kPartR)
                                        : (i == 0 ? kPartRope : i == 1 ? kPartR : kPartL))
                          : (stage == 0 ? (i == 0 ? kPartL : kPartR) : (i == 0 ? kPartR : kPartL));
  }
  static constexpr int part_first_piece(int part) { return part * 4; }  // L 0-3, R 4-7, RoPE 8
  static constexpr int part_pieces(int part) { return part == kPartRope ? kNumPieces - 8 : 4; }
  static constexpr int kPieceElems = kBlockN * kPieceDims;  // 4096
  static constexpr int kPieceBytes = kPieceElems * 2;       // 8 KB
  static constexpr int kTileElems = kBlockN * kHeadDimQK;
  static constexpr int kQPieceElems = kBlockM * kPieceDims;  // Q pieces: 64 rows x 64 dims
  // P (64 rows x 64 keys, 8 KB as Element) crosses between the warpgroups thread-major (thread t
  // of WG1 holds the same accumulator rows/columns as thread t of WG0). Q (72 KB) + 2 tiles
  // (144 KB) leave no room for P buffers at d 576 (227 KB), but a tile's RoPE piece is dead once
  // its QK^T is done and is exactly P's size: P lives there. At d 512 P gets buffers of its own.
  static constexpr bool kPInKTile = kNumPieces > kNumVPieces;
  static constexpr int kPBytes = kBlockM * kBlockN * 2;
  static_assert(kPBytes == kPieceBytes);
  static constexpr int kStages = 2;  // the two tiles of a pair (WG0 scores stage 0, WG1 stage 1)

  static constexpr int kNumMmaThreads = 256;  // WG0 + WG1
  static constexpr int kNumThreads = 384;     // + producer WG2 (one warp per stage)
  static constexpr int kVHalfDims = kHeadDimV / 2;  // 256 output dims per compute warpgroup
  // setmaxnreg: 2 x 232 + 40 = 504 registers per thread slot = the 384 x 168 the CTA launches
  // with. The producer's request/tile walk spills at 24; the compute warpgroups fit in 232.
  static constexpr int kMmaRegisters = 232;
  static constexpr int kProducerRegisters = 40;

  static_assert(kBlockM == 64 && kBlockN == 64 && kVHalfDims == 256,
                "the shape of the MlaTiles base");

  struct SharedStorage {
    // 128 B swizzling repeats every 1024 B: every operand starts on a 1024 B boundary.
    alignas(1024) Element q[kBlockM * kHeadDimQK];
    alignas(1024) Element k[kStages][kTileElems];  // [stage][piece][64 keys][64 dims]
    alignas(16) Element p[kPInKTile ? 1 : kStages][kPInKTile ? 8 : kBlockM * kBlockN];
    // Thread-major row statistics: WG0's running max after tile 0 (2 rows a thread), WG1's
    // running max after tile 1 and the factor WG0 rescales by (m1[2], scale1[2]).
    float2 max0[128];
    float4 stats1[128];
    float row_sum[2][kBlockM];  // per compute warpgroup, exchanged in the epilogue
    // The CTA's schedule row, indexed by core::ScheduleField {begin_request, begin_token,
    // end_request, end_token, begin_split}, read where it is used: held in registers across the
    // walk, it was spilled.
    int range[5];
    alignas(8) uint64_t full[kStages][kNumPieces];  // TMA landed, per (stage, piece)
    uint64_t empty[kStages][kNumParts];             // the part's last reader is done
    uint64_t q_full;  // the request's Q landed (TMA path, DenseDecodeParams::q_tma)
  };
  static constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage)) + 1024;  // + align
  static_assert(kSmemBytes <= 232448, "exceeds the 227 KB of shared memory a block may use");
};

}  // namespace openmla::cuda::sm90
