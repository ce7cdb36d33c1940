// Rates of the tensor-core building blocks of the SM90 dense decode kernel, measured alone:
// S = Q K^T (m64n64k16, both operands from shared memory, 36 k-steps over d 576) and
// O += P V (m64n256k16, P from registers, V MN-major from shared memory, 4 k-steps over 64 keys),
// by one warpgroup or two at once, one CTA per SM, operands resident in shared memory (no loads).
// Prints clocks per GEMM (clock64 inside the kernel) and the SM-wide rate against the ideal
// 2048 dense bf16 FMA per clock per SM (989 TFLOP/s = 132 SMs x 1.83 GHz x 4096 FLOP/clk).
// NOTES.md (dense_decode, v5) says what the figures decided. QK^T measured above that "ideal"
// (~3.7k FMA/clk alone); PV at it.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cute/tensor.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/sm90/dense_decode/traits.h"

namespace {

using Traits = openmla::cuda::sm90::DenseDecodeTraits<cute::bfloat16_t, 576>;
using Element = Traits::Element;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Clocks of `iters` QK^T (64 x 64 x 576, SS m64n64k16 x 36) by one warpgroup: kPerGroup k-steps
// a commit group (36: one group; 4: one group per 64-dim piece, as gemm_qk issues them), each
// group after a wait on `landed` (a completed barrier, as the kernel's landed pieces) when
// kWaits, and a wgmma fence; one wait for all at the end.
template <int kPerGroup, bool kWaits>
__device__ long long time_qk(Element* sq, Element* sk, int t, int iters, long long* clocks,
                             uint64_t* landed) {
  using namespace cute;
  typename Traits::TiledMmaQK mma;
  auto thr = mma.get_thread_slice(t);
  Tensor tSrQ = thr.partition_fragment_A(make_tensor(make_smem_ptr(sq), Traits::SmemLayoutQ{}));
  Tensor tSrK = thr.partition_fragment_B(make_tensor(make_smem_ptr(sk), Traits::SmemLayoutK{}));
  Tensor tSrS = partition_fragment_C(mma, Shape<_64, _64>{});
  constexpr int kSteps = decltype(size<2>(tSrQ))::value;
  static_assert(kSteps % kPerGroup == 0, "whole groups");
  const long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
    warpgroup_fence_operand(tSrS);
#pragma unroll
    for (int g = 0; g < kSteps / kPerGroup; ++g) {
      if constexpr (kWaits) cutlass::arch::ClusterBarrier::wait(landed, 0);
      warpgroup_arrive();
#pragma unroll
      for (int j = 0; j < kPerGroup; ++j) {
        const int k = g * kPerGroup + j;
        mma.accumulate_ = k == 0 ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
        gemm(mma, tSrQ(_, _, k), tSrK(_, _, k), tSrS);
      }
      warpgroup_commit_batch();
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(tSrS);
  }
  const long long elapsed = clock64() - t0;
  if (tSrS(0) == 12345.f) clocks[gridDim.x * 2] = 1;  // keep S live
  return elapsed;
}

// kRole[wg]: 0 = QK^T, 1 = PV, 2 = QK^T in 9 commit groups as the kernel issues it, 3 = the
// same without the barrier waits, 4 = 3 groups after waits (one a part), -1 = idle.
template <int kRole0, int kRole1>
__global__ void __launch_bounds__(256, 1) rates_kernel(long long* clocks, int iters) {
  using namespace cute;
  extern __shared__ __align__(1024) char smem_raw[];
  Element* sq = reinterpret_cast<Element*>(smem_raw);
  Element* sk = sq + Traits::kBlockM * Traits::kHeadDimQK;
  // Small finite values: the rates must not depend on zeros.
  for (int i = threadIdx.x; i < 2 * 64 * 576; i += blockDim.x) {
    sq[i] = Element(0.001f * static_cast<float>((i * 7) % 13));
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  // A barrier whose phase 0 is complete: role 2 waits on it before each piece, as the kernel
  // waits on each piece's TMA barrier (already landed here).
  __shared__ alignas(8) uint64_t landed;
  if (threadIdx.x == 0) {
    cutlass::arch::ClusterBarrier::init(&landed, 1);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) cutlass::arch::ClusterBarrier::arrive(&landed);
  __syncthreads();
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
  const int role = wg == 0 ? kRole0 : kRole1;
  long long elapsed = 0;
  if (role == 0) {
    elapsed = time_qk<36, false>(sq, sk, t, iters, clocks, &landed);
  } else if (role == 2) {
    elapsed = time_qk<4, true>(sq, sk, t, iters, clocks, &landed);
  } else if (role == 3) {
    elapsed = time_qk<4, false>(sq, sk, t, iters, clocks, &landed);
  } else if (role == 4) {
    elapsed = time_qk<12, true>(sq, sk, t, iters, clocks, &landed);
  } else if (role == 1) {
    typename Traits::TiledMmaPV mma;
    auto thr = mma.get_thread_slice(t);
    Tensor tOrP = thr.partition_fragment_A(make_tensor(make_smem_ptr(sq), Traits::SmemLayoutP{}));
    for (int i = 0; i < size(tOrP); ++i) tOrP(i) = Element(0.01f * (i % 5));
    Tensor tOrV = thr.partition_fragment_B(
        make_tensor(make_smem_ptr(sk + wg * 4 * Traits::kPieceElems), Traits::SmemLayoutV{}));
    Tensor tOrO = partition_fragment_C(mma, Shape<_64, _256>{});
    clear(tOrO);
    const long long t0 = clock64();
    for (int it = 0; it < iters; ++it) {
      warpgroup_fence_operand(tOrO);
      warpgroup_arrive();
      mma.accumulate_ = GMMA::ScaleOut::One;
      gemm(mma, tOrP, tOrV, tOrO);
      warpgroup_commit_batch();
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
    }
    elapsed = clock64() - t0;
    if (tOrO(0) == 12345.f) clocks[gridDim.x * 2] = 1;
  }
  if (t == 0) clocks[blockIdx.x * 2 + wg] = elapsed;
}

template <int kRole0, int kRole1>
void measure(const char* name, int sms, long long* clocks_d) {
  const int iters = 2000;
  auto kernel = rates_kernel<kRole0, kRole1>;
  const int smem = 2 * 64 * 576 * 2;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "attr");
  kernel<<<sms, 256, smem>>>(clocks_d, 10);  // warm-up
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0);
  kernel<<<sms, 256, smem>>>(clocks_d, iters);
  cudaEventRecord(e1);
  check(cudaEventSynchronize(e1), name);
  float ms = 0.f;
  cudaEventElapsedTime(&ms, e0, e1);
  std::vector<long long> clocks(2 * sms);
  check(cudaMemcpy(clocks.data(), clocks_d, clocks.size() * sizeof(long long),
                   cudaMemcpyDeviceToHost), "d2h");
  double fma = 0.0;  // per CTA per iteration
  const int roles[2] = {kRole0, kRole1};
  double clk[2] = {0, 0};
  for (int w = 0; w < 2; ++w) {
    if (roles[w] < 0) continue;
    for (int b = 0; b < sms; ++b) clk[w] += static_cast<double>(clocks[2 * b + w]);
    clk[w] /= static_cast<double>(sms) * iters;
    fma += roles[w] != 1 ? 64.0 * 64 * 576 : 64.0 * 256 * 64;  // every role but PV is a QK^T
  }
  const double per_iter = std::max(clk[0], clk[1]);
  const double tflops = 2.0 * fma * sms * iters / (ms * 1e-3) / 1e12;
  std::printf("| %s | %.0f | %.0f | %.0f | %.0f%% | %.0f |\n", name, clk[0], clk[1],
              fma / per_iter, 100.0 * fma / per_iter / 2048.0, tflops);
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "properties");
  const int sms = prop.multiProcessorCount;
  long long* clocks_d = nullptr;
  check(cudaMalloc(&clocks_d, sizeof(long long) * (2 * sms + 1)), "malloc");
  std::printf("## wgmma building blocks, %s (%d SMs); ideal at 2048 FMA/clk/SM: QK^T 64x64x576 "
              "1152 clk, PV 64x256x64 512 clk\n\n", prop.name, sms);
  std::printf("| warpgroups: roles | WG0 clk/GEMM | WG1 clk/GEMM | FMA/clk/SM | of 2048 | "
              "TFLOP/s |\n");
  std::printf("|---|---|---|---|---|---|\n");
  measure<0, -1>("QK^T alone (SS m64n64k16 x36)", sms, clocks_d);
  measure<0, 0>("QK^T + QK^T", sms, clocks_d);
  measure<1, -1>("PV alone (RS m64n256k16 x4)", sms, clocks_d);
  measure<1, 1>("PV + PV", sms, clocks_d);
  measure<0, 1>("QK^T + PV", sms, clocks_d);
  measure<2, -1>("QK^T alone, 9 groups of 4 after barrier waits (as gemm_qk)", sms, clocks_d);
  measure<2, 2>("QK^T + QK^T, 9 groups each", sms, clocks_d);
  measure<2, 1>("QK^T in 9 groups + PV", sms, clocks_d);
  measure<3, -1>("QK^T alone, 9 groups, no waits", sms, clocks_d);
  measure<4, -1>("QK^T alone, 3 groups of 12 after waits (a part each)", sms, clocks_d);
  measure<4, 4>("QK^T + QK^T, 3 groups each", sms, clocks_d);
  measure<4, 1>("QK^T in 3 groups + PV", sms, clocks_d);
  cudaFree(clocks_d);
  return 0;
}
