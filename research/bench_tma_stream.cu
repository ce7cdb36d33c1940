// How fast one SM can pull the dense decode kernel's KV tiles into shared memory, with nothing
// else running: one CTA per SM streams 64-key x 64-dim boxes (8 KB, the kernel's TMA piece) of a
// bf16 paged cache laid out as the kernel reads it (d 576, page 64), keeping `slots` boxes in
// flight, issued by TMA from 1, 2 or 4 threads (lane 0 of as many warps), by 2 or 4 lanes of one
// warp, or as 32 KB boxes of 4 pieces (a 5-D map: dim, token, piece, head, block), or copied by
// all 128 threads with cp.async (the LSU path). The boxes come from DRAM (every SM its own
// blocks), half from L2 (SM pairs read the same blocks, as the two m-blocks of h_q 128 do), or all
// from L2 (256 blocks shared by all). Last, the small-page boxes (64 dims x 16 or 8 keys, 2 or
// 1 KB, one a (page, piece) as the kernel loads pages under 64 keys) from DRAM, by how many
// threads issue and how many are in flight: whether a box count or a byte count caps the stream.
// NOTES.md (dense_decode at a9319d7, v9, session 18) says what the figures decided.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kv_stream.cuh"

namespace {

using namespace openmla::bench;

constexpr int kThreads = 128;
constexpr int kMaxSlots = 128;     // boxes in flight: 24 of 8 KB, 96 of 2 KB, 128 of 1 KB
constexpr int kPieces = kKvPieces;
constexpr int kBoxBytes = kKvBoxBytes;
constexpr int kTokenBytes = kKvTokenBytes;

struct Params {
  const char* cache;  // [blocks][64 tokens][576] bf16
  int boxes;          // per CTA
  int slots;          // boxes in flight per CTA
  int issuers;        // TMA: threads issuing (warps x lanes); 0: cp.async path
  int lanes;          // issuing lanes per warp (lanes 0, 32/lanes, ...): warps = issuers / lanes
  int box_pieces;     // 8 KB pieces a box: 1 (the 4-D map) or 4 (the 5-D map, pieces 0-3 / 4-7)
  int mode;           // 0 own blocks (DRAM), 1 SM pairs share blocks, 2 all share 256 blocks
  int blocks_per_cta;
  int page;           // keys a block (and a box): 64, or 16 / 8 (the map `map_small`)
};

__device__ __forceinline__ int block_of(const Params& p, int n) {
  const int b = p.box_pieces == 4 ? n / 2 : n / kPieces;
  if (p.mode == 2) return b % 256;
  const int owner = p.mode == 1 ? blockIdx.x / 2 : blockIdx.x;
  return owner * p.blocks_per_cta + b % p.blocks_per_cta;
}

__global__ void __launch_bounds__(kThreads, 1)
    stream_kernel(const __grid_constant__ CUtensorMap map, const __grid_constant__ CUtensorMap map5,
                  const __grid_constant__ CUtensorMap map_small, const Params p) {
  extern __shared__ __align__(1024) char smem[];
  __shared__ alignas(8) uint64_t full[kMaxSlots];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint32_t smem_base = smem_address(smem);
  if (p.issuers > 0) {
    if (threadIdx.x == 0) init_barriers(full, p.slots);
    __syncthreads();
    const int warps = p.issuers / p.lanes, lane_step = 32 / p.lanes;
    if (lane % lane_step != 0 || warp >= warps) return;
    const int me = warp + warps * (lane / lane_step);  // issuer index
    const int box_bytes = kBoxBytes * p.box_pieces * p.page / 64;
    // Slot s always holds boxes n = s (mod slots), issued by issuer n mod issuers (slots is a
    // multiple of issuers), which waits for the slot's previous box before reusing it.
    for (int n = me; n < p.boxes; n += p.issuers) {
      const int s = n % p.slots;
      const uint32_t bar = smem_address(&full[s]);
      if (n >= p.slots) wait_parity(bar, ((n / p.slots) - 1) & 1);  // its previous box landed
      expect_bytes(bar, box_bytes);
      const int block = block_of(p, n);
      if (p.box_pieces == 4) {
        asm volatile(
            "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes"
            " [%0], [%1, {%3, %4, %5, %6, %7}], [%2];" ::"r"(smem_base + s * box_bytes),
            "l"(&map5), "r"(bar), "r"(0), "r"(0), "r"((n % 2) * 4), "r"(0), "r"(block) : "memory");
      } else {
        load_kv_box(p.page == 64 ? &map : &map_small, smem_base + s * box_bytes, bar, n % kPieces,
                    block);
      }
    }
    // Drain: wait for the last box of every slot this thread filled.
    for (int s = 0; s < p.slots; ++s) {
      const int last = ((p.boxes - 1 - s) / p.slots) * p.slots + s;  // last n with n % slots == s
      if (last < 0 || last % p.issuers != me) continue;
      wait_parity(smem_address(&full[s]), (last / p.slots) & 1);
    }
    return;
  }
  // cp.async: every thread copies 4 x 16 B of each box (row = token, 8 chunks of 16 B a row),
  // keeping `slots` boxes (commit groups) in flight.
  for (int n = 0; n < p.boxes; ++n) {
    const int s = n % p.slots, c = n % kPieces, block = block_of(p, n);
    const char* src = p.cache + static_cast<int64_t>(block) * 64 * kTokenBytes + c * 128;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int idx = k * kThreads + threadIdx.x, row = idx / 8, ch = idx % 8;
      const uint32_t dst = smem_base + s * kBoxBytes + row * 128 + ((ch ^ (row & 7)) << 4);
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst),
                   "l"(src + row * kTokenBytes + ch * 16) : "memory");
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
    switch (p.slots) {  // wait_group takes an immediate
      case 4: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
      case 8: asm volatile("cp.async.wait_group 7;" ::: "memory"); break;
      case 12: asm volatile("cp.async.wait_group 11;" ::: "memory"); break;
      case 16: asm volatile("cp.async.wait_group 15;" ::: "memory"); break;
      default: asm volatile("cp.async.wait_group 23;" ::: "memory"); break;
    }
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "properties");
  const int sms = prop.multiProcessorCount;
  const int blocks_per_cta = 512;  // 36.9 MB a CTA: the whole cache is 4.9 GB, far above L2
  const size_t blocks = static_cast<size_t>(sms) * blocks_per_cta;
  const size_t bytes = blocks * 64 * kTokenBytes;
  char* cache = nullptr;
  check(cudaMalloc(&cache, bytes), "malloc");
  check(cudaMemset(cache, 0x3c, bytes), "memset");

  const auto encode = tensor_map_encoder();
  CUtensorMap map;
  if (!encode_kv_map(encode, &map, cache, blocks, CU_TENSOR_MAP_L2_PROMOTION_L2_256B)) return 1;
  // The same cache as (dim in piece, token, piece, head, block): a box of 4 pieces lands as the
  // kernel's 4 consecutive 8 KB pieces (piece-major, then token, then 64 dims).
  CUtensorMap map5;
  cuuint64_t dims5[5] = {64, 64, 9, 1, blocks};
  cuuint64_t strides5[4] = {kTokenBytes, 128, 64ull * kTokenBytes, 64ull * kTokenBytes};
  cuuint32_t box5[5] = {64, 64, 4, 1, 1}, estr5[5] = {1, 1, 1, 1, 1};
  const bool have_map5 =
      encode(&map5, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 5, cache, dims5, strides5, box5, estr5,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
  if (!have_map5) std::printf("5-D map (32 KB boxes) refused by cuTensorMapEncodeTiled\n\n");
  // Pages of 16 and 8 keys: the same bytes as blocks of fewer keys, one box a (page, piece).
  CUtensorMap map16, map8;
  if (!encode_kv_map(encode, &map16, cache, blocks * 4, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, 16) ||
      !encode_kv_map(encode, &map8, cache, blocks * 8, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, 8)) {
    return 1;
  }
  const int smem_bytes = 24 * kBoxBytes + 1024;  // the most any variant keeps in flight: 192 KB
  check(cudaFuncSetAttribute(stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes),
        "attr");
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  const char* modes[] = {"DRAM (own blocks)", "SM pairs share", "L2 (256 blocks)"};
  std::printf("## KV-tile streaming into shared memory, %s (%d SMs), one CTA per SM\n\n", prop.name, sms);
  std::printf("| source | path | boxes in flight (KB) | GB/s | GB/s per SM |\n|---|---|---|---|---|\n");
  struct V { int issuers, lanes, box_pieces, slots, page = 64; };
  auto run = [&](int mode, const V& v) {
    if (v.box_pieces == 4 && !have_map5) return;
    // The same bytes a CTA every way: 9 pieces a block as 8 KB boxes, 8 as 32 KB ones, and as many
    // more boxes as a block has pages.
    const int pages_per_block = 64 / v.page;
    const int boxes = v.box_pieces == 4 ? blocks_per_cta * 2 : blocks_per_cta * pages_per_block * kPieces;
    Params p{cache, boxes, v.slots, v.issuers, v.lanes, v.box_pieces, mode,
             blocks_per_cta * pages_per_block, v.page};
    std::vector<float> ms;
    for (int it = 0; it < 6; ++it) {
      cudaEventRecord(a);
      stream_kernel<<<sms, kThreads, smem_bytes>>>(map, map5, v.page == 8 ? map8 : map16, p);
      cudaEventRecord(b);
      check(cudaEventSynchronize(b), "run");
      float t = 0.f;
      cudaEventElapsedTime(&t, a, b);
      if (it > 0) ms.push_back(t);
    }
    check(cudaGetLastError(), "kernel");
    std::sort(ms.begin(), ms.end());
    const double box_kb = 8.0 * v.box_pieces / pages_per_block;
    const double moved = static_cast<double>(sms) * p.boxes * box_kb * 1024;
    const double gbs = moved / (ms[ms.size() / 2] * 1e-3) / 1e9;
    char path[112];
    if (v.issuers == 0) {
      std::snprintf(path, sizeof(path), "cp.async, 128 threads");
    } else {
      std::snprintf(path, sizeof(path), "TMA %g KB boxes%s, %d thread%s (%d warp%s x %d lane%s)",
                    box_kb, v.page < 64 ? (v.page == 16 ? " (pages of 16)" : " (pages of 8)") : "",
                    v.issuers, v.issuers > 1 ? "s" : "", v.issuers / v.lanes,
                    v.issuers / v.lanes > 1 ? "s" : "", v.lanes, v.lanes > 1 ? "s" : "");
    }
    std::printf("| %s | %s | %d (%g) | %.0f | %.1f |\n", modes[mode], path, v.slots,
                v.slots * box_kb, gbs, gbs / sms);
  };
  for (int mode : {0, 1, 2}) {
    const V variants[] = {{1, 1, 1, 8},  {1, 1, 1, 16}, {2, 1, 1, 16}, {4, 1, 1, 16},
                          {2, 2, 1, 16}, {4, 4, 1, 16}, {8, 2, 1, 16}, {8, 2, 1, 24},
                          {1, 1, 4, 2},  {1, 1, 4, 4},  {2, 1, 4, 4},  {4, 1, 4, 4},
                          {0, 1, 1, 8},  {0, 1, 1, 16}};
    for (const V& v : variants) run(mode, v);
  }
  // Small pages from DRAM: the kernel's walk issues from 4 threads (2 warps a stage), a part of 4
  // pieces x 4 pages at p16 (16 boxes of 2 KB) a thread pair.
  const V small[] = {{4, 1, 1, 16, 16}, {4, 1, 1, 32, 16}, {4, 1, 1, 64, 16}, {8, 2, 1, 64, 16},
                     {16, 4, 1, 64, 16}, {4, 1, 1, 96, 16}, {4, 1, 1, 64, 8}, {8, 2, 1, 128, 8},
                     {16, 4, 1, 128, 8}};
  for (const V& v : small) run(0, v);
  cudaFree(cache);
  return 0;
}
