// What the two KV-stream benchmarks (bench_tma_stream.cu, bench_l2_state.cu) share: the decode
// kernel's cache map (bf16, d 576, pages of 64 keys, one kv head; 8 KB boxes of 64 keys x 64
// dims, 128 B swizzle) and the mbarrier steps of a TMA stream.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace openmla::bench {

// A CUDA call that must succeed: else the message and exit.
inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

constexpr int kKvPieces = 9;          // 64-dim pieces of a 576-dim key
constexpr int kKvBoxBytes = 64 * 128;  // one piece of 64 keys
constexpr int kKvTokenBytes = 576 * 2;

// The driver's cuTensorMapEncodeTiled (no libcuda link needed), or null.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                       &q) != cudaSuccess) {
    return nullptr;
  }
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
}

// The cache [blocks][page keys][576] as (dim, key, head, block) with one box a (page, piece): 64
// dims x `page` keys (pages of 64: the kernel's 8 KB piece; 8-32: its small-page boxes). False
// (and a message) when the driver refuses it.
inline bool encode_kv_map(PFN_cuTensorMapEncodeTiled_v12000 encode, CUtensorMap* map, void* cache,
                          size_t blocks, CUtensorMapL2promotion promotion, int page = 64) {
  const cuuint64_t keys = static_cast<cuuint64_t>(page);
  cuuint64_t dims[4] = {576, keys, 1, blocks};
  cuuint64_t strides[3] = {kKvTokenBytes, keys * kKvTokenBytes, keys * kKvTokenBytes};
  cuuint32_t box[4] = {64, static_cast<cuuint32_t>(page), 1, 1}, estr[4] = {1, 1, 1, 1};
  if (encode == nullptr ||
      encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, cache, dims, strides, box, estr,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, promotion,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
    std::fprintf(stderr, "the KV tensor map was refused\n");
    return false;
  }
  return true;
}

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Barriers of one arrival each (thread 0; the caller syncs the block after).
__device__ __forceinline__ void init_barriers(uint64_t* bars, int n) {
  for (int s = 0; s < n; ++s) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_address(&bars[s])));
  }
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void wait_parity(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n\t.reg .pred done;\n\tWAIT:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t"
      "@!done bra WAIT;\n\t}" ::"r"(bar), "r"(parity) : "memory");
}

__device__ __forceinline__ void expect_bytes(uint32_t bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}

// Piece `piece` of block `block` into dst, completing `bar`, with an L2 policy (hinted) or none.
__device__ __forceinline__ void load_kv_box(const CUtensorMap* map, uint32_t dst, uint32_t bar,
                                            int piece, int block) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];" ::"r"(dst),
      "l"(map), "r"(bar), "r"(piece * 64), "r"(0), "r"(0), "r"(block) : "memory");
}
__device__ __forceinline__ void load_kv_box_hinted(const CUtensorMap* map, uint32_t dst,
                                                   uint32_t bar, int piece, int block,
                                                   uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".L2::cache_hint [%0], [%1, {%3, %4, %5, %6}], [%2], %7;" ::"r"(dst),
      "l"(map), "r"(bar), "r"(piece * 64), "r"(0), "r"(0), "r"(block), "l"(policy) : "memory");
}

}  // namespace openmla::bench
