// The toolchain check of toolchain_check.h: one 64x64x64 bf16 -> fp32 tile GEMM, TMA + wgmma.
// Kept to a single instantiation; it exists to be compiled (CI) and run once (tests/gpu).
#include <cuda_runtime.h>

#include <string>

#include "cuda/sm90/toolchain_check/toolchain_check.h"

// cute/tensor.hpp first: the sm90 atom headers rely on what it declares.
// clang-format off
#include <cute/tensor.hpp>
#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>
// clang-format on

namespace openmla::cuda {
namespace {

using namespace cute;

using Element = cute::bfloat16_t;
using TileM = Int<kToolchainCheckM>;
using TileN = Int<kToolchainCheckN>;
using TileK = Int<kToolchainCheckK>;

// 64 bf16 = 128 B per K row: exactly one 128 B swizzle atom wide, the layout TMA and GMMA share.
using SmemLayoutA =
    decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{}, Shape<TileM, TileK>{}));
using SmemLayoutB =
    decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{}, Shape<TileN, TileK>{}));
// One warpgroup issues 64x64x16 wgmma four times along K; both operands from shared memory.
using TiledMma =
    decltype(make_tiled_mma(SM90_64x64x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::K>{}));
constexpr int kThreads = 128;

struct SharedStorage {
  // 128 B swizzling repeats every 1024 B, so each operand tile starts on a 1024 B boundary.
  alignas(1024) Element a[cosize_v<SmemLayoutA>];
  alignas(1024) Element b[cosize_v<SmemLayoutB>];
  alignas(8) uint64_t tma_barrier;
};

template <class TmaA, class TmaB>
__global__ void __launch_bounds__(kThreads, 1)
    toolchain_check_gemm_kernel(__grid_constant__ const TmaA tma_a,
                                __grid_constant__ const TmaB tma_b, float* c) {
  extern __shared__ __align__(1024) char smem_raw[];
  SharedStorage& smem = *reinterpret_cast<SharedStorage*>(smem_raw);

  Tensor sA = make_tensor(make_smem_ptr(smem.a), SmemLayoutA{});   // (BLK_M,BLK_K)
  Tensor sB = make_tensor(make_smem_ptr(smem.b), SmemLayoutB{});   // (BLK_N,BLK_K)
  Tensor mA = tma_a.get_tma_tensor(make_shape(TileM{}, TileK{}));  // (M,K) TMA coordinates
  Tensor mB = tma_b.get_tma_tensor(make_shape(TileN{}, TileK{}));  // (N,K)

  // One CTA, no multicast: the whole tile is one TMA box.
  auto [tAgA, tAsA] = tma_partition(tma_a, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sA),
                                    group_modes<0, 2>(mA));  // (TMA), (TMA)
  auto [tBgB, tBsB] = tma_partition(tma_b, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sB),
                                    group_modes<0, 2>(mB));  // (TMA), (TMA)

  constexpr uint32_t kTmaBytes = (cosize_v<SmemLayoutA> + cosize_v<SmemLayoutB>)*sizeof(Element);
  if (threadIdx.x == 0) {
    initialize_barrier(smem.tma_barrier, /*thread_count=*/1);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    set_barrier_transaction_bytes(smem.tma_barrier, kTmaBytes);
    copy(tma_a.with(smem.tma_barrier), tAgA, tAsA);
    copy(tma_b.with(smem.tma_barrier), tBgB, tBsB);
  }
  wait_barrier(smem.tma_barrier, /*phase_bit=*/0);

  TiledMma tiled_mma;
  ThrMMA thr_mma = tiled_mma.get_thread_slice(threadIdx.x);
  Tensor tCsA = thr_mma.partition_A(sA);        // (MMA,MMA_M,MMA_K)
  Tensor tCsB = thr_mma.partition_B(sB);        // (MMA,MMA_N,MMA_K)
  Tensor tCrA = thr_mma.make_fragment_A(tCsA);  // (MMA,MMA_M,MMA_K) smem descriptors
  Tensor tCrB = thr_mma.make_fragment_B(tCsB);  // (MMA,MMA_N,MMA_K) smem descriptors
  Tensor gC = make_tensor(make_gmem_ptr(c), make_layout(make_shape(TileM{}, TileN{}),
                                                        make_stride(TileN{}, _1{})));  // (M,N)
  Tensor tCgC = thr_mma.partition_C(gC);        // (MMA,MMA_M,MMA_N)
  Tensor tCrC = thr_mma.make_fragment_C(tCgC);  // (MMA,MMA_M,MMA_N) fp32 accumulators

  clear(tCrC);
  warpgroup_fence_operand(tCrC);
  warpgroup_arrive();
  gemm(tiled_mma, tCrA, tCrB, tCrC);
  warpgroup_commit_batch();
  warpgroup_wait<0>();
  warpgroup_fence_operand(tCrC);
  copy(tCrC, tCgC);
}

Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return Status::CudaError(std::string("toolchain_check_gemm: ") + what + ": " +
                           cudaGetErrorString(err));
}

}  // namespace

Status toolchain_check_gemm(const void* a, const void* b, float* c, Stream stream) {
  auto* a_ptr = static_cast<const Element*>(a);
  auto* b_ptr = static_cast<const Element*>(b);
  Tensor gA = make_tensor(make_gmem_ptr(a_ptr),
                          make_layout(make_shape(TileM{}, TileK{}), make_stride(TileK{}, _1{})));
  Tensor gB = make_tensor(make_gmem_ptr(b_ptr),
                          make_layout(make_shape(TileN{}, TileK{}), make_stride(TileK{}, _1{})));
  auto tma_a = make_tma_copy(SM90_TMA_LOAD{}, gA, SmemLayoutA{});
  auto tma_b = make_tma_copy(SM90_TMA_LOAD{}, gB, SmemLayoutB{});

  auto kernel = toolchain_check_gemm_kernel<decltype(tma_a), decltype(tma_b)>;
  constexpr int kSmemBytes = sizeof(SharedStorage);
  OPENMLA_RETURN_IF_ERROR(cuda_status(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes),
      "cudaFuncSetAttribute"));
  kernel<<<1, kThreads, kSmemBytes, static_cast<cudaStream_t>(stream)>>>(tma_a, tma_b, c);
  return cuda_status(cudaGetLastError(), "launch");
}

}  // namespace openmla::cuda
