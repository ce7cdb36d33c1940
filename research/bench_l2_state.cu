// What the L2's state before a timed run costs a KV stream, by the loads' L2 policy, and what a
// kernel that does nothing but the loads pays besides its bytes.
//
// The dense decode kernel pays ~19-21 µs at h_q 16 that do not scale with the KV (b 128: 52 µs at
// 1024 keys, +33 per 1024 more; dense_decode NOTES.md at a9319d7, session 18). Part of it may be the flush:
// ANCHORS.md's flush (an 8 GiB memset) leaves ~50 MB of dirty lines in the L2, which the timed
// kernel's loads write back to DRAM as they evict them. This benchmark streams the kernel's KV
// tiles alone, as its producers do, after three L2 states, with each L2 policy on the loads:
//   dirty  the memset (the benchmarks' and FlashMLA's flush);
//   clean  the memset, then a 512 MB read (l2_state.cuh): no dirty lines left;
//   warm   nothing between runs (the previous run's lines, clean).
// 128 CTAs (b 128 on 132 SMs, one CTA an SM as the kernel), each streaming its requests' pages of
// 64 keys (d 576 bf16: nine 8 KB boxes of 64 keys x 64 dims a page) into shared memory by TMA from
// lane 0 of four warps with 16 boxes in flight, in the order of a random block table. One reader:
// CTA c streams request c. Two readers (as the two m-blocks of h_q 128 read each tile): CTAs 2k
// and 2k + 1 both stream requests 2k and 2k + 1, in step, so the second read of a tile can come
// from the L2 (the same DRAM bytes, twice the L2 reads). The time per run is the events' (as
// bench_dense_decode.cu), median of 9; "fixed" is the intercept of time against bytes (from 2048
// and 8192 keys), "GB/s" the slope (the request bytes, each counted once).
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

#include "kv_stream.cuh"
#include "../bench/l2_state.cuh"

