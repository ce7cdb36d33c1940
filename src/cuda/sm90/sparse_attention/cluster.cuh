// Distributed shared memory of a 2-CTA cluster (the crossover, traits.h kCluster 2): the peer's
// addresses, stores into the peer's shared memory that complete bytes on its barrier, arrivals on
// the peer's barriers, and the cluster-wide barrier.
#pragma once

#include <cstdint>

namespace openmla::cuda::sm90 {
namespace sparse {

__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
// The shared::cluster address of the same byte in CTA `rank` of the cluster.
__device__ __forceinline__ uint32_t peer_addr(uint32_t local, uint32_t rank) {
  uint32_t r;
  asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(local), "r"(rank));
  return r;
}
// 16 (or 4) bytes into the peer's shared memory; the store completes its bytes on the peer's
// barrier at `bar` (shared::cluster), whose phase expects them (mbarrier complete_tx).
__device__ __forceinline__ void st_async_peer(uint32_t addr, const uint4& v, uint32_t bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];"
      ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(bar) : "memory");
}
__device__ __forceinline__ void st_async_peer(uint32_t addr, uint32_t v, uint32_t bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
               ::"r"(addr), "r"(v), "r"(bar) : "memory");
}
__device__ __forceinline__ void st_local(uint32_t addr, const uint4& v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}
// One arrival on the barrier at shared::cluster address `addr` (the peer's), as CUTLASS's
// cluster pipelines release a stage to a remote producer.
__device__ __forceinline__ void arrive_peer(uint32_t addr) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(addr) : "memory");
}
// One arrival on a local barrier that also expects `bytes` more to complete this phase (the
// bytes the peer's st.async stores bring).
__device__ __forceinline__ void arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
// Both CTAs of the cluster reach this point (and every thread of each).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}

}  // namespace sparse
}  // namespace openmla::cuda::sm90
