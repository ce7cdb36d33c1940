// Tile sizes, shared-memory layouts and wgmma tilings of the SM90 dense MHA prefill backward
// main kernel (NOTES.md). One CTA: a block of kBlockN keys of one kv head, two compute
// warpgroups (256 threads), looping over blocks of kBlockM query tokens of every query head of
// the kv head's group.
#pragma once

#include <cstddef>

#include <cute/tensor.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

namespace openmla::cuda::sm90::mha_bwd {

template <class Element_, int kDqk_>
struct BwdTraits {
  using Element = Element_;
  static constexpr int kDqk = kDqk_;
  static constexpr int kDv = 128;
  // Keys a CTA. d 128: 128, the warpgroups split the keys (64 each: the M of S^T, dK, dV).
  // d 192: 64, both warpgroups on the same keys, splitting the N of S^T (queries), dK, dV (the
  // head dims): dK's 64 x 192 and dV's 64 x 128 accumulators are 80 registers a thread, where
  // 128 keys would need 160 and leave too few for S, dP, dQ and addresses (spills).
  static constexpr int kBlockN = kDqk_ == 128 ? 128 : 64;
  static constexpr int kWgAlongKeys = kBlockN / 64;  // 2: split keys; 1: split N
  static constexpr int kBlockM = 64;   // query tokens an iteration
  static constexpr int kThreads = 256;
  static_assert(kDqk == 128 || kDqk == 192, "d_qk 128 or 192");

