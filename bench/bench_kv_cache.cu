// KV-cache kernels benchmark (docs/benchmarking.md): the device's copy bandwidth, then appending 4096 bf16
// tokens into every format and converting a 1 GiB cache between formats, as GB/s of bytes read +
// written and as a share of the copy bandwidth measured in the same run. CUDA-event timings of
// each launch, the L2 flushed (a memset over max(256 MiB, 4 x L2)) before each, median of 15
// after 3 warm-ups. Each measured operation is also checked against the host codec on a few of
// its blocks/tokens, so a wrong kernel cannot report a good number.
//
// Prints markdown table rows for bench/RESULTS.md. Exit status 1 on any error or mismatch.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "core/codec.h"
#include "core/validate.h"
#include "cuda/common/kv_cache_kernels.h"
#include "openmla/openmla.h"

namespace {

using namespace openmla;

constexpr int kWarmups = 3;
constexpr int kTimedRuns = 15;
constexpr int64_t kGiB = int64_t{1} << 30;
constexpr int kPage = 64;

bool g_failed = false;

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "FATAL: %s: %s\n", what, cudaGetErrorString(err));
    std::exit(1);
  }
}
void check(const Status& st, const char* what) {
  if (!st.ok()) {
    std::fprintf(stderr, "FATAL: %s: %s\n", what, st.message().c_str());
    std::exit(1);
  }
}

struct Flusher {
  void* buffer = nullptr;
  size_t bytes = 0;
  explicit Flusher(size_t l2_bytes) : bytes(std::max<size_t>(256u << 20, 4 * l2_bytes)) {
    check(cudaMalloc(&buffer, bytes), "cudaMalloc (L2 flush buffer)");
  }
  ~Flusher() { (void)cudaFree(buffer); }
  void flush() { check(cudaMemsetAsync(buffer, 0, bytes), "L2 flush memset"); }
};

// Median of kTimedRuns event timings of `run` (µs), the L2 flushed before each.
template <typename F>
double time_median_us(Flusher& flusher, F&& run) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  for (int i = 0; i < kWarmups; ++i) run();
  std::vector<double> us;
  for (int i = 0; i < kTimedRuns; ++i) {
    flusher.flush();
    check(cudaEventRecord(start), "cudaEventRecord");
    run();
    check(cudaEventRecord(stop), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    us.push_back(ms * 1e3);
  }
  check(cudaGetLastError(), "after timed runs");
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

// Fills a bf16 buffer with N(0,1)-ish values scaled per 32 dims by 2^[-3,3] (a hash, so no RNG
// state), the kind of data the quantisers see.
__global__ void fill_bf16_kernel(uint16_t* data, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13, h *= 3266489917u, h ^= h >> 16;
    // Sum of four uniforms, centred: roughly normal.
    const float u =
        ((h & 0xFF) + ((h >> 8) & 0xFF) + ((h >> 16) & 0xFF) + (h >> 24)) / 255.0f - 2.0f;
    const int group_exponent = static_cast<int>(((i / 32) * 2654435761u >> 7) % 7) - 3;
    const float x = ldexpf(u * 1.7f, group_exponent);
    data[i] = static_cast<uint16_t>(__float_as_uint(x) >> 16);
  }
}

struct DeviceCache {
  void* data = nullptr;
  KVCache cache;
  size_t bytes = 0;
  DeviceCache(KVFormat format, int d_qk, int64_t num_blocks) {
    cache.layout = default_kv_layout(format, kPage, d_qk);
    cache.num_blocks = num_blocks;
    cache.device = Device::cuda(0);
    bytes = static_cast<size_t>(num_blocks * cache.layout.block_stride);
    check(cudaMalloc(&data, bytes), "cudaMalloc (cache)");
    check(cudaMemset(data, 0, bytes), "cudaMemset (cache)");
    cache.data = data;
  }
  ~DeviceCache() { (void)cudaFree(data); }
  DeviceCache(const DeviceCache&) = delete;
  DeviceCache& operator=(const DeviceCache&) = delete;
};

int64_t token_bytes(KVFormat format, int d_qk) {
  return kv_format_info(format, d_qk).bytes_per_token;
}

std::string format_label(KVFormat format, int d_qk) {
  return std::string(kv_format_name(format)) +
         (format == KVFormat::kBF16 || format == KVFormat::kFP16 ? " " + std::to_string(d_qk) : "");
}

