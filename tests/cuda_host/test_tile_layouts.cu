// Host-side checks of the CuTe tile layouts the SM90 kernels rely on: CuTe layouts are plain
// host-computable functions, so these run in the CPU tier wherever the CUDA backend is built
// (no GPU needed).
#include <gtest/gtest.h>

#include <cute/tensor.hpp>

#include "cuda/sm90/attention/mla_tiles.h"

namespace {

using namespace cute;
using Pv256 = openmla::cuda::sm90::attention::MlaTiles<bfloat16_t, 64, 64, 512, 256>::TiledMmaPV;

// The producers (sparse_attention/fill_quantized.cuh chunk_at, fill_bf16.cuh) write key k's
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

// The standard order's P (sparse_attention/consumer_common.cuh store_p_swizzled): stmatrix puts
// P's (row, key) at byte 128 row + 16 ((key / 8) ^ (row % 8)) + 2 (key % 8) of its piece, which
// the SS P V reads as its A operand through SmemLayoutP.
TEST(TileLayouts, StoredPIsThePLayout) {
  using Tiles = openmla::cuda::sm90::attention::MlaTiles<bfloat16_t, 64, 64, 576, 256>;
  const uintptr_t base = uintptr_t(1) << 20;
  auto p = make_tensor(make_smem_ptr(reinterpret_cast<bfloat16_t*>(base)), Tiles::SmemLayoutP{});
  for (int row = 0; row < 64; ++row) {
    for (int key = 0; key < 64; ++key) {
      const int bytes = 128 * row + 16 * ((key / 8) ^ (row % 8)) + 2 * (key % 8);
      const uintptr_t at = reinterpret_cast<uintptr_t>(raw_pointer_cast(&p(row, key)));
      ASSERT_EQ(static_cast<int>(at - base), bytes) << "row " << row << " key " << key;
    }
  }
}

}  // namespace
