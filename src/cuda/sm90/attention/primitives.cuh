// Small device helpers every SM90 attention kernel's roles use (src/cuda/sm90/attention/, shared
// by the kernel families beside it): the seesaw's named barriers, proxy fences, part hand-back,
// quad reductions, 16-bit packing, shared-window addresses and cp.async, the 128 B swizzle.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

namespace openmla::cuda::sm90 {
namespace attention {

// Named barriers of the two-compute-warpgroup seesaw (hardware ids; 0 is __syncthreads), counts
// in threads. A family with another exchange between its warpgroups names its own ids.
enum : uint32_t {
  kBarRequest = 1,   // both compute WGs: Q loaded / previous request finished (256)
  kBarP0Ready = 2,   // WG0 -> WG1: P0, m0 published (256)
  kBarP1Ready = 3,   // WG1 -> WG0: P1, m1, scale1 published (256)
  kBarWg0 = 4,       // inside WG0: its zeroed V rows visible to its own wgmma (128)
  kBarWg1 = 5,       // inside WG1 (128)
  kBarEpilogue = 6,  // row sums exchanged (256)
};

__device__ __forceinline__ void bar_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void bar_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
// Generic-proxy smem writes (P, Q, zeroed rows) ordered before async-proxy accesses (wgmma reads,
// the next TMA write into the same bytes). With a memory clobber, unlike CUTLASS's
// fence_view_async_shared: the stores before it must not sink below it.
__device__ __forceinline__ void fence_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// A part of a stage handed back to its producer warp: lane 0 of each of the 4 warps of the
// releasing warpgroup arrives (the empty barrier counts 4).
__device__ __forceinline__ void release_part(uint64_t* empty, int lane) {
  if (lane == 0) cutlass::arch::ClusterBarrier::arrive(empty);
}

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

template <typename Element>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (cute::is_same_v<Element, cute::bfloat16_t>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// A shared-memory address as the 32-bit shared-window offset instructions take.
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// cp.async of `bytes` (16 or 4) from global to shared memory; zeros where `valid` is false (no
// byte is read then: src-size 0).
// 16 bytes to a shared-window address (so constant offsets fold into the instruction).
__device__ __forceinline__ void cp_async16_u32(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async4_u32(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src),
               "r"(valid ? 4 : 0) : "memory");
}
template <int kBytes>
__device__ __forceinline__ void cp_async(char* dst, const void* src, bool valid) {
  static_assert(kBytes == 16 || kBytes == 4);
  if constexpr (kBytes == 16) {
    cp_async16_u32(smem_u32(dst), src, valid);
  } else {
    cp_async4_u32(smem_u32(dst), src, valid);
  }
}
// The mbarrier also waits for this thread's cp.asyncs so far (no change to its arrival count:
// the pending count goes up now and down when they land), as CUTLASS's cp.async pipelines do.
__device__ __forceinline__ void cp_async_track(uint64_t& barrier) {
  asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];" ::"r"(smem_u32(&barrier))
               : "memory");
}
// One arrival on `barrier` once this thread's cp.asyncs so far have landed (counted among the
// barrier's expected arrivals).
__device__ __forceinline__ void cp_async_arrive_noinc(uint64_t& barrier) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_u32(&barrier))
               : "memory");
}

// Byte offset of (row, 16-byte chunk) inside an 8 KB piece of 64 rows x 128 B, 128 B swizzle
// (the TMA/GMMA pattern: chunk index XOR row mod 8; pieces start on 1024 B boundaries).
__device__ __forceinline__ uint32_t swizzled_offset(int row, int chunk) {
  return static_cast<uint32_t>(row * 128 + ((chunk ^ (row & 7)) << 4));
}

}  // namespace attention
}  // namespace openmla::cuda::sm90
