// A paged KV cache for the GPU tests, written on the GPU by kv_cache_write from random tokens
// (a random 70% of its slots, or the slots a test names; the others keep the 0xFF fill, NaN in
// every format), with a copy of its bytes on the host for the CPU backend's reference.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/test_data.h"
#include "gpu/gpu_test_util.h"
#include "openmla/openmla.h"

namespace openmla::testing {

struct CacheSpec {
  KVFormat format = KVFormat::kFP8_V32;
  int d_qk = 576;  // bf16 only; the other formats fix it
  bool interleaved = false;
  int page = 64;
  int64_t num_blocks = 8;
  int64_t pad_bytes = 0;
};

// A random 70% of a cache's slots (at least one), ascending.
inline std::vector<int64_t> random_live_slots(const CacheSpec& s, Rng& rng) {
  std::vector<int64_t> live;
  for (int64_t slot = 0; slot < s.num_blocks * s.page; ++slot) {
    if (rng.coin(0.7)) live.push_back(slot);
  }
  if (live.empty()) live.push_back(0);
  return live;
}

// A cache on the GPU written by kv_cache_write (a random 70% of its slots, or exactly
// `live_slots`, ascending), and its bytes on the host for the CPU reference.
struct TestCache {
  DeviceBuffer device;
  KVCache gpu;
  HostKVCache host;
  std::vector<int64_t> live;

  TestCache(const CacheSpec& s, Rng& rng) : TestCache(s, rng, random_live_slots(s, rng)) {}
  TestCache(const CacheSpec& s, Rng& rng, std::vector<int64_t> live_slots)
      : host(test_layout(s.format, s.page, s.d_qk, s.interleaved, s.pad_bytes), s.num_blocks),
        live(std::move(live_slots)) {
    const KVLayout& layout = host.cache.layout;
    device = DeviceBuffer(host.buffer.bytes());
    device.fill_bytes(0xFF);
    gpu = host.cache;
    gpu.data = device.data();
    gpu.device = Device::cuda(0);
    if (live.empty()) return;  // every slot NaN
    const int d = kv_format_info(layout.format, layout.d_qk).d_qk;
    std::vector<float> rows;
    std::vector<int32_t> slots;
    for (int64_t slot : live) {
      const std::vector<float> x = random_token(rng, d);
      rows.insert(rows.end(), x.begin(), x.end());
      slots.push_back(static_cast<int32_t>(slot));
    }
    DeviceBuffer d_rows = to_device(rows), d_slots = to_device(slots);
    KVCacheWriteArgs w;
    w.kv = TensorView::contiguous(d_rows.data(), DType::kFP32,
                                  {static_cast<int64_t>(slots.size()), d}, Device::cuda(0));
    w.slot_mapping = TensorView::contiguous(d_slots.data(), DType::kInt32,
                                            {static_cast<int64_t>(slots.size())}, Device::cuda(0));
    w.cache = gpu;
    const Status st = kv_cache_write(w);
    if (!st.ok()) throw std::runtime_error("kv_cache_write: " + st.message());
    synchronize();
    device.copy_to_host(host.buffer.data(), host.buffer.bytes());
  }
  int64_t num_slots() const { return host.cache.num_tokens(); }
};

}  // namespace openmla::testing
