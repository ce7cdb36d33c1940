// Host-side checks of the CuTe tile layouts the SM90 kernels rely on: CuTe layouts are plain
// host-computable functions, so these run in the CPU tier wherever the CUDA backend is built
// (no GPU needed).
#include <gtest/gtest.h>

#include <cute/tensor.hpp>

#include "cuda/sm90/attention/mla_tiles.h"
#include "cuda/sm90/mha_prefill/traits.h"
#include "cuda/sm90/sparse_decode/traits.h"

namespace {

using namespace cute;
using Pv256 = openmla::cuda::sm90::attention::MlaTiles<bfloat16_t, 64, 64, 512, 256>::TiledMmaPV;

// The producers (sparse_decode/fills.cuh: every fill, by tile, half or round) write key k's
// dims [8 c, 8 c + 8) of 64-dim piece p at byte p * 8192 + 128 k + 16 (c ^ (k % 8)) of a stage: the
// K tile's layout (128 B swizzle), which QK^T and P V read. Checked element by element.
TEST(TileLayouts, ProducerAddressesAreTheKTileLayout) {
  using K512 = openmla::cuda::sm90::attention::MlaTiles<bfloat16_t, 64, 64, 512, 256>::SmemLayoutK;
  using K576 = openmla::cuda::sm90::attention::MlaTiles<bfloat16_t, 64, 64, 576, 256>::SmemLayoutK;
  // The 128 B swizzle acts on shared-memory byte addresses (CuTe applies it through the smem
  // pointer), so the offsets are taken from a tensor over a 1024-aligned (never dereferenced)
  // address.
  auto check = [](auto layout, int dims) {
    const uintptr_t base = uintptr_t(1) << 20;
    auto tile = make_tensor(make_smem_ptr(reinterpret_cast<bfloat16_t*>(base)), layout);
    for (int k = 0; k < 64; ++k) {
      for (int dim = 0; dim < dims; ++dim) {
        const int piece = dim / 64, c = (dim % 64) / 8;
        const int bytes = piece * 8192 + 128 * k + 16 * (c ^ (k % 8)) + 2 * (dim % 8);
        const uintptr_t at = reinterpret_cast<uintptr_t>(raw_pointer_cast(&tile(k, dim)));
        ASSERT_EQ(static_cast<int>(at - base), bytes) << "key " << k << " dim " << dim;
      }
    }
  };
  check(K512{}, 512);
  check(K576{}, 576);
}

// P V reads V as the K tile's bytes transposed (MN-major): a warpgroup's 256-dim view (pieces
// 4 wg ..) must address, for every (dim, key), the byte the K tile holds key's dim at.
TEST(TileLayouts, VViewsAreTheKTileTransposed) {
  using Tiles256 = openmla::cuda::sm90::attention::MlaTiles<bfloat16_t, 64, 64, 576, 256>;
  const uintptr_t base = uintptr_t(1) << 20;
  bfloat16_t* stage = reinterpret_cast<bfloat16_t*>(base);
  auto k_tile = make_tensor(make_smem_ptr(stage), Tiles256::SmemLayoutK{});
  auto addr = [](auto const& ref) { return reinterpret_cast<uintptr_t>(raw_pointer_cast(&ref)); };
  for (int wg = 0; wg < 2; ++wg) {
    auto v256 = make_tensor(make_smem_ptr(stage + wg * 4 * 64 * 64), Tiles256::SmemLayoutV{});
    for (int dim = 0; dim < 256; ++dim) {
      for (int key = 0; key < 64; ++key) {
        ASSERT_EQ(addr(v256(dim, key)), addr(k_tile(key, 256 * wg + dim)))
            << "wg " << wg << " dim " << dim << " key " << key;
      }
    }
  }
}

// The ring fill's rounds (sparse_decode/traits.h): S = Q K^T by round reads a round's 32 keys
// through SmemLayoutKRound, from rows 32 r .. of the one stage (8 KB pieces) or, with the round
// slots, from a slot of 4 KB pieces, where the producer (ring_decode_key) writes key k's dims
// [8 c, 8 c + 8) of piece p at byte p * stride + 128 k + 16 (c ^ (k % 8)); the slots' P V reads
// a warpgroup's 256 dims of a slot through SmemLayoutVSlot, the same bytes transposed.
template <int D, int kRing>
void check_rounds() {
  using T = openmla::cuda::sm90::SparseDecodeTraits<D, false, false, false, kRing>;
  constexpr int kPieceStride = kRing == 2 ? 4096 : 8192;
  const uintptr_t base = uintptr_t(1) << 20;
  bfloat16_t* slot = reinterpret_cast<bfloat16_t*>(base);
  auto addr = [](auto const& ref) { return reinterpret_cast<uintptr_t>(raw_pointer_cast(&ref)); };
  auto k_round = make_tensor(make_smem_ptr(slot), typename T::SmemLayoutKRound{});
  for (int k = 0; k < 32; ++k) {
    for (int dim = 0; dim < D; ++dim) {
      const int piece = dim / 64, c = (dim % 64) / 8;
      const int bytes = piece * kPieceStride + 128 * k + 16 * (c ^ (k % 8)) + 2 * (dim % 8);
      ASSERT_EQ(static_cast<int>(addr(k_round(k, dim)) - base), bytes)
          << "d " << D << " key " << k << " dim " << dim;
    }
  }
  if constexpr (kRing == 2) {
    static_assert(T::kSlotPieceBytes == kPieceStride && T::kSlotBytes == D / 64 * 4096);
    for (int wg = 0; wg < 2; ++wg) {
      auto v = make_tensor(make_smem_ptr(slot + wg * 4 * (kPieceStride / 2)),
                           typename T::SmemLayoutVSlot{});
      for (int dim = 0; dim < 256; ++dim) {
        for (int key = 0; key < 32; ++key) {
          ASSERT_EQ(addr(v(dim, key)), addr(k_round(key, 256 * wg + dim)))
              << "d " << D << " wg " << wg << " dim " << dim << " key " << key;
        }
      }
    }
  }
}
TEST(TileLayouts, RingRoundsAreTheProducersAddresses) {
  check_rounds<576, 1>();
  check_rounds<512, 1>();
  check_rounds<576, 2>();
  check_rounds<512, 2>();
}

// Dense MHA prefill forward (mha_prefill/producer.cuh): TMA writes row r (query or key) of a
// 64-dim piece p of a box of `rows` rows at byte p * rows * 128 + 128 r + 16 (c ^ (r % 8)) for
// dims [8 c, 8 c + 8) (128 B swizzle). Q (64 rows a warpgroup) and K (128 keys) must read those
// bytes as their K-major layouts, and V (dims x keys) the same bytes of its pieces transposed.
template <int kD>
void check_mha_tiles() {
  using T = openmla::cuda::sm90::MhaFwdTraits<bfloat16_t, kD>;
  const uintptr_t base = uintptr_t(1) << 20;
  auto addr = [](auto const& ref) { return reinterpret_cast<uintptr_t>(raw_pointer_cast(&ref)); };
  auto tma_byte = [](int rows, int r, int dim) {
    const int piece = dim / 64, c = (dim % 64) / 8;
    return piece * rows * 128 + 128 * r + 16 * (c ^ (r % 8)) + 2 * (dim % 8);
  };
  bfloat16_t* p = reinterpret_cast<bfloat16_t*>(base);
  auto q = make_tensor(make_smem_ptr(p), typename T::SmemLayoutQ{});
  auto k = make_tensor(make_smem_ptr(p), typename T::SmemLayoutK{});
  auto v = make_tensor(make_smem_ptr(p), typename T::SmemLayoutV{});
  static_assert(decltype(size<0>(q))::value == 64 && decltype(size<1>(q))::value == kD);
  static_assert(decltype(size<0>(k))::value == 128 && decltype(size<1>(k))::value == kD);
  static_assert(decltype(size<0>(v))::value == 128 && decltype(size<1>(v))::value == 128);
  for (int dim = 0; dim < kD; ++dim) {
    for (int r = 0; r < 64; ++r) {
      ASSERT_EQ(static_cast<int>(addr(q(r, dim)) - base), tma_byte(64, r, dim))
          << "d " << kD << " Q row " << r << " dim " << dim;
    }
    for (int key = 0; key < 128; ++key) {
      ASSERT_EQ(static_cast<int>(addr(k(key, dim)) - base), tma_byte(128, key, dim))
          << "d " << kD << " K key " << key << " dim " << dim;
      if (dim < 128) {
        ASSERT_EQ(static_cast<int>(addr(v(dim, key)) - base), tma_byte(128, key, dim))
            << "d " << kD << " V dim " << dim << " key " << key;
      }
    }
  }
  // The producer's piece strides (producer.cuh) and the stage strides (kernel.cuh at_offset).
  static_assert(T::kQWgElems == 64 * kD && T::kKElems == 128 * kD && T::kVElems == 128 * 128);
  static_assert(T::kKBytes % 1024 == 0 && T::kVBytes % 1024 == 0);
}

TEST(TileLayouts, MhaPrefillTilesAreTheTmaBoxes) {
  check_mha_tiles<192>();
  check_mha_tiles<128>();
}

// P = the S accumulator (m64n128, fp32) packed two values a 32-bit word in its register order
// (attention/softmax.cuh pack_p) must be the A fragment of P V (m64 x k128, 16-bit, 8 k-blocks):
// value v of thread t in S and value v of thread t in A hold the same (row, key).
TEST(TileLayouts, MhaPrefillAccumulatorIsThePvAFragment) {
  using T = openmla::cuda::sm90::MhaFwdTraits<bfloat16_t, 192>;
  typename T::TiledMmaQK mma_qk;
  typename T::TiledMmaPV mma_pv;
  auto id = make_identity_tensor(Shape<_64, _128>{});
  for (int t = 0; t < 128; ++t) {
    auto c = mma_qk.get_thread_slice(t).partition_C(id);
    auto a = mma_pv.get_thread_slice(t).partition_A(id);
    ASSERT_EQ(int(size(c)), int(size(a)));
    for (int v = 0; v < int(size(c)); ++v) {
      ASSERT_EQ(get<0>(c(v)), get<0>(a(v))) << "thread " << t << " value " << v << " row";
      ASSERT_EQ(get<1>(c(v)), get<1>(a(v))) << "thread " << t << " value " << v << " key";
    }
  }
}

}  // namespace