namespace {

using namespace openmla::bench;

constexpr int kThreads = 128;
constexpr int kIssuers = 4;  // lane 0 of warps 0-3 (the kernel: two a stage, two stages)
constexpr int kSlots = 16;   // 8 KB boxes in flight a CTA (the kernel's two tiles: 18)
static_assert(kSlots % kIssuers == 0);

struct Params {
  const int32_t* table;  // [batch][pages]
  int pages;             // pages of 64 keys a request
  int policy;            // L2Policy
  int readers;           // CTAs reading each request: 1 or 2
};

__global__ void __launch_bounds__(kThreads, 1)
    stream_requests(const __grid_constant__ CUtensorMap map, const Params p) {
  extern __shared__ __align__(1024) char smem[];
  __shared__ alignas(8) uint64_t full[kSlots];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint32_t smem_base = smem_address(smem);
  if (threadIdx.x == 0) init_barriers(full, kSlots);
  __syncthreads();
  if (lane != 0 || warp >= kIssuers) return;
  const uint64_t policy = make_l2_policy(p.policy);
  // This CTA's requests: readers of them in a row, from request (c / readers) x readers.
  const int32_t* table = p.table + static_cast<int64_t>(blockIdx.x / p.readers) * p.readers * p.pages;
  const int boxes = p.pages * kKvPieces * p.readers;
  // Slot s holds boxes n = s (mod kSlots), all issued by issuer n mod kIssuers, which waits for
  // the slot's previous box before reusing it.
  for (int n = warp; n < boxes; n += kIssuers) {
    const int s = n % kSlots;
    const uint32_t bar = smem_address(&full[s]);
    if (n >= kSlots) wait_parity(bar, ((n / kSlots) - 1) & 1);
    expect_bytes(bar, kKvBoxBytes);
    const int block = table[n / kKvPieces], piece = n % kKvPieces;
    const uint32_t dst = smem_base + s * kKvBoxBytes;
    if (p.policy == kPolicyNone) {
      load_kv_box(&map, dst, bar, piece, block);
    } else {
      load_kv_box_hinted(&map, dst, bar, piece, block, policy);
    }
  }
  // Drain: the last box of every slot this thread filled.
  for (int s = warp; s < kSlots; s += kIssuers) {
    if (boxes - 1 - s < 0) continue;  // the slot was never used
    const int last = ((boxes - 1 - s) / kSlots) * kSlots + s;
    wait_parity(smem_address(&full[s]), (last / kSlots) & 1);
  }
}

// Nothing: the events' floor around a launch of the same grid.
__global__ void __launch_bounds__(kThreads, 1) empty_kernel() {}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "properties");
  constexpr int kBatch = 128;
  const int lens[] = {1024, 2048, 4096, 8192};
  const int max_pages = 8192 / 64;
  const size_t blocks = static_cast<size_t>(kBatch) * max_pages;  // 1.2 GB of KV
  char* cache = nullptr;
  check(cudaMalloc(&cache, blocks * 64 * kKvTokenBytes), "malloc cache");
  check(cudaMemset(cache, 0x3c, blocks * 64 * kKvTokenBytes), "memset cache");

  // One table a length: request r's pages are a random permutation's share of the first
  // batch x pages blocks (as bench_dense_decode.cu lays out each shape).
  std::mt19937 rng(5);
  std::vector<int32_t*> tables;
  for (int len : lens) {
    const int pages = len / 64;
    std::vector<int32_t> perm(static_cast<size_t>(kBatch) * pages);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    int32_t* d = nullptr;
    check(cudaMalloc(&d, perm.size() * 4), "malloc table");
    check(cudaMemcpy(d, perm.data(), perm.size() * 4, cudaMemcpyHostToDevice), "h2d table");
    tables.push_back(d);
  }

  // The kernel's cache map, with 128 B promotion as where one m-block reads each tile (launch.cu).
  CUtensorMap map;
  if (!encode_kv_map(tensor_map_encoder(), &map, cache, blocks, CU_TENSOR_MAP_L2_PROMOTION_L2_128B)) {
    return 1;
  }
  // Two readers: 256 B promotion, as where several m-blocks read each tile (launch.cu).
  CUtensorMap map_shared;
  if (!encode_kv_map(tensor_map_encoder(), &map_shared, cache, blocks,
                     CU_TENSOR_MAP_L2_PROMOTION_L2_256B)) {
    return 1;
  }
  const int smem_bytes = kSlots * kKvBoxBytes + 1024;
  check(cudaFuncSetAttribute(stream_requests, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             smem_bytes), "attr");

  const size_t flush_bytes = size_t{8} << 30;
  void* flush_buf = nullptr;
  unsigned* sink = nullptr;
  check(cudaMalloc(&flush_buf, flush_bytes), "malloc flush");
  check(cudaMalloc(&sink, 4), "malloc sink");
  L2Flush dirty{flush_buf, flush_bytes, nullptr, 0, sink};
  L2Flush clean{flush_buf, flush_bytes, flush_buf, size_t{512} << 20, sink};

  uint64_t values[kPolicyCount];
  check(l2_policy_table(values), "policy values");
  std::printf("## KV stream by L2 state and policy, %s (%d SMs, L2 %d MB)\n\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize >> 20);
  std::printf("createpolicy values:");
  for (int c = 1; c < kPolicyCount; ++c) {
    std::printf(" %s 0x%016llx;", l2_policy_name(c), static_cast<unsigned long long>(values[c]));
  }
  std::printf("\n\n");
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event");
  check(cudaEventCreate(&b), "event");
  const char* states[] = {"dirty (memset)", "clean (memset + read)", "warm (no flush)"};
  const int policies[] = {kPolicyNone, kPolicyNormal, kPolicyFirst, kPolicyHalfFirst,
                          kPolicyQuarterFirst, kPolicyUnchanged, kPolicyLast};
  {  // the floor every row's time includes
    std::vector<double> ms;
    for (int it = 0; it < 21; ++it) {
      check(cudaEventRecord(a), "record");
      empty_kernel<<<kBatch, kThreads>>>();
      check(cudaEventRecord(b), "record");
      check(cudaEventSynchronize(b), "empty");
      float t = 0.f;
      check(cudaEventElapsedTime(&t, a, b), "elapsed");
      if (it > 0) ms.push_back(t);
    }
    std::printf("an empty kernel of the same grid between the same events: %.1f µs (median of 20)\n\n",
                median(ms) * 1e3);
  }
  // One row: a state, a reader count and a policy at every length.
  auto time_row = [&](int state, int readers, int policy) {
    double us[4];
    for (int li = 0; li < 4; ++li) {
      const Params p{tables[li], lens[li] / 64, policy, readers};
      std::vector<double> ms;
      for (int it = 0; it < 10; ++it) {
        if (state == 0) dirty.run();
        if (state == 1) clean.run();
        check(cudaEventRecord(a), "record");
        stream_requests<<<kBatch, kThreads, smem_bytes>>>(readers == 1 ? map : map_shared, p);
        check(cudaEventRecord(b), "record");
        check(cudaEventSynchronize(b), "run");
        float t = 0.f;
        check(cudaEventElapsedTime(&t, a, b), "elapsed");
        if (it > 0) ms.push_back(t);
      }
      check(cudaGetLastError(), "kernel");
      us[li] = median(ms) * 1e3;
    }
    const double b2048 = kBatch * 2048.0 * kKvTokenBytes, b8192 = kBatch * 8192.0 * kKvTokenBytes;
    const double us_per_byte = (us[3] - us[1]) / (b8192 - b2048);
    std::printf("| %s | %d | %s | %.1f | %.1f | %.1f | %.1f | %.0f | %.1f |\n", states[state],
                readers, l2_policy_name(policy), us[0], us[1], us[2], us[3],
                1e-3 / us_per_byte, us[1] - us_per_byte * b2048);
    std::fflush(stdout);
  };
  std::printf("b 128 requests on 128 CTAs; µs (events, median of 9) at 1024 / 2048 / 4096 / "
              "8192 keys a request (151 / 302 / 604 / 1208 MB)\n\n");
  std::printf("| L2 before | readers | policy | 1024 | 2048 | 4096 | 8192 | GB/s (slope) | fixed "
              "µs (intercept) |\n|---|---|---|---|---|---|---|---|---|\n");
  for (int state = 0; state < 3; ++state) {
    for (int policy : policies) time_row(state, 1, policy);
    // Two readers: the policies that decide whether the second read of a tile hits the L2.
    for (int policy : {kPolicyNone, kPolicyNormal, kPolicyFirst}) time_row(state, 2, policy);
  }
  for (int32_t* t : tables) cudaFree(t);
  cudaFree(cache);
  cudaFree(flush_buf);
  cudaFree(sink);
  return 0;
}
