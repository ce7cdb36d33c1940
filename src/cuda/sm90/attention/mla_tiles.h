// The shared-memory layouts and wgmma atoms of MLA's two products on SM90, for every family that
// computes S = Q K^T and O = P V over 64-key tiles of the cached latent (dense and sparse decode,
// sparse prefill): Q and K tiles K-major with the 128 B swizzle (64-dim pieces of 8 KB), V read
// from the same bytes transposed (MN-major), P as the register A operand of P V.
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/arch/mma_sm90.hpp>

namespace openmla::cuda::sm90::attention {

template <typename Element, int kBlockM, int kBlockN, int kHeadDimQK, int kVDims>
struct MlaTiles {
  // Q (rows, dims) and a K tile (keys, dims): piece p is the 8 KB block at p * 64 * 64 elements;
  // row r of a piece is bytes [128 r, 128 r + 128) (chunks permuted inside).
  using SmemLayoutQ = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_K_SW128_Atom<Element>{},
      cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDimQK>>{}));
  using SmemLayoutK = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_K_SW128_Atom<Element>{},
      cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDimQK>>{}));
  // V of a tile, kVDims of its dims (dims, keys), over the same bytes as kVDims / 64 of the
  // tile's pieces: dims contiguous (MN-major B); atoms run along keys first (8 keys x 128 B) and
  // then along dims (one 8 KB piece per 64 dims): the K tile's layout read transposed.
  using SmemLayoutV = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_MN_SW128_Atom<Element>{},
      cute::Shape<cute::Int<kVDims>, cute::Int<kBlockN>>{}, cute::Step<cute::_2, cute::_1>{}));
  // Only its shape matters: the register fragment of P as the A operand of P V.
  using SmemLayoutP = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_K_SW128_Atom<Element>{},
      cute::Shape<cute::Int<kBlockM>, cute::Int<kBlockN>>{}));

  // S = Q K^T: 64 x 64 x 16 wgmma, both operands K-major from shared memory.
  using TiledMmaQK = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float,
                                 cute::Shape<cute::Int<kBlockM>, cute::Int<kBlockN>, cute::_64>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::K>()));
  // O += P V: 64 x kVDims x 16 wgmma, P from registers (its accumulator order is the A
  // fragment's order), V MN-major from shared memory.
  using TiledMmaPV = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float,
                                 cute::Shape<cute::Int<kBlockM>, cute::Int<kVDims>, cute::_64>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::MN>()));
};

}  // namespace openmla::cuda::sm90::attention
