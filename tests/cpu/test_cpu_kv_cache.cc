// KV-cache write and gather on the CPU backend (through the public API). The reference is the
// codec itself, run serially: after a write the whole cache must equal, byte for byte, a copy
// written slot by slot with codec::encode_slot (so skipped slots and every gap stay untouched);
// a gather must equal codec::decode_slot (zeros for an invalid slot). The round trip through a
// quantised format is also bounded: ‖decoded − x‖/‖x‖ per token <= 1e-6 for bf16/fp16 input
// held in a 16-bit cache of the same type, 0.05 for the fp8 formats, 0.2 for fp4.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common/test_data.h"
#include "core/codec.h"
#include "openmla/openmla.h"

namespace openmla::testing {
namespace {

struct FormatSpec {
  KVFormat format;
  int d_qk;
  double round_trip_tol;
};

const FormatSpec kFormats[] = {
    {KVFormat::kBF16, 576, 1e-6},       {KVFormat::kBF16, 512, 1e-6},
    {KVFormat::kFP16, 576, 1e-3},       {KVFormat::kFP8_V32, 576, 0.05},
    {KVFormat::kFP8_Model1, 512, 0.05}, {KVFormat::kFP8_MX, 512, 0.05},
    {KVFormat::kFP4, 512, 0.2},
};

HostTensor slots_tensor(const std::vector<int64_t>& slots, DType dtype) {
  HostTensor t(dtype, {static_cast<int64_t>(slots.size())});
  for (size_t i = 0; i < slots.size(); ++i)
    t.set({static_cast<int64_t>(i)}, static_cast<double>(slots[i]));
  return t;
}

// n distinct valid slots in random order, with -1 and out-of-range entries mixed in.
std::vector<int64_t> random_slots(int64_t n, int64_t num_slots, Rng& rng) {
  const std::vector<int32_t> perm = random_permutation(num_slots, rng);
  std::vector<int64_t> slots;
  for (int64_t i = 0; i < n; ++i) {
    const double u = rng.uniform(0, 1);
    if (u < 0.15) {
      slots.push_back(-1);
    } else if (u < 0.2) {
      slots.push_back(-rng.randint(2, 1000));
    } else if (u < 0.25) {
      slots.push_back(num_slots + rng.randint(0, 1000));
    } else {
      slots.push_back(perm[i]);
    }
  }
  return slots;
}

TEST(CpuKVCache, WriteMatchesSerialCodecByteForByte) {
  uint64_t seed = 100;
  for (const FormatSpec& f : kFormats) {
    for (bool interleaved : {false, true}) {
      for (DType slot_dtype : {DType::kInt32, DType::kInt64}) {
        for (DType kv_dtype : {DType::kBF16, DType::kFP32}) {
          SCOPED_TRACE(::testing::Message()
                       << kv_format_name(f.format) << " d=" << f.d_qk
                       << (interleaved ? " interleaved " : " ") << dtype_name(slot_dtype) << " "
                       << dtype_name(kv_dtype));
          Rng rng(seed++);
          const int page = 16;
          const int64_t num_blocks = 5, n = 60;
          const KVLayout layout = test_layout(f.format, page, f.d_qk, interleaved, 32);
          HostKVCache cache(layout, num_blocks, 0xA5), expected(layout, num_blocks, 0xA5);
          const std::vector<int64_t> slots = random_slots(n, cache.cache.num_tokens(), rng);
          HostTensor kv(kv_dtype, {n, f.d_qk});
          for (int64_t i = 0; i < n; ++i) {
            const std::vector<float> x = random_token(rng, f.d_qk);
            for (int d = 0; d < f.d_qk; ++d) kv.set({i, d}, x[d]);
          }
          HostTensor slot_t = slots_tensor(slots, slot_dtype);
          KVCacheWriteArgs args;
          args.kv = kv.view();
          args.slot_mapping = slot_t.view();
          args.cache = cache.cache;
          const Status st = kv_cache_write(args);
          ASSERT_TRUE(st.ok()) << st.message();

          for (int64_t i = 0; i < n; ++i) {
            if (slots[i] < 0 || slots[i] >= expected.cache.num_tokens()) continue;
            std::vector<float> x(f.d_qk);
            for (int d = 0; d < f.d_qk; ++d) x[d] = static_cast<float>(kv.get({i, d}));
            codec::encode_slot(expected.cache, slots[i], x.data());
          }
          ASSERT_EQ(std::memcmp(cache.buffer.data(), expected.buffer.data(), cache.buffer.bytes()),
                    0);
        }
      }
    }
  }
}

// Rows naming one slot: one of them lands whole (which one is unspecified).
TEST(CpuKVCache, DuplicateSlotsLandOneWholeRow) {
  uint64_t seed = 200;
  for (const FormatSpec& f : kFormats) {
    SCOPED_TRACE(kv_format_name(f.format));
    Rng rng(seed++);
    const KVLayout layout = default_kv_layout(f.format, 4, f.d_qk);
    HostKVCache cache(layout, 2, 0);
    const std::vector<int64_t> slots = {3, 5, 3, 3, 5, 0};
    HostTensor kv(DType::kFP32, {6, f.d_qk});
    std::vector<std::vector<float>> rows;
    for (int64_t i = 0; i < 6; ++i) {
      rows.push_back(random_token(rng, f.d_qk));
      for (int d = 0; d < f.d_qk; ++d) kv.set({i, d}, rows.back()[d]);
    }
    HostTensor slot_t = slots_tensor(slots, DType::kInt64);
    KVCacheWriteArgs args;
    args.kv = kv.view();
    args.slot_mapping = slot_t.view();
    args.cache = cache.cache;
    ASSERT_TRUE(kv_cache_write(args).ok());
    for (int64_t slot : {0, 3, 5}) {
      std::vector<float> got(f.d_qk), want(f.d_qk);
      codec::decode_slot(cache.cache, slot, got.data());
      bool matched = false;
      for (int64_t i = 0; i < 6; ++i) {
        if (slots[i] != slot) continue;
        HostKVCache one(layout, 2, 0);
        codec::encode_slot(one.cache, slot, rows[i].data());
        codec::decode_slot(one.cache, slot, want.data());
        matched |= std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0;
      }
      EXPECT_TRUE(matched) << "slot " << slot;
    }
  }
}

TEST(CpuKVCache, GatherDecodesAndZeroesInvalidSlots) {
  uint64_t seed = 300;
  for (const FormatSpec& f : kFormats) {
    for (DType out_dtype : {DType::kFP32, DType::kBF16}) {
      SCOPED_TRACE(::testing::Message()
                   << kv_format_name(f.format) << " -> " << dtype_name(out_dtype));
      Rng rng(seed++);
      const KVLayout layout = test_layout(f.format, 64, f.d_qk, false, 0);
      HostKVCache cache(layout, 2);
      std::vector<int64_t> all(cache.cache.num_tokens());
      for (size_t s = 0; s < all.size(); ++s) all[s] = static_cast<int64_t>(s);
      fill_random_cache(&cache, rng, all);
      const std::vector<int64_t> slots = random_slots(40, cache.cache.num_tokens(), rng);
      HostTensor slot_t = slots_tensor(slots, DType::kInt32);
      HostTensor out(out_dtype, {40, f.d_qk}, {f.d_qk + 8, 1});
      out.poison();
      KVCacheGatherArgs args;
      args.cache = cache.cache;
      args.slots = slot_t.view();
      args.out = out.view();
      const Status st = kv_cache_gather(args);
      ASSERT_TRUE(st.ok()) << st.message();
      std::vector<float> ref(f.d_qk);
      for (int64_t i = 0; i < 40; ++i) {
        const bool valid = slots[i] >= 0 && slots[i] < cache.cache.num_tokens();
        if (valid) codec::decode_slot(cache.cache, slots[i], ref.data());
        for (int d = 0; d < f.d_qk; ++d) {
          const double want = !valid ? 0.0
                              : out_dtype == DType::kFP32
                                  ? ref[d]
                                  : bf16_bits_to_double(double_to_bf16_bits(ref[d]));
          ASSERT_EQ(out.get({i, d}), want) << "row " << i << " dim " << d;
        }
      }
      EXPECT_EQ(count_written_gaps(out), 0);
    }
  }
}

TEST(CpuKVCache, WriteThenGatherRoundTrip) {
  uint64_t seed = 400;
  for (const FormatSpec& f : kFormats) {
    SCOPED_TRACE(kv_format_name(f.format));
    Rng rng(seed++);
    const KVLayout layout = default_kv_layout(f.format, 16, f.d_qk);
    HostKVCache cache(layout, 4);
    const int64_t n = 64;
    const std::vector<int32_t> perm = random_permutation(n, rng);
    std::vector<int64_t> slots(perm.begin(), perm.end());
    // bf16 input: exact in a bf16 cache; fp16 caches round it to fp16.
    HostTensor kv(DType::kBF16, {n, f.d_qk});
    for (int64_t i = 0; i < n; ++i) {
      const std::vector<float> x = random_token(rng, f.d_qk);
      for (int d = 0; d < f.d_qk; ++d) kv.set({i, d}, x[d]);
    }
    HostTensor slot_t = slots_tensor(slots, DType::kInt64), out(DType::kFP32, {n, f.d_qk});
    KVCacheWriteArgs write;
    write.kv = kv.view();
    write.slot_mapping = slot_t.view();
    write.cache = cache.cache;
    ASSERT_TRUE(kv_cache_write(write).ok());
    KVCacheGatherArgs gather;
    gather.cache = cache.cache;
    gather.slots = slot_t.view();
    gather.out = out.view();
    ASSERT_TRUE(kv_cache_gather(gather).ok());
    double worst = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      std::vector<double> x(f.d_qk), y(f.d_qk);
      for (int d = 0; d < f.d_qk; ++d) {
        x[d] = kv.get({i, d});
        y[d] = out.get({i, d});
      }
      worst = std::max(worst, relative_l2_error(y, x));
    }
    if (verbose())
      std::printf("round trip %s: worst token rel %.2e\n", kv_format_name(f.format), worst);
    EXPECT_LE(worst, f.round_trip_tol);
  }
}

}  // namespace
}  // namespace openmla::testing
