// Host-side checks of the shared-memory tiles of the SM90 MHA prefill backward
// (src/cuda/sm90/mha_prefill/backward/traits.h): where the kernel's stores land (smem_at: cp.async
// chunks, P and dS) is where the wgmma operands read, every transposed (MN-major) view addresses
// the stored tile's element transposed, and every tile is a bijection onto its bytes.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <utility>

#include <cute/tensor.hpp>

#include "cuda/sm90/mha_prefill/backward/traits.h"
#include "cuda/sm90/mha_prefill/backward/wgmma_ops.cuh"

namespace {

using namespace cute;
namespace bwd = openmla::cuda::sm90::mha_bwd;

// A 1024-aligned, never dereferenced base: the swizzle acts on shared-memory addresses.
const uintptr_t kBase = uintptr_t(1) << 20;
template <class E>
E* base_ptr() {
  return reinterpret_cast<E*>(kBase);
}
template <class E>
long offset_of(E* p) {
  return static_cast<long>(reinterpret_cast<uintptr_t>(p) - kBase) / 2;
}

// Every element of a rows x cols tile at a distinct offset in [0, rows * cols); 8-element chunks
// from a multiple of 8 contiguous (the loads' 16-byte cp.async); and, for the 128 B swizzle, the
// TMA/GMMA pattern (chunk index XOR row mod 8), so the swizzle is really applied.
template <class Layout, class E>
void check_tile(int rows, int cols, bool sw128, const char* name) {
  std::set<long> seen;
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      const long at = offset_of(bwd::smem_at<Layout>(base_ptr<E>(), r, c));
      ASSERT_TRUE(at >= 0 && at < long(rows) * cols) << name << " (" << r << ", " << c << ")";
      ASSERT_TRUE(seen.insert(at).second) << name << " (" << r << ", " << c << ") twice";
      if (c % 8 != 0) {
        ASSERT_EQ(at, offset_of(bwd::smem_at<Layout>(base_ptr<E>(), r, c - c % 8)) + c % 8)
            << name << " (" << r << ", " << c << "): a 16-byte chunk split";
      }
      if (sw128 && c % 8 == 0) {
        const long within = at % (8 * 64);  // the 8 x 64 atom
        EXPECT_EQ(within, 64 * (r % 8) + 8 * (((c % 64) / 8) ^ (r % 8)))
            << name << " (" << r << ", " << c << ")";
      }
    }
  }
}

// View `VT` (x, y) addresses stored tile `V` (y, x).
template <class V, class VT, class E>
void check_transposed(int rows, int cols, const char* name) {
  auto stored = make_tensor(make_smem_ptr(base_ptr<E>()), V{});
  auto view = make_tensor(make_smem_ptr(base_ptr<E>()), VT{});
  ASSERT_EQ(int(size<0>(view)), cols) << name;
  ASSERT_EQ(int(size<1>(view)), rows) << name;
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      ASSERT_EQ(raw_pointer_cast(&view(c, r)), raw_pointer_cast(&stored(r, c)))
          << name << " stored (" << r << ", " << c << ")";
    }
  }
}

template <class E, int kD>
void check_all() {
  using T = bwd::BwdTraits<E, kD>;
  constexpr int M = T::kBlockM, N = T::kBlockN;
  check_tile<typename T::LayoutQ, E>(M, kD, (kD * T::kWgAlongKeys / 2) % 64 == 0, "Q");
  check_tile<typename T::LayoutDO, E>(M, T::kDv, true, "dO");
  check_tile<typename T::LayoutK, E>(N, kD, (kD / 2) % 64 == 0, "K");
  check_tile<typename T::LayoutV, E>(N, T::kDv, true, "V");
  check_tile<typename T::LayoutDS, E>(M, N, true, "P/dS");
  check_transposed<typename T::LayoutQ, typename T::LayoutQt, E>(M, kD, "Q^T");
  check_transposed<typename T::LayoutDO, typename T::LayoutDOt, E>(M, T::kDv, "dO^T");
  check_transposed<typename T::LayoutK, typename T::LayoutKt, E>(N, kD, "K^T");
  check_transposed<typename T::LayoutDS, typename T::LayoutDSt, E>(M, N, "P^T/dS^T");
}