// Host check of one block pair: dst block == encode(decode(src block)) for every token.
bool check_block(const DeviceCache& src, const DeviceCache& dst, int64_t block) {
  std::vector<uint8_t> s(src.cache.layout.block_stride), d(dst.cache.layout.block_stride),
      want(d.size());
  check(cudaMemcpy(s.data(), codec::block_ptr(src.cache.data, src.cache.layout, block), s.size(),
                   cudaMemcpyDeviceToHost),
        "D2H");
  check(cudaMemcpy(d.data(), codec::block_ptr(dst.cache.data, dst.cache.layout, block), d.size(),
                   cudaMemcpyDeviceToHost),
        "D2H");
  want = d;  // bytes outside the tokens' parts stay as they are
  const int d_qk = kv_format_info(src.cache.layout.format, src.cache.layout.d_qk).d_qk;
  std::vector<float> row(d_qk);
  for (int t = 0; t < kPage; ++t) {
    codec::decode_token(src.cache.layout, s.data(), t, row.data());
    codec::encode_token(dst.cache.layout, row.data(), want.data(), t);
  }
  return want == d;
}

void print_row(const char* date, const char* gpu, const std::string& op, const std::string& shape,
               double us, double bytes, double copy_gbps, const char* verdict) {
  const double gbps = bytes / (us * 1e-6) / 1e9;
  std::printf("| %s | %s | %s | %s | %.1f | %.0f | %.0f%% | %s |\n", date, gpu, op.c_str(),
              shape.c_str(), us, gbps, copy_gbps > 0 ? 100.0 * gbps / copy_gbps : 100.0, verdict);
  std::fflush(stdout);
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  char date[16];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%d", std::gmtime(&now));
  std::printf("# openmla_bench_kv_cache on %s (%d SMs, L2 %.0f MiB, sm_%d%d)\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize / 1048576.0, prop.major, prop.minor);
  std::printf(
      "# GB/s = (bytes read + bytes written) / time; %% = of the device-to-device copy bandwidth "
      "of this run; µs = median of %d CUDA-event timings, L2 flushed before each\n\n",
      kTimedRuns);
  std::printf("| date | GPU | operation | shape | µs | GB/s | of copy | check |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  Flusher flusher(static_cast<size_t>(prop.l2CacheSize));

  // --- the ceiling: device-to-device copy of 1 GiB (read + write counted) ---------------------
  double copy_gbps = 0;
  {
    void *a = nullptr, *b = nullptr;
    check(cudaMalloc(&a, kGiB), "cudaMalloc (copy src)");
    check(cudaMalloc(&b, kGiB), "cudaMalloc (copy dst)");
    check(cudaMemset(a, 1, kGiB), "cudaMemset");
    const double us = time_median_us(flusher, [&] {
      check(cudaMemcpyAsync(b, a, kGiB, cudaMemcpyDeviceToDevice), "cudaMemcpyAsync");
    });
    copy_gbps = 2.0 * kGiB / (us * 1e-6) / 1e9;
    print_row(date, prop.name, "cudaMemcpy D2D (ceiling)", "1 GiB", us, 2.0 * kGiB, copy_gbps, "-");
    (void)cudaFree(a);
    (void)cudaFree(b);
  }

  // --- append 4096 bf16 tokens into every format -----------------------------------------------
  {
    constexpr int64_t kTokens = 4096;
    struct Target {
      KVFormat format;
      int d_qk;
    };
    const Target targets[] = {{KVFormat::kBF16, 576},       {KVFormat::kFP16, 576},
                              {KVFormat::kFP8_V32, 576},    {KVFormat::kBF16, 512},
                              {KVFormat::kFP8_Model1, 512}, {KVFormat::kFP8_MX, 512},
                              {KVFormat::kFP4, 512}};
    uint16_t* kv = nullptr;
    int64_t* slots = nullptr;
    check(cudaMalloc(&kv, kTokens * 576 * 2), "cudaMalloc (kv)");
    check(cudaMalloc(&slots, kTokens * 8), "cudaMalloc (slots)");
    fill_bf16_kernel<<<512, 256>>>(kv, kTokens * 576, 17u);
    // A cache of 4x the tokens; the 4096 rows land on a scattered set of slots (one per 4).
    const int64_t num_blocks = 4 * kTokens / kPage;
    std::vector<int64_t> host_slots(kTokens);
    for (int64_t i = 0; i < kTokens; ++i)
      host_slots[i] = (i * 2654435761ll) % (kTokens)*4 + (i & 3);
    check(cudaMemcpy(slots, host_slots.data(), kTokens * 8, cudaMemcpyHostToDevice), "H2D slots");
    for (const Target& t : targets) {
      DeviceCache cache(t.format, t.d_qk, num_blocks);
      KVCacheWriteArgs args;
      args.kv = TensorView::contiguous(kv, DType::kBF16, {kTokens, t.d_qk}, Device::cuda(0));
      args.slot_mapping = TensorView::contiguous(slots, DType::kInt64, {kTokens}, Device::cuda(0));
      args.cache = cache.cache;
      core::KVCacheWriteShape shape;
      check(core::validate_kv_cache_write(args, &shape), "validate_kv_cache_write");
      const double us = time_median_us(flusher, [&] {
        check(cuda::kv_cache_write_launch(args, shape, nullptr), "kv_cache_write_launch");
      });
      // Check a few rows against the host codec.
      bool ok = true;
      std::vector<uint16_t> row_bits(t.d_qk);
      std::vector<float> row(t.d_qk);
      for (int64_t i : {int64_t{0}, kTokens / 2 + 1, kTokens - 1}) {
        check(cudaMemcpy(row_bits.data(), kv + i * t.d_qk, t.d_qk * 2, cudaMemcpyDeviceToHost),
              "D2H row");
        for (int k = 0; k < t.d_qk; ++k) row[k] = codec::bf16_to_float(row_bits[k]);
        const int64_t block = host_slots[i] / kPage, token = host_slots[i] % kPage;
        std::vector<uint8_t> got(cache.cache.layout.block_stride), want;
        check(cudaMemcpy(got.data(), codec::block_ptr(cache.cache.data, cache.cache.layout, block),
                         got.size(), cudaMemcpyDeviceToHost),
              "D2H block");
        want = got;
        codec::encode_token(cache.cache.layout, row.data(), want.data(), static_cast<int>(token));
        ok &= want == got;
      }
      g_failed |= !ok;
      const double bytes = kTokens * (2.0 * t.d_qk + 8 + token_bytes(t.format, t.d_qk));
      print_row(date, prop.name, "append bf16 -> " + format_label(t.format, t.d_qk),
                "4096 tokens, page 64", us, bytes, copy_gbps, ok ? "ok" : "MISMATCH");
    }
    (void)cudaFree(kv);
    (void)cudaFree(slots);
  }

  // --- convert a 1 GiB cache ------------------------------------------------------------------
  {
    struct Conversion {
      KVFormat from;
      KVFormat to;
      int d_qk;
    };
    const Conversion conversions[] = {{KVFormat::kBF16, KVFormat::kFP8_V32, 576},
                                      {KVFormat::kFP8_V32, KVFormat::kBF16, 576},
                                      {KVFormat::kBF16, KVFormat::kFP8_MX, 512},
                                      {KVFormat::kFP8_MX, KVFormat::kBF16, 512},
                                      {KVFormat::kBF16, KVFormat::kFP4, 512}};
    for (const Conversion& c : conversions) {
      // The source cache is 1 GiB; a quantised source is made from a bf16 cache of the same
      // block count (untimed).
      const int64_t src_block_bytes = default_kv_layout(c.from, kPage, c.d_qk).block_stride;
      const int64_t num_blocks = kGiB / src_block_bytes;
      DeviceCache src(c.from, c.d_qk, num_blocks), dst(c.to, c.d_qk, num_blocks);
      if (c.from == KVFormat::kBF16) {
        fill_bf16_kernel<<<4096, 256>>>(static_cast<uint16_t*>(src.data),
                                        static_cast<int64_t>(src.bytes / 2), 29u);
      } else {
        DeviceCache seed(KVFormat::kBF16, c.d_qk, num_blocks);
        fill_bf16_kernel<<<4096, 256>>>(static_cast<uint16_t*>(seed.data),
                                        static_cast<int64_t>(seed.bytes / 2), 29u);
        KVCacheConvertArgs make;
        make.src = seed.cache;
        make.dst = src.cache;
        check(kv_cache_convert(make), "kv_cache_convert (making the source)");
        check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
      }
      KVCacheConvertArgs args;
      args.src = src.cache;
      args.dst = dst.cache;
      const double us =
          time_median_us(flusher, [&] { check(kv_cache_convert(args), "kv_cache_convert"); });
      bool ok = true;
      for (int64_t b : {int64_t{0}, num_blocks / 2, num_blocks - 1}) ok &= check_block(src, dst, b);
      g_failed |= !ok;
      const double bytes = static_cast<double>(num_blocks) * kPage *
                           (token_bytes(c.from, c.d_qk) + token_bytes(c.to, c.d_qk));
      char shape[96];
      std::snprintf(shape, sizeof(shape), "%lld blocks x 64 (%.2f GiB -> %.2f GiB)",
                    static_cast<long long>(num_blocks), static_cast<double>(src.bytes) / kGiB,
                    static_cast<double>(dst.bytes) / kGiB);
      print_row(date, prop.name,
                "convert " + format_label(c.from, c.d_qk) + " -> " + format_label(c.to, c.d_qk),
                shape, us, bytes, copy_gbps, ok ? "ok" : "MISMATCH");
    }
  }
  std::printf("\n# target: conversions >= 70%% of the copy bandwidth; %s\n",
              g_failed ? "FAILED: a result differs from the host codec"
                       : "all results checked against the host codec");
  return g_failed ? 1 : 0;
}
