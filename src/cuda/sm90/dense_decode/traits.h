// Compile-time choices of the SM90 dense MLA decode kernel (DESIGN §2.1; NOTES.md beside this).
//
// A CTA serves 64 query rows (row = token * group + head-in-group, group = h_q / h_kv) of one
// (request, kv head) and walks its schedule range of the request's keys in 64-key tiles.
// Three warpgroups: WG0 and WG1 compute (each owns half of the 64 x 512 fp32 output, 128
// registers a thread), WG2 is the TMA producer. Each 64-key tile is two 32-key halves (A, B) in
// FlashMLA's "seesaw": WG0 computes S = Q K_A^T and its softmax while WG1 computes Q K_B^T; each
// publishes its P (bf16) and row statistics in shared memory and both multiply their half of V.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/arch/mma_sm90.hpp>

namespace openmla::cuda::sm90 {

template <typename Element_, int kHeadDimQK_>
struct DenseDecodeTraits {
  using Element = Element_;  // cute::bfloat16_t or cute::half_t
  static constexpr int kHeadDimQK = kHeadDimQK_;
  static constexpr int kHeadDimV = 512;
  static_assert(kHeadDimQK == 576 || kHeadDimQK == 512);

  static constexpr int kBlockM = 64;  // query rows per CTA: one wgmma M
  static constexpr int kBlockN = 64;  // keys per tile (one pipeline stage)
  // A tile is two 32-key halves: WG0 computes S for half 0 and WG1 for half 1 at the same time
  // (the seesaw runs over the halves of one tile), so a tile is done when both PVs are and the
  // next tile loads into the other stage meanwhile.
  static constexpr int kHalfN = kBlockN / 2;
  // A half is stored as pieces of 32 keys x 64 dims (4 KB, 128 B rows): one TMA box each, one
  // transaction barrier each, so QK^T starts on the first piece that lands (fine-grained TMA).
  static constexpr int kPieceDims = 64;
  static constexpr int kNumPieces = kHeadDimQK / kPieceDims;  // 9 (d 576) or 8 (d 512)
  static constexpr int kNumVPieces = kHeadDimV / kPieceDims;  // 8
  // Barriers per (stage, half): groups of 3 pieces. Per piece (9 waits and wgmma fences per QK^T)
  // cost more than streaming the first piece early gains once the next tile loads during this one.
  static constexpr int kPiecesPerGroup = 3;
  static constexpr int kPieceGroups = (kNumPieces + kPiecesPerGroup - 1) / kPiecesPerGroup;
  static constexpr int kPieceElems = kHalfN * kPieceDims;     // 2048
  static constexpr int kPieceBytes = kPieceElems * 2;         // 4 KB
  static constexpr int kHalfElems = kHalfN * kHeadDimQK;
  static constexpr int kTileElems = kBlockN * kHeadDimQK;
  static constexpr int kQPieceElems = kBlockM * kPieceDims;   // Q pieces: 64 rows x 64 dims
  // Q (72 KB) + 2 K tiles (144 KB) leave no room for P buffers at d 576 (227 KB limit), but
  // a half's RoPE piece (dims 512..575) is dead once that half's QK^T is done and is exactly the
  // size of its P (64 rows x 32 keys x 2 B): P lives there. At d 512 P gets buffers of its own.
  static constexpr bool kPInKTile = kNumPieces > kNumVPieces;
  static constexpr int kPElems = kBlockM * kHalfN;
  static constexpr int kStages = 2;

  static constexpr int kNumMmaThreads = 256;  // WG0 + WG1
  static constexpr int kNumThreads = 384;     // + producer WG2
  static constexpr int kVHalfDims = kHeadDimV / 2;  // 256 output dims per compute warpgroup
  // setmaxnreg: 2 x 232 + 40 = 504 registers per thread slot = the 384 x 168 the CTA launches
  // with. The producer's request/tile walk spills at 24; the compute warpgroups fit in 232.
  static constexpr int kMmaRegisters = 232;
  static constexpr int kProducerRegisters = 40;

  // Q (rows, dims), K-major 128 B swizzle: piece p is the 8 KB block at p * kQPieceElems.
  using SmemLayoutQ = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_K_SW128_Atom<Element>{},
      cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDimQK>>{}));
  // A K half (keys, dims), K-major 128 B swizzle: piece p is the 4 KB block at p * kPieceElems.
  using SmemLayoutKHalf = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_K_SW128_Atom<Element>{},
      cute::Shape<cute::Int<kHalfN>, cute::Int<kHeadDimQK>>{}));
  // P of a half (rows, keys): 64 B rows, K-major 64 B swizzle, the A operand of P V.
  using SmemLayoutP = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_K_SW64_Atom<Element>{},
      cute::Shape<cute::Int<kBlockM>, cute::Int<kHalfN>>{}));
  // V of a half, one warpgroup's 256 dims (dims, keys), over the same bytes as four of the
  // half's pieces: dims contiguous (MN-major B); atoms run along keys first (8 keys x 128 B) and
  // then along dims (one 4 KB piece per 64 dims): the K half's layout read transposed.
  using SmemLayoutVHalf = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_MN_SW128_Atom<Element>{},
      cute::Shape<cute::Int<kVHalfDims>, cute::Int<kHalfN>>{}, cute::Step<cute::_2, cute::_1>{}));

  // S_half = Q K_half^T: 64 x 32 x 16 wgmma, both operands K-major from shared memory.
  using TiledMmaQK = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float,
                                 cute::Shape<cute::Int<kBlockM>, cute::Int<kHalfN>, cute::_64>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::K>()));
  // O_half += P V_half: 64 x 256 x 16 wgmma, P K-major, V MN-major.
  using TiledMmaPV = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float,
                                 cute::Shape<cute::Int<kBlockM>, cute::Int<kVHalfDims>, cute::_32>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::MN>()));

  struct SharedStorage {
    // 128 B swizzling repeats every 1024 B: every operand starts on a 1024 B boundary.
    alignas(1024) Element q[kBlockM * kHeadDimQK];
    alignas(1024) Element k[kStages][kTileElems];  // [stage][half][piece][32 keys][64 dims]
    alignas(1024) Element p[kPInKTile ? 1 : kStages * 2][kPInKTile ? 8 : kPElems];
    // Row statistics published with each half's P: the running max after that half and the
    // factor the output is rescaled by before adding that half's P V.
    alignas(16) float row_max[kStages][2][kBlockM];
    float row_scale[kStages][2][kBlockM];
    float row_sum[2][kBlockM];  // per compute warpgroup, exchanged in the epilogue
    alignas(8) uint64_t full[kStages][2][kPieceGroups];  // TMA landed, per (stage, half, group)
    uint64_t empty[kStages];                           // both compute warpgroups done with a tile
  };
  static constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage)) + 1024;  // + align
  static_assert(kSmemBytes <= 232448, "exceeds the 227 KB of shared memory a block may use");
};

}  // namespace openmla::cuda::sm90
