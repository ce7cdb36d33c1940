// The CTA pair of the sparse decode kernel (a 2-CTA cluster; SparseDecodeParams::pair): the two
// CTAs serve m-blocks 2c and 2c + 1 of one problem (h_q 128: the two head halves of a query
// token), which read the same keys. Each CTA's producer gathers and dequantises half of every
// tile (CTA rank r: keys 32 r .. 32 r + 31) and stores the bf16 rows into both CTAs' stages
// (distributed shared memory), so a tile is decoded once, not twice. The protocol:
//   full[s]:  8 arrivals, the 4 producer warps of each CTA (the peer's by a release.cluster
//             arrive after its remote stores and an async-proxy fence); consumers wait with
//             acquire.cluster semantics, then wgmma reads the stage.
//   empty[s]: 16 arrivals, the 8 compute warps of each CTA (each releases both CTAs' copies of
//             the stage): a producer writes into the peer's stage only once the peer is done.
//   Both CTAs sync as a cluster after the barriers are initialised and before they exit (no CTA
//   leaves while its peer may still arrive on its barriers).
#pragma once

#include <cstdint>

namespace openmla::cuda::sm90 {
namespace sparse_decode_detail {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
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
__device__ __forceinline__ void st_peer(uint32_t addr, const uint4& v) {
  asm volatile("st.shared::cluster.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v.x),
               "r"(v.y), "r"(v.z), "r"(v.w));
}
__device__ __forceinline__ void st_local(uint32_t addr, const uint4& v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w));
}
__device__ __forceinline__ void st_peer_u8(uint32_t addr, uint32_t v) {
  asm volatile("st.shared::cluster.u8 [%0], %1;" ::"r"(addr), "r"(v));
}
// The generic-proxy stores into either CTA's shared memory before wgmma (async proxy) reads them.
__device__ __forceinline__ void fence_async_cluster() {
  asm volatile("fence.proxy.async.shared::cluster;" ::: "memory");
}
// One arrival on the barrier at shared::cluster address `addr` (the peer's), releasing this
// thread's earlier writes at cluster scope.
__device__ __forceinline__ void arrive_peer(uint32_t addr) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(addr)
               : "memory");
}
// Waits for the phase with parity `phase` of a local barrier that the peer also arrives on:
// acquire at cluster scope, so the peer's stores before its arrival are visible.
__device__ __forceinline__ void wait_cluster(uint64_t* barrier, uint32_t phase) {
  asm volatile(
      "{\n\t.reg .pred P1;\n"
      "WAIT:\n\t"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 P1, [%0], %1;\n\t"
      "@P1 bra DONE;\n\t"
      "bra WAIT;\n"
      "DONE:\n\t}" ::"r"(smem_u32(barrier)),
      "r"(phase)
      : "memory");
}
// Both CTAs of the cluster reach this point (and every thread of each).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}

}  // namespace sparse_decode_detail
}  // namespace openmla::cuda::sm90
