// Host-side checks of the CuTe tile layouts the SM90 kernels rely on: CuTe layouts are plain
// host-computable functions, so these run in the CPU tier wherever the CUDA backend is built
// (no GPU needed).
#include <gtest/gtest.h>

#include <cute/tensor.hpp>

#include "cuda/sm90/attention/mla_tiles.h"

namespace {

using namespace cute;
using Pv256 = openmla::cuda::sm90::attention::MlaTiles<bfloat16_t, 64, 64, 512, 256>::TiledMmaPV;
using Pv128 = openmla::cuda::sm90::attention::MlaTiles<bfloat16_t, 64, 64, 512, 128>::TiledMmaPV;

// sparse_decode/kernel.cuh gemm_pv_by_round_128 (the two-warpgroup ring) runs a warpgroup's
// 64 x 256 P V as two 64 x 128 groups whose accumulators are the 64 x 256 accumulator's values
// 0-63 and 64-127, and feeds both the P fragment partitioned for the 64 x 256 atom. Every thread's values must then land on the same
// (row, column) either way.
TEST(TileLayouts, PvAccumulatorIsTwoHalfWidthAccumulatorsBackToBack) {
  Pv256 m256;
  Pv128 m128;
  for (int t = 0; t < 128; ++t) {
    auto c256 = m256.get_thread_slice(t).partition_C(make_identity_tensor(Shape<_64, _256>{}));
    auto c128 = m128.get_thread_slice(t).partition_C(make_identity_tensor(Shape<_64, _128>{}));
    ASSERT_EQ(size(c256), 2 * size(c128));
    for (int i = 0; i < size(c128); ++i) {
      const auto lo = c256(i), hi = c256(i + size(c128)), q = c128(i);
      ASSERT_EQ(get<0>(lo), get<0>(q)) << "thread " << t << " value " << i;
      ASSERT_EQ(get<1>(lo), get<1>(q)) << "thread " << t << " value " << i;
      ASSERT_EQ(get<0>(hi), get<0>(q)) << "thread " << t << " value " << i + size(c128);
      ASSERT_EQ(get<1>(hi), get<1>(q) + 128) << "thread " << t << " value " << i + size(c128);
    }
  }
}

TEST(TileLayouts, PFragmentIsTheSameForBothPvWidths) {
  Pv256 m256;
  Pv128 m128;
  for (int t = 0; t < 128; ++t) {
    auto a256 = m256.get_thread_slice(t).partition_A(make_identity_tensor(Shape<_64, _64>{}));
    auto a128 = m128.get_thread_slice(t).partition_A(make_identity_tensor(Shape<_64, _64>{}));
    ASSERT_EQ(size(a256), size(a128));
    for (int i = 0; i < size(a128); ++i) {
      ASSERT_EQ(get<0>(a256(i)), get<0>(a128(i))) << "thread " << t << " value " << i;
      ASSERT_EQ(get<1>(a256(i)), get<1>(a128(i))) << "thread " << t << " value " << i;
    }
  }
}

// The producers (sparse_decode/producer.cuh: every fill, by tile, half or round) write key k's
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

// P V reads V as the K tile's bytes transposed (MN-major): the 256-dim view of a warpgroup's half
// (pieces 4 wg ..) and gemm_pv_by_round_128's 128-dim views (pieces 4 wg + 2 q ..) must address,
// for every (dim, key), the byte the K tile holds key's dim at.
TEST(TileLayouts, VViewsAreTheKTileTransposed) {
  using Tiles256 = openmla::cuda::sm90::attention::MlaTiles<bfloat16_t, 64, 64, 576, 256>;
  using Tiles128 = openmla::cuda::sm90::attention::MlaTiles<bfloat16_t, 64, 64, 576, 128>;
  const uintptr_t base = uintptr_t(1) << 20;
  bfloat16_t* stage = reinterpret_cast<bfloat16_t*>(base);
  auto k_tile = make_tensor(make_smem_ptr(stage), Tiles256::SmemLayoutK{});
  auto addr = [](auto const& ref) { return reinterpret_cast<uintptr_t>(raw_pointer_cast(&ref)); };
  for (int wg = 0; wg < 2; ++wg) {
    auto v256 = make_tensor(make_smem_ptr(stage + wg * 4 * 64 * 64), Tiles256::SmemLayoutV{});
    for (int q = 0; q < 2; ++q) {
      auto v128 = make_tensor(make_smem_ptr(stage + (wg * 4 + 2 * q) * 64 * 64),
                              Tiles128::SmemLayoutV{});
      for (int dim = 0; dim < 128; ++dim) {
        for (int key = 0; key < 64; ++key) {
          const int k_dim = 256 * wg + 128 * q + dim;
          ASSERT_EQ(addr(v128(dim, key)), addr(k_tile(key, k_dim)))
              << "wg " << wg << " quarter " << q << " dim " << dim << " key " << key;
          ASSERT_EQ(addr(v256(128 * q + dim, key)), addr(k_tile(key, k_dim)))
              << "wg " << wg << " dim " << 128 * q + dim << " key " << key;
        }
      }
    }
  }
}

}  // namespace
