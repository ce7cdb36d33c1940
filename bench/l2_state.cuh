// The L2 as a benchmark leaves it before a timed run, and the L2 eviction policies a load can
// carry: shared by bench_dense_decode.cu (the kernel) and research/bench_l2_state.cu (a KV stream
// alone).
//
// The benchmarks' flush, an 8 GiB memset, leaves the L2 full of dirty lines; the timed kernel's
// loads then evict them, and the L2 writes them back to DRAM while the kernel reads. A "clean"
// flush follows the memset by a read of a buffer several times the L2, so the dirty lines are
// written back before the timed run and the L2 holds only clean ones.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace openmla::bench {

// A read of `bytes` (a multiple of 16) that the compiler cannot drop: lines pass through the L2
// with the default policy, evicting what it held.
__global__ void read_through_l2(const uint4* data, size_t n16, unsigned* sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n16;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint4 v = data[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // (practically never: keeps the loads)
}

// L2 eviction policies by code (PTX createpolicy.fractional: `fraction` of the accesses get the
// first priority, the others the second).
enum L2Policy : int {
  kPolicyNone = 0,       // no .L2::cache_hint at all
  kPolicyNormal = 1,     // evict_normal
  kPolicyFirst = 2,      // evict_first
  kPolicyHalfFirst = 3,  // evict_normal for half the accesses, evict_first for the others
  kPolicyQuarterFirst = 4,  // evict_normal 3/4, evict_first 1/4
  kPolicyUnchanged = 5,  // evict_unchanged
  kPolicyLast = 6,       // evict_last
  kPolicyCount = 7,
};

inline const char* l2_policy_name(int code) {
  switch (code) {
    case kPolicyNone: return "no hint";
    case kPolicyNormal: return "evict_normal";
    case kPolicyFirst: return "evict_first";
    case kPolicyHalfFirst: return "normal 1/2 + first 1/2";
    case kPolicyQuarterFirst: return "normal 3/4 + first 1/4";
    case kPolicyUnchanged: return "evict_unchanged";
    case kPolicyLast: return "evict_last";
    default: return "?";
  }
}

__device__ __forceinline__ uint64_t make_l2_policy(int code) {
  uint64_t p = 0;
  switch (code) {
    case kPolicyNormal:
      asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(p));
      break;
    case kPolicyFirst:
      asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
      break;
    case kPolicyHalfFirst:
      asm volatile("createpolicy.fractional.L2::evict_normal.L2::evict_first.b64 %0, 0.5;"
                   : "=l"(p));
      break;
    case kPolicyQuarterFirst:
      asm volatile("createpolicy.fractional.L2::evict_normal.L2::evict_first.b64 %0, 0.75;"
                   : "=l"(p));
      break;
    case kPolicyUnchanged:
      asm volatile("createpolicy.fractional.L2::evict_unchanged.b64 %0, 1.0;" : "=l"(p));
      break;
    case kPolicyLast:
      asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
      break;
    default:
      break;
  }
  return p;
}

// The opaque values of every code (the decode kernel takes its KV hint as such a value).
__global__ void l2_policy_values(uint64_t* out) {
  if (threadIdx.x == 0) {
    for (int c = 0; c < kPolicyCount; ++c) out[c] = make_l2_policy(c);
  }
}

// Host: the values of every code, computed on the current device.
inline cudaError_t l2_policy_table(uint64_t (&values)[kPolicyCount]) {
  uint64_t* d = nullptr;
  cudaError_t err = cudaMalloc(&d, sizeof(values));
  if (err != cudaSuccess) return err;
  l2_policy_values<<<1, 32>>>(d);
  err = cudaMemcpy(values, d, sizeof(values), cudaMemcpyDeviceToHost);
  cudaFree(d);
  return err;
}

// Leaves the L2 as the benchmarks' flush does (dirty: the memset) or clean (the memset, then a read
// of `read_bytes` of `read_buf`, so the dirty lines are written back before the timed run).
struct L2Flush {
  void* memset_buf = nullptr;
  size_t memset_bytes = 0;
  void* read_buf = nullptr;  // null: the dirty flush
  size_t read_bytes = 0;
  unsigned* sink = nullptr;
  void run(cudaStream_t stream = nullptr) const {
    cudaMemsetAsync(memset_buf, 0, memset_bytes, stream);
    if (read_buf != nullptr) {
      read_through_l2<<<132 * 8, 256, 0, stream>>>(static_cast<const uint4*>(read_buf),
                                                   read_bytes / 16, sink);
    }
  }
};

}  // namespace openmla::bench