  // --- shared memory (all K-major as stored: the head dim contiguous; 1024 B aligned) ---------
  // The widest swizzle whose atom (64, 32 or 16 elements along the contiguous dim) divides
  // `w`: every MN-major (transposed) view must split at a warpgroup's slice of its MN extent.
  template <int w>
  using Atom = std::conditional_t<
      w % 64 == 0, cute::GMMA::Layout_K_SW128_Atom<Element>,
      std::conditional_t<w % 32 == 0, cute::GMMA::Layout_K_SW64_Atom<Element>,
                         cute::GMMA::Layout_K_SW32_Atom<Element>>>;
  // Q^T's slice a warpgroup (dK's N), K^T's (dQ's N: half of d), dO^T's (dV's N).
  using AtomQ = Atom<kDqk * kWgAlongKeys / 2>;
  using AtomK = Atom<kDqk / 2>;
  using AtomDO = Atom<kDv * kWgAlongKeys / 2>;
  using Atom128 = cute::GMMA::Layout_K_SW128_Atom<Element>;
  using LayoutQ = decltype(cute::tile_to_shape(
      AtomQ{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kDqk>>{}));
  using LayoutDO = decltype(cute::tile_to_shape(
      AtomDO{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kDv>>{}));
  using LayoutK = decltype(cute::tile_to_shape(
      AtomK{}, cute::Shape<cute::Int<kBlockN>, cute::Int<kDqk>>{}));
  using LayoutV = decltype(cute::tile_to_shape(
      Atom128{}, cute::Shape<cute::Int<kBlockN>, cute::Int<kDv>>{}));
  // P and dS as (query, key), key contiguous: dQ's A operand (dS), and seen transposed,
  // dV's and dK's (P^T, dS^T).
  using LayoutDS = decltype(cute::tile_to_shape(
      Atom128{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kBlockN>>{}));
  // Transposed views of the same bytes (the view, not the memory, is transposed): element (x, y)
  // of the view is element (y, x) of the stored tile, read MN-major by wgmma. Built as native
  // MN-major atoms of the stored atom's width, running along the stored rows first (Step<2, 1>),
  // as attention/mla_tiles.h builds V; tests/cuda_host/test_mha_bwd_layouts.cu checks every
  // element against the stored tile.
  template <int w>
  using AtomMN = std::conditional_t<
      w % 64 == 0, cute::GMMA::Layout_MN_SW128_Atom<Element>,
      std::conditional_t<w % 32 == 0, cute::GMMA::Layout_MN_SW64_Atom<Element>,
                         cute::GMMA::Layout_MN_SW32_Atom<Element>>>;
  template <class AtomT, int kRowsT, int kColsT>
  using Transposed = decltype(cute::tile_to_shape(
      AtomT{}, cute::Shape<cute::Int<kRowsT>, cute::Int<kColsT>>{}, cute::Step<cute::_2, cute::_1>{}));
  using LayoutQt = Transposed<AtomMN<kDqk * kWgAlongKeys / 2>, kDqk, kBlockM>;
  using LayoutDOt = Transposed<AtomMN<kDv * kWgAlongKeys / 2>, kDv, kBlockM>;
  using LayoutKt = Transposed<AtomMN<kDqk / 2>, kDqk, kBlockN>;
  using LayoutDSt = Transposed<cute::GMMA::Layout_MN_SW128_Atom<Element>, kBlockN, kBlockM>;

  // Byte offsets of the regions (Q and dO double-buffered).
  static constexpr size_t kBytesQ = size_t(kBlockM) * kDqk * 2;
  static constexpr size_t kBytesDO = size_t(kBlockM) * kDv * 2;
  static constexpr size_t kOffK = 0;
  static constexpr size_t kOffV = kOffK + size_t(kBlockN) * kDqk * 2;
  static constexpr size_t kOffQ = kOffV + size_t(kBlockN) * kDv * 2;
  static constexpr size_t kOffDO = kOffQ + 2 * kBytesQ;
  static constexpr size_t kOffDS = kOffDO + 2 * kBytesDO;
  static constexpr size_t kOffP = kOffDS + size_t(kBlockM) * kBlockN * 2;
  static constexpr size_t kOffLse = kOffP + size_t(kBlockM) * kBlockN * 2;  // float [2][64]
  static constexpr size_t kOffDelta = kOffLse + 2 * kBlockM * 4;             // float [2][64]
  static constexpr size_t kSmemBytes = kOffDelta + 2 * kBlockM * 4;
  static_assert(kOffV % 1024 == 0 && kOffQ % 1024 == 0 && kOffDO % 1024 == 0 &&
                kOffDS % 1024 == 0 && kOffP % 1024 == 0 && kBytesQ % 1024 == 0 && kBytesDO % 1024 == 0);
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of an SM90 CTA");

  // --- wgmma tilings (thread slice = threadIdx.x, 0..255) -------------------------------------
  // How the two warpgroups tile S^T, dP^T, dK, dV: along M (keys) or along N.
  using WgLayoutKV =
      cute::Layout<cute::Shape<cute::Int<kWgAlongKeys>, cute::Int<2 / kWgAlongKeys>, cute::_1>>;
  // S^T = K Q^T and dP^T = V dO^T: M = kBlockN keys, N = 64 queries.
  using MmaSdP = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<
          Element, Element, float,
          cute::Shape<cute::_64, cute::Int<kBlockM * kWgAlongKeys / 2>, cute::_64>,
          cute::GMMA::Major::K, cute::GMMA::Major::K>(),
      WgLayoutKV{}));
  // dV += P^T dO (N = d_v) and dK += dS^T Q (N = d_qk): M = kBlockN keys, tiled as S^T, K = 64
  // queries; A = P^T, dS^T (MN-major views of sP, sdS), B = dO^T, Q^T (MN-major views).
  // (A from the S / dP accumulators' registers saves the P stores but holds 32 more registers
  // across the products: 255 and spills at d 128.) S and dP are issued one after the other and
  // dS reads P back from sP (16-bit): S, P and dP together in registers spilled at d 128.
  template <int N>
  using MmaKV = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<
          Element, Element, float,
          cute::Shape<cute::_64, cute::Int<N * kWgAlongKeys / 2>, cute::Int<kBlockM>>,
          cute::GMMA::Major::MN, cute::GMMA::Major::MN>(),
      WgLayoutKV{}));
  using MmaDV = MmaKV<kDv>;
  using MmaDK = MmaKV<kDqk>;
  // dQ = dS K: M = 64 queries, N = d_qk split in halves between the warpgroups, K = kBlockN;
  // A = dS from shared memory, B = K^T (MN-major view of K).
  using MmaDQ = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float,
                                 cute::Shape<cute::Int<kBlockM>, cute::Int<kDqk / 2>,
                                             cute::Int<kBlockN>>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::MN>(),
      cute::Layout<cute::Shape<cute::_1, cute::_2, cute::_1>>{}));
};

}  // namespace openmla::cuda::sm90::mha_bwd
