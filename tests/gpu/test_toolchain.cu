// The toolchain check GEMM (TMA + wgmma, src/cuda/sm90/toolchain_check) against a host
// reference: if this fails, no CuTe kernel of ours can be trusted on this build.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/test_data.h"
#include "cuda/sm90/toolchain_check/toolchain_check.h"
#include "gpu/gpu_test_util.h"

namespace openmla::testing {
namespace {

constexpr int kM = cuda::kToolchainCheckM;
constexpr int kN = cuda::kToolchainCheckN;
constexpr int kK = cuda::kToolchainCheckK;

// Runs the check GEMM on bf16 bits a [M, K] and b [N, K]; returns c [M, N].
std::vector<float> run_gemm(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  DeviceBuffer d_a = to_device(a), d_b = to_device(b);
  DeviceBuffer d_c(sizeof(float) * kM * kN);
  d_c.poison();
  const Status st = cuda::toolchain_check_gemm(d_a.data(), d_b.data(), d_c.as<float>(), nullptr);
  EXPECT_TRUE(st.ok()) << st.message();
  synchronize();
  return to_host<float>(d_c, kM * kN);
}

std::vector<uint16_t> random_bf16(Rng& rng, int n) {
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = double_to_bf16_bits(rng.normal());
  return v;
}

TEST(ToolchainCheck, SmallTmaWgmmaGemmMatchesHost) {
  Rng rng(20240901);
  const std::vector<uint16_t> a = random_bf16(rng, kM * kK), b = random_bf16(rng, kN * kK);
  const std::vector<float> c = run_gemm(a, b);
  int bad = 0;
  for (int m = 0; m < kM; ++m) {
    for (int n = 0; n < kN; ++n) {
      double ref = 0.0, magnitude = 0.0;
      for (int k = 0; k < kK; ++k) {
        const double p = bf16_bits_to_double(a[m * kK + k]) * bf16_bits_to_double(b[n * kK + k]);
        ref += p;
        magnitude += std::fabs(p);
      }
      // bf16 products are exact in fp32; only the fp32 sum order differs from the host's.
      const double tol = 1e-5 * magnitude + 1e-6;
      const double got = c[m * kN + n];
      if (!(std::fabs(got - ref) <= tol) && bad++ < 8) {
        ADD_FAILURE() << "c[" << m << "][" << n << "] = " << got << ", expected " << ref;
      }
    }
  }
  EXPECT_EQ(bad, 0) << "elements out of tolerance";
}

// b = identity makes c equal a: a transposed or mis-swizzled operand shows up as moved values.
TEST(ToolchainCheck, SmallIdentityOperandKeepsLayout) {
  Rng rng(7);
  const std::vector<uint16_t> a = random_bf16(rng, kM * kK);
  std::vector<uint16_t> identity(kN * kK, 0);
  for (int i = 0; i < kN; ++i) identity[i * kK + i] = double_to_bf16_bits(1.0);
  const std::vector<float> c = run_gemm(a, identity);
  int bad = 0;
  for (int m = 0; m < kM; ++m) {
    for (int n = 0; n < kN; ++n) {
      const double expected = bf16_bits_to_double(a[m * kK + n]);
      if (c[m * kN + n] != expected && bad++ < 8) {
        ADD_FAILURE() << "c[" << m << "][" << n << "] = " << c[m * kN + n] << ", expected a[" << m
                      << "][" << n << "] = " << expected;
      }
    }
  }
  EXPECT_EQ(bad, 0) << "elements moved";
}

}  // namespace
}  // namespace openmla::testing
