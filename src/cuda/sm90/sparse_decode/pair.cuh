// The CTA pair of the sparse decode kernel (a 2-CTA cluster; SparseDecodeParams::pair): the two
// CTAs serve m-blocks 2c and 2c + 1 of one problem (h_q 128: the two head halves of a query
// token), which read the same keys. Each CTA's producer gathers and dequantises half of every
// tile (CTA rank r: keys 32 r .. 32 r + 31) and stores the bf16 rows into its own stage; once
// its four warps are done, one thread copies them into the peer's stage (distributed shared
// memory) by bulk copies, 4 KB a piece (rows 32 r .. 32 r + 31 of a piece are contiguous), and
// the round's mask words (16 B). A tile is decoded once, not twice.
// The protocol:
//   full[s]:  4 arrivals (this CTA's producer warps), each also expecting the bytes the peer's
//             warp of the same number sends this tile (a quarter of the peer's bulk copies);
//             the copies complete them (complete_tx, which makes them visible to the barrier's
//             waiters, as a TMA multicast's); consumers wait as usual.
//   empty[s]: 16 arrivals, the 8 compute warps of each CTA (each releases both CTAs' copies of
//             the stage): a producer writes into the peer's stage only once the peer is done.
//   Both CTAs sync as a cluster after the barriers are initialised and before they exit (no CTA
//   leaves while its peer may still arrive on its barriers or store into its stages).
#pragma once

#include <cstdint>

#include "cuda/sm90/attention/primitives.cuh"

namespace openmla::cuda::sm90 {
namespace sparse_decode_detail {

using attention::smem_u32;  // (attention/primitives.cuh)
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
// `bytes` (a multiple of 16) of this CTA's shared memory at `src` into the peer's at `dst`
// (shared::cluster) by the bulk-copy engine, completing them on the peer's barrier at `bar`.
__device__ __forceinline__ void bulk_to_peer(uint32_t dst, uint32_t src, uint32_t bytes,
                                             uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
      ::"r"(dst), "r"(src), "r"(bytes), "r"(bar) : "memory");
}
__device__ __forceinline__ void st_local(uint32_t addr, const uint4& v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w));
}
// One arrival on the barrier at shared::cluster address `addr` (the peer's), as CUTLASS's
// cluster pipelines release a stage to a remote producer (default .release.cta). The pair's
// earlier form released and acquired at cluster scope and was 7% slower (NOTES.md).
__device__ __forceinline__ void arrive_peer(uint32_t addr) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(addr) : "memory");
}
// Both CTAs of the cluster reach this point (and every thread of each).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}

}  // namespace sparse_decode_detail
}  // namespace openmla::cuda::sm90