TEST(MhaBwdLayouts, SmemAtIsNotTheIntegerLayout) {
  // With the 64 B swizzle (d 192's Q tile) the layout's integer offsets are not the addresses
  // the smem pointer gives (the swizzle acts on byte addresses): the reason the kernel addresses
  // shared memory through smem_at, which is what wgmma's descriptors see.
  using T = bwd::BwdTraits<bfloat16_t, 192>;
  int differ = 0;
  for (int r = 0; r < T::kBlockM; ++r) {
    for (int c = 0; c < 192; ++c) {
      differ += long(T::LayoutQ{}(r, c)) !=
                offset_of(bwd::smem_at<T::LayoutQ>(base_ptr<bfloat16_t>(), r, c));
    }
  }
  EXPECT_GT(differ, 0);
}
// The hardware (TMA/GMMA) swizzle of width `wbytes` on byte offsets from a 1024 B aligned base:
// the 16 B chunk bits [4, 4 + b) XOR the bits [7, 7 + b), b = log2(wbytes / 16). Every stored
// element's address (smem_at, the kernel's stores) is the layout's unswizzled offset with that
// swizzle applied: what wgmma's descriptor of that swizzle mode reads.
template <class Layout, class E>
void check_hw_swizzle(int rows, int cols, int wbytes, const char* name) {
  const long mask = wbytes / 16 - 1;
  const auto plain = Layout{}.layout_b();
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      const long at = 2 * offset_of(bwd::smem_at<Layout>(base_ptr<E>(), r, c));
      const long lin = 2 * long(plain(r, c));
      ASSERT_EQ(at, lin ^ (((lin >> 7) & mask) << 4)) << name << " (" << r << ", " << c << ")";
    }
  }
}

// Every (row, col) of an R x C accumulator owned by exactly one (thread, element) of the 256;
// with `pairs`, elements 2j, 2j + 1 of a thread are (row, c), (row, c + 1), c even (the float2
// atomics of dQ).
template <class Mma, int rows, int cols>
void check_accumulator(bool pairs, const char* name) {
  Mma mma;
  std::set<std::pair<int, int>> seen;
  for (int t = 0; t < 256; ++t) {
    auto coords = mma.get_thread_slice(t).partition_C(make_identity_tensor(Shape<Int<rows>, Int<cols>>{}));
    auto frag = partition_fragment_C(mma, Shape<Int<rows>, Int<cols>>{});
    ASSERT_EQ(int(size(coords)), int(size(frag))) << name;
    for (int i = 0; i < int(size(coords)); ++i) {
      const int r = get<0>(coords(i)), c = get<1>(coords(i));
      ASSERT_TRUE(r >= 0 && r < rows && c >= 0 && c < cols) << name;
      ASSERT_TRUE(seen.insert({r, c}).second) << name << " (" << r << ", " << c << ") twice";
      if (pairs && i % 2 == 1) {
        ASSERT_EQ(get<0>(coords(i - 1)), r) << name << " thread " << t << " element " << i;
        ASSERT_EQ(get<1>(coords(i - 1)) + 1, c) << name << " thread " << t << " element " << i;
        ASSERT_EQ(c % 2, 1) << name;
      }
    }
  }
  ASSERT_EQ(long(seen.size()), long(rows) * cols) << name;
}

template <class E, int kD>
void check_extra() {
  using T = bwd::BwdTraits<E, kD>;
  constexpr int M = T::kBlockM, N = T::kBlockN;
  auto width = [](int w) { return w % 64 == 0 ? 128 : w % 32 == 0 ? 64 : 32; };
  check_hw_swizzle<typename T::LayoutQ, E>(M, kD, width(kD * T::kWgAlongKeys / 2), "Q");
  check_hw_swizzle<typename T::LayoutDO, E>(M, T::kDv, width(T::kDv * T::kWgAlongKeys / 2), "dO");
  check_hw_swizzle<typename T::LayoutK, E>(N, kD, width(kD / 2), "K");
  check_hw_swizzle<typename T::LayoutV, E>(N, T::kDv, 128, "V");
  check_hw_swizzle<typename T::LayoutDS, E>(M, N, 128, "P/dS");
  check_accumulator<typename T::MmaSdP, N, M>(false, "S^T/dP^T");
  check_accumulator<typename T::MmaDV, N, T::kDv>(false, "dV");
  check_accumulator<typename T::MmaDK, N, kD>(false, "dK");
  check_accumulator<typename T::MmaDQ, M, kD>(true, "dQ");
}
TEST(MhaBwdLayouts, HardwareSwizzleAndAccumulators) {
  check_extra<bfloat16_t, 128>();
  check_extra<bfloat16_t, 192>();
  check_extra<half_t, 128>();
  check_extra<half_t, 192>();
}

TEST(MhaBwdLayouts, D128Bf16) { check_all<bfloat16_t, 128>(); }
TEST(MhaBwdLayouts, D192Bf16) { check_all<bfloat16_t, 192>(); }
TEST(MhaBwdLayouts, D128Fp16) { check_all<half_t, 128>(); }
TEST(MhaBwdLayouts, D192Fp16) { check_all<half_t, 192>(); }

}  // namespace
