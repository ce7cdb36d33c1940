// Keys a CTA must not see (past its piece's end, before its start, causal): -inf in S, and the
// matching V rows zeroed in shared memory so 0 x NaN cannot reach O. Shared by the SM90 attention
// kernels; zero_v_rows reads a family's traits (kBlockN, kNumVPieces, kPieceBytes).
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

namespace openmla::cuda::sm90 {
namespace attention {

// Keys outside [lower, limit[i]) of row i (absolute key indices) get -inf.
template <class TS, class TC>
__device__ __forceinline__ void mask_tile(TS& S, TC const& cS, int t0, int lower,
                                          const int (&limit)[2]) {
  using namespace cute;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int j = 0; j < size<1>(S); ++j) {
      const int key = t0 + get<1>(cS(i, j));
      if (key >= limit[i] || key < lower) S(i, j) = -INFINITY;
    }
  }
}

// Zero V rows [valid, 64) of the 8 V pieces of a tile, so keys past the piece's end (unused
// cache slots may hold anything, NaN too, or were never loaded) add 0 * 0 to P V. A row is
// 128 contiguous bytes of its piece whatever the swizzle.
template <class Traits>
__device__ __forceinline__ void zero_v_rows(typename Traits::Element* tile, int valid,
                                            int thread) {
  char* base = reinterpret_cast<char*>(tile);
  const int chunks = (Traits::kBlockN - valid) * Traits::kNumVPieces * 8;  // 16 B chunks
  for (int idx = thread; idx < chunks; idx += 128) {
    const int row = valid + idx / (Traits::kNumVPieces * 8);
    const int k = idx % (Traits::kNumVPieces * 8);
    *reinterpret_cast<uint4*>(base + (k / 8) * Traits::kPieceBytes + row * 128 + (k % 8) * 16) =
        make_uint4(0u, 0u, 0u, 0u);
  }
}

}  // namespace attention
}  // namespace openmla::cuda::sm90
