// The GPU KV-cache kernels (src/cuda/common/kv_cache_kernels.cu) against the host codec, byte for
// byte. Every case fills the host reference and the device buffer with the same sentinel byte
// first and compares EVERY byte of the whole buffer afterwards, so skipped slots, padding, gaps
// between blocks and bytes beyond a row are compared too.
//  - append: every format × layouts (default, token-interleaved, strided blocks with a gap after
//    each block, "odd": every offset and stride shifted to the format's smallest legal alignment,
//    so 16 B accesses fall back to 8/4/2/1 B) × page sizes 1, 16, 64 × bf16/fp32 rows (padded, the
//    base misaligned) × int32/int64 slot maps with -1, negative and out-of-range entries; inputs
//    from common/kv_test_tokens.h (magnitudes 1e-30..3e38, scale-boundary powers of two, ±inf,
//    NaN payloads, subnormals, rounding ties, all-zero/inf/NaN groups).
//  - gather: the same grid into fp32/bf16 rows (invalid slot -> zeros), from caches holding
//    tokens, the 0xFF sentinel and blocks of random bytes: floats compared as bits.
//  - convert: every format pair of one d_qk, four layout pairings, the three page sizes, whole
//    cache and block lists (int32/int64, with -1 and out-of-range ids, which the GPU skips);
//    bf16 512 -> fp4 (two tokens per warp) also at page sizes 3 and 5 and odd token counts.
//  - the hardware conversion fast paths against the portable ones on all 2^32 floats.
//  - CUDA-graph capture of an append and a conversion; the public entry points.
// Tests named *Small* are tiny and run under compute-sanitizer too.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "common/kv_test_tokens.h"
#include "common/test_data.h"
#include "core/codec.h"
#include "core/validate.h"
#include "core/validate_convert.h"
#include "cuda/common/kv_cache_kernels.h"
#include "gpu/gpu_test_util.h"
#include "openmla/openmla.h"

namespace openmla::testing {
namespace {

enum class LayoutKind { kDefault, kInterleaved, kStrided, kOdd };
const char* layout_name(LayoutKind k) {
  switch (k) {
    case LayoutKind::kDefault:
      return "default";
    case LayoutKind::kInterleaved:
      return "interleaved";
    case LayoutKind::kStrided:
      return "strided";
    case LayoutKind::kOdd:
      return "odd";
  }
  return "?";
}
constexpr LayoutKind kAllLayouts[] = {LayoutKind::kDefault, LayoutKind::kInterleaved,
                                      LayoutKind::kStrided, LayoutKind::kOdd};
constexpr int kPageSizes[] = {1, 16, 64};

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

KVLayout make_layout(KVFormat format, int page, int d_qk, LayoutKind kind) {
  KVLayout l;
  switch (kind) {
    case LayoutKind::kDefault:
      l = default_kv_layout(format, page, d_qk);
      break;
    case LayoutKind::kInterleaved:
      l = interleaved_kv_layout(format, page, d_qk);
      break;
    case LayoutKind::kStrided:  // a gap after every block (a view of a larger buffer)
      l = default_kv_layout(format, page, d_qk);
      l.block_stride += 4096 + 52;
      break;
    case LayoutKind::kOdd: {
      // Token-interleaved with every offset and stride moved off 16 B by the smallest alignment
      // the format allows: e4m3/e2m1 1 B, bf16/fp16 (and fp8_model1's rope) 2 B, f32 scales 4 B.
      const KVFormatInfo info = kv_format_info(format, d_qk);
      const int64_t align = format == KVFormat::kFP8_V32                                ? 4
                            : (format == KVFormat::kFP8_MX || format == KVFormat::kFP4) ? 1
                                                                                        : 2;
      l = interleaved_kv_layout(format, page, d_qk);
      const int64_t stride = info.bytes_per_token + align;
      l.data_offset += align, l.data_stride = stride;
      if (info.scale_bytes > 0) l.scale_offset += align, l.scale_stride = stride;
      if (info.rope_bytes > 0) l.rope_offset += align, l.rope_stride = stride;
      l.block_stride = round_up(kv_block_footprint_bytes(l) + align, 4);
      break;
    }
  }
  return l;
}

// A device copy of a host cache's whole buffer.
struct DeviceCache {
  DeviceBuffer buffer;
  KVCache cache;
};
DeviceCache cache_to_device(const HostKVCache& host) {
  DeviceCache d{DeviceBuffer(host.buffer.bytes()), host.cache};
  d.buffer.copy_from_host(host.buffer.data(), host.buffer.bytes());
  d.cache.data = d.buffer.data();
  d.cache.device = Device::cuda(0);
  return d;
}

// Every byte equal; on failure, how many differ and where the first few are.
::testing::AssertionResult same_bytes(const uint8_t* got, const uint8_t* want, size_t n,
                                      const KVLayout* layout = nullptr) {
  size_t bad = 0;
  std::ostringstream os;
  for (size_t i = 0; i < n; ++i) {
    if (got[i] == want[i]) continue;
    if (bad < 8) {
      os << "\n  byte " << i;
      if (layout != nullptr) {
        os << " (block " << static_cast<int64_t>(i) / layout->block_stride << ", offset "
           << static_cast<int64_t>(i) % layout->block_stride << ")";
      }
      os << ": got 0x" << std::hex << int{got[i]} << ", want 0x" << int{want[i]} << std::dec;
    }
    ++bad;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << n << " bytes differ:" << os.str();
}

std::vector<uint8_t> download(const DeviceBuffer& buffer) {
  std::vector<uint8_t> host(buffer.bytes());
  buffer.copy_to_host(host.data(), host.size());
  return host;
}

// An int32/int64 index vector on the device.
struct DeviceIndices {
  DeviceBuffer buffer;
  TensorView view;
};
DeviceIndices indices_on_device(const std::vector<int64_t>& values, DType dtype) {
  const int64_t n = static_cast<int64_t>(values.size());
  DeviceIndices d;
  if (dtype == DType::kInt64) {
    d.buffer = to_device(values);
  } else {
    std::vector<int32_t> narrow(values.begin(), values.end());
    d.buffer = to_device(narrow);
  }
  d.view = TensorView::contiguous(d.buffer.data(), dtype, {n}, Device::cuda(0));
  return d;
}

// n slots: distinct valid slots in random order, ~1 in 6 replaced by -1, another negative or one
// past the end (all skipped).
std::vector<int64_t> random_slots(int64_t n, int64_t num_slots, Rng& rng) {
  const std::vector<int32_t> perm = random_permutation(num_slots, rng);
  std::vector<int64_t> slots(n);
  for (int64_t i = 0; i < n; ++i) {
    const double u = rng.uniform(0, 1);
    slots[i] = u < 0.08   ? -1
               : u < 0.12 ? -rng.randint(2, 1 << 20)
               : u < 0.17 ? num_slots + rng.randint(0, 3)
                          : perm[i];
  }
  return slots;
}

// Rows of kv input: [n, d] bf16 or fp32 with a row stride of d + pad elements, starting
// `base_offset` elements into the buffer; `values` are the floats the rows hold exactly.
struct Rows {
  std::vector<uint8_t> bytes;
  int64_t row_stride, base_offset;
  std::vector<std::vector<float>> values;
};
Rows make_rows(const std::vector<std::vector<float>>& tokens, DType dtype, int d, int pad,
               int base_offset) {
  Rows r;
  r.row_stride = d + pad;
  r.base_offset = base_offset;
  const size_t elem = dtype_size_bytes(dtype);
  r.bytes.assign((base_offset + tokens.size() * r.row_stride + 1) * elem, 0xEE);
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::vector<float> v(d);
    for (int k = 0; k < d; ++k) {
      uint8_t* p = r.bytes.data() + (base_offset + i * r.row_stride + k) * elem;
      if (dtype == DType::kBF16) {
        const uint16_t bits = codec::float_to_bf16(tokens[i][k]);
        std::memcpy(p, &bits, 2);
        v[k] = codec::bf16_to_float(bits);
      } else {
        std::memcpy(p, &tokens[i][k], 4);
        v[k] = tokens[i][k];
      }
    }
    r.values.push_back(v);
  }
  return r;
}

std::vector<std::vector<float>> input_tokens(int64_t n, int d, Rng& rng) {
  const std::vector<std::vector<float>> hard = hard_tokens(d, rng);
  std::vector<std::vector<float>> tokens;
  for (int64_t i = 0; i < n; ++i) tokens.push_back(hard[(i * 7) % hard.size()]);
  return tokens;
}

// --- append ------------------------------------------------------------------------------------
struct WriteCase {
  Target target;
  LayoutKind layout = LayoutKind::kDefault;
  int page = 16;
  DType kv_dtype = DType::kBF16;
  DType slot_dtype = DType::kInt32;
  int64_t max_tokens = 96;
  uint64_t seed = 1;
};

void run_write(const WriteCase& c) {
  SCOPED_TRACE(::testing::Message() << "write " << dtype_name(c.kv_dtype) << " into "
                                    << target_name(c.target) << " " << layout_name(c.layout)
                                    << " page " << c.page << " slots " << dtype_name(c.slot_dtype));
  Rng rng(c.seed);
  const int d = c.target.d_qk;
  const KVLayout layout = make_layout(c.target.format, c.page, d, c.layout);
  ASSERT_TRUE(check_kv_layout(layout, "layout").ok())
      << check_kv_layout(layout, "layout").message();
  const int64_t num_blocks = std::max<int64_t>(2, (c.max_tokens * 5 / 4 + c.page - 1) / c.page);
  HostKVCache expected(layout, num_blocks, 0xA5);
  DeviceCache device = cache_to_device(expected);
  const int64_t n = std::min<int64_t>(c.max_tokens, expected.cache.num_tokens());

  const std::vector<int64_t> slots = random_slots(n, expected.cache.num_tokens(), rng);
  const Rows rows = make_rows(input_tokens(n, d, rng), c.kv_dtype, d,
                              c.seed % 3 == 0 ? 0 : 1 + c.seed % 9, static_cast<int>(c.seed % 2));
  for (int64_t i = 0; i < n; ++i) {
    if (slots[i] >= 0 && slots[i] < expected.cache.num_tokens()) {
      codec::encode_slot(expected.cache, slots[i], rows.values[i].data());
    }
  }

  DeviceBuffer kv_buffer = to_device(rows.bytes);
  DeviceIndices slot_t = indices_on_device(slots, c.slot_dtype);
  KVCacheWriteArgs args;
  args.kv = TensorView::strided(
      static_cast<uint8_t*>(kv_buffer.data()) + rows.base_offset * dtype_size_bytes(c.kv_dtype),
      c.kv_dtype, {n, d}, {rows.row_stride, 1}, Device::cuda(0));
  args.slot_mapping = slot_t.view;
  args.cache = device.cache;
  core::KVCacheWriteShape shape;
  const Status valid = core::validate_kv_cache_write(args, &shape);
  ASSERT_TRUE(valid.ok()) << valid.message();
  const Status st = cuda::kv_cache_write_launch(args, shape, nullptr);
  ASSERT_TRUE(st.ok()) << st.message();
  synchronize();
  const std::vector<uint8_t> got = download(device.buffer);
  ASSERT_TRUE(same_bytes(got.data(), expected.buffer.data(), got.size(), &layout));
}

TEST(KVCacheKernels, SmallWriteEveryFormat) {
  uint64_t seed = 1;
  for (const Target& t : kTargets) {
    for (LayoutKind kind : {LayoutKind::kDefault, LayoutKind::kOdd}) {
      run_write({t, kind, 4, DType::kBF16, DType::kInt32, 6, seed++});
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(KVCacheKernels, WriteMatchesHostCodecEveryFormatLayoutPageAndDtype) {
  uint64_t seed = 1000;
  int cases = 0;
  for (const Target& t : kTargets) {
    for (LayoutKind kind : kAllLayouts) {
      for (int page : kPageSizes) {
        for (DType kv_dtype : {DType::kBF16, DType::kFP32}) {
          for (DType slot_dtype : {DType::kInt32, DType::kInt64}) {
            run_write({t, kind, page, kv_dtype, slot_dtype, 96, seed++});
            if (::testing::Test::HasFatalFailure()) return;
            ++cases;
          }
        }
      }
    }
  }
  std::printf("  append: %d cases, every byte of every cache equal to the host codec's\n", cases);
}

// 4096 tokens, the benchmark's shape, into every format (default layout, page 64).
TEST(KVCacheKernels, WriteLargeBatchEveryFormat) {
  uint64_t seed = 5000;
  for (const Target& t : kTargets) {
    run_write({t, LayoutKind::kDefault, 64, DType::kBF16, DType::kInt64, 4096, seed++});
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// --- gather ------------------------------------------------------------------------------------
// A cache holding encoded tokens in most slots, the 0xFF sentinel (NaN everywhere) in some, and
// random bytes in block 1.
HostKVCache make_source_cache(const KVLayout& layout, int64_t num_blocks, Rng& rng) {
  HostKVCache src(layout, num_blocks, 0xFF);
  const int d = kv_format_info(layout.format, layout.d_qk).d_qk;
  const std::vector<std::vector<float>> hard = hard_tokens(d, rng);
  for (int64_t slot = 0; slot < src.cache.num_tokens(); ++slot) {
    if (slot % 7 == 3) continue;
    codec::encode_slot(src.cache, slot, hard[slot % hard.size()].data());
  }
  if (num_blocks > 1) {
    uint8_t* block = codec::block_ptr(src.cache.data, layout, 1);
    for (int64_t i = 0; i < kv_block_footprint_bytes(layout); ++i)
      block[i] = static_cast<uint8_t>(rng.randint(0, 255));
  }
  return src;
}

struct GatherCase {
  Target target;
  LayoutKind layout = LayoutKind::kDefault;
  int page = 16;
  DType out_dtype = DType::kFP32;
  DType slot_dtype = DType::kInt32;
  int64_t num_blocks = 3;
  uint64_t seed = 1;
};

void run_gather(const GatherCase& c) {
  SCOPED_TRACE(::testing::Message()
               << "gather " << target_name(c.target) << " " << layout_name(c.layout) << " page "
               << c.page << " into " << dtype_name(c.out_dtype) << ", slots "
               << dtype_name(c.slot_dtype));
  Rng rng(c.seed);
  const int d = c.target.d_qk;
  const KVLayout layout = make_layout(c.target.format, c.page, d, c.layout);
  const int64_t num_blocks = std::max<int64_t>(c.num_blocks, 2);
  const HostKVCache src = make_source_cache(layout, num_blocks, rng);
  DeviceCache device = cache_to_device(src);
  const int64_t num_slots = src.cache.num_tokens();
  const int64_t n = std::min<int64_t>(num_slots + 8, 200);
  std::vector<int64_t> slots = random_slots(std::min(n, num_slots), num_slots, rng);
  while (static_cast<int64_t>(slots.size()) < n)
    slots.push_back(rng.randint(-2, num_slots + 2));  // repeats too

  const int64_t row_stride = d + 8;  // 8 elements of padding per row stay poisoned
  const size_t elem = dtype_size_bytes(c.out_dtype);
  std::vector<uint8_t> expected(n * row_stride * elem, 0xFF);
  std::vector<float> row(d);
  for (int64_t i = 0; i < n; ++i) {
    if (slots[i] >= 0 && slots[i] < num_slots) {
      codec::decode_slot(src.cache, slots[i], row.data());
    } else {
      std::fill(row.begin(), row.end(), 0.0f);
    }
    for (int k = 0; k < d; ++k) {
      uint8_t* p = expected.data() + (i * row_stride + k) * elem;
      if (c.out_dtype == DType::kFP32) {
        std::memcpy(p, &row[k], 4);
      } else {
        const uint16_t bits = codec::float_to_bf16(row[k]);
        std::memcpy(p, &bits, 2);
      }
    }
  }

  DeviceBuffer out(expected.size());
  out.poison();
  DeviceIndices slot_t = indices_on_device(slots, c.slot_dtype);
  KVCacheGatherArgs args;
  args.cache = device.cache;
  args.slots = slot_t.view;
  args.out = TensorView::strided(out.data(), c.out_dtype, {n, d}, {row_stride, 1}, Device::cuda(0));
  core::KVCacheWriteShape shape;
  const Status valid = core::validate_kv_cache_gather(args, &shape);
  ASSERT_TRUE(valid.ok()) << valid.message();
  const Status st = cuda::kv_cache_gather_launch(args, shape, nullptr);
  ASSERT_TRUE(st.ok()) << st.message();
  synchronize();
  const std::vector<uint8_t> got = download(out);
  ASSERT_TRUE(same_bytes(got.data(), expected.data(), got.size()));
  // The cache itself is untouched.
  const std::vector<uint8_t> cache_after = download(device.buffer);
  ASSERT_TRUE(same_bytes(cache_after.data(), src.buffer.data(), cache_after.size(), &layout));
}

TEST(KVCacheKernels, SmallGatherEveryFormat) {
  uint64_t seed = 1;
  for (const Target& t : kTargets) {
    run_gather(
        {t, LayoutKind::kOdd, 4, seed % 2 ? DType::kFP32 : DType::kBF16, DType::kInt64, 2, seed});
    ++seed;
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(KVCacheKernels, GatherMatchesHostDecodeBitForBit) {
  uint64_t seed = 2000;
  int cases = 0;
  for (const Target& t : kTargets) {
    for (LayoutKind kind : kAllLayouts) {
      for (int page : kPageSizes) {
        for (DType out_dtype : {DType::kFP32, DType::kBF16}) {
          for (DType slot_dtype : {DType::kInt32, DType::kInt64}) {
            run_gather({t, kind, page, out_dtype, slot_dtype, page == 1 ? 40 : 3, seed++});
            if (::testing::Test::HasFatalFailure()) return;
            ++cases;
          }
        }
      }
    }
  }
  std::printf("  gather: %d cases, every output bit equal to the host decode\n", cases);
}

// --- convert -----------------------------------------------------------------------------------
struct ConvertCase {
  Target from, to;
  LayoutKind src_layout = LayoutKind::kDefault, dst_layout = LayoutKind::kDefault;
  int page = 16;
  int lists = 0;  // 0: whole cache; 1: int32 block lists; 2: int64 block lists
  int64_t num_blocks = 3;
  uint64_t seed = 1;
};

void run_convert(const ConvertCase& c) {
  SCOPED_TRACE(::testing::Message()
               << "convert " << target_name(c.from) << " " << layout_name(c.src_layout) << " -> "
               << target_name(c.to) << " " << layout_name(c.dst_layout) << " page " << c.page
               << (c.lists == 0   ? " whole cache"
                   : c.lists == 1 ? " int32 lists"
                                  : " int64 lists"));
  Rng rng(c.seed);
  const KVLayout src_layout = make_layout(c.from.format, c.page, c.from.d_qk, c.src_layout);
  const KVLayout dst_layout = make_layout(c.to.format, c.page, c.to.d_qk, c.dst_layout);
  const int64_t src_blocks = std::max<int64_t>(c.num_blocks, 2);
  const int64_t dst_blocks = c.lists == 0 ? src_blocks : src_blocks + 1;
  const HostKVCache src = make_source_cache(src_layout, src_blocks, rng);
  HostKVCache expected(dst_layout, dst_blocks, 0x3C);
  DeviceCache device_src = cache_to_device(src);
  DeviceCache device_dst = cache_to_device(expected);

  std::vector<int64_t> src_ids, dst_ids;
  if (c.lists == 0) {
    for (int64_t b = 0; b < src_blocks; ++b) src_ids.push_back(b), dst_ids.push_back(b);
  } else {
    // Every dst block but one receives a random src block; -1 and out-of-range pairs skipped.
    const std::vector<int32_t> perm = random_permutation(dst_blocks, rng);
    for (int64_t i = 0; i + 1 < dst_blocks; ++i) {
      src_ids.push_back(rng.randint(0, src_blocks - 1));
      dst_ids.push_back(perm[i]);
    }
    src_ids.push_back(-1), dst_ids.push_back(perm[dst_blocks - 1]);
    src_ids.push_back(src_blocks), dst_ids.push_back(perm[0]);  // src out of range
    src_ids.push_back(0), dst_ids.push_back(dst_blocks + 5);    // dst out of range
    src_ids.push_back(-7), dst_ids.push_back(-1);
  }
  std::vector<float> row(c.from.d_qk);
  for (size_t i = 0; i < src_ids.size(); ++i) {
    if (src_ids[i] < 0 || src_ids[i] >= src_blocks || dst_ids[i] < 0 || dst_ids[i] >= dst_blocks)
      continue;
    for (int t = 0; t < c.page; ++t) {
      codec::decode_slot(src.cache, src_ids[i] * c.page + t, row.data());
      codec::encode_slot(expected.cache, dst_ids[i] * c.page + t, row.data());
    }
  }

  KVCacheConvertArgs args;
  args.src = device_src.cache;
  args.dst = device_dst.cache;
  DeviceIndices src_t, dst_t;
  if (c.lists != 0) {
    const DType dtype = c.lists == 1 ? DType::kInt32 : DType::kInt64;
    src_t = indices_on_device(src_ids, dtype);
    dst_t = indices_on_device(dst_ids, dtype);
    args.src_blocks = src_t.view;
    args.dst_blocks = dst_t.view;
  }
  const Status st = kv_cache_convert(args);  // the public entry point (validate + launch)
  ASSERT_TRUE(st.ok()) << st.message();
  synchronize();
  const std::vector<uint8_t> got = download(device_dst.buffer);
  ASSERT_TRUE(same_bytes(got.data(), expected.buffer.data(), got.size(), &dst_layout));
  const std::vector<uint8_t> src_after = download(device_src.buffer);
  ASSERT_TRUE(same_bytes(src_after.data(), src.buffer.data(), src_after.size(), &src_layout));
}

TEST(KVCacheKernels, SmallConvertEveryPair) {
  uint64_t seed = 1;
  for (const Target& from : kTargets) {
    for (const Target& to : kTargets) {
      if (from.d_qk != to.d_qk) continue;
      run_convert({from, to, LayoutKind::kOdd, LayoutKind::kDefault, 2, static_cast<int>(seed % 3),
                   2, seed});
      ++seed;
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(KVCacheKernels, ConvertMatchesHostDecodeThenEncodeEveryPair) {
  const std::pair<LayoutKind, LayoutKind> pairings[] = {
      {LayoutKind::kDefault, LayoutKind::kDefault},
      {LayoutKind::kInterleaved, LayoutKind::kOdd},
      {LayoutKind::kOdd, LayoutKind::kStrided},
      {LayoutKind::kStrided, LayoutKind::kInterleaved}};
  uint64_t seed = 3000;
  int cases = 0;
  for (const Target& from : kTargets) {
    for (const Target& to : kTargets) {
      if (from.d_qk != to.d_qk) continue;
      for (const auto& [src_kind, dst_kind] : pairings) {
        for (int page : kPageSizes) {
          for (int lists = 0; lists < 3; ++lists) {
            run_convert({from, to, src_kind, dst_kind, page, lists, page == 1 ? 24 : 3, seed++});
            if (::testing::Test::HasFatalFailure()) return;
            ++cases;
          }
        }
      }
    }
  }
  std::printf("  convert: %d cases, every byte of every dst cache equal to decode + encode\n",
              cases);
}

// bf16 512 -> fp4 converts two tokens per warp, a half-warp each: odd page sizes put a warp's two
// tokens in different blocks (or one in a skipped block), the odd layout gives them different
// alignments, and odd token counts leave the last warp's second half without a token.
TEST(KVCacheKernels, ConvertBf16ToFp4TwoTokensPerWarp) {
  const Target from{KVFormat::kBF16, 512}, to{KVFormat::kFP4, 512};
  uint64_t seed = 9000;
  const std::pair<LayoutKind, LayoutKind> pairings[] = {
      {LayoutKind::kDefault, LayoutKind::kDefault}, {LayoutKind::kOdd, LayoutKind::kOdd}};
  for (const auto& [src_kind, dst_kind] : pairings) {
    for (int page : {1, 3, 5}) {
      for (int64_t num_blocks : {3, 7}) {
        for (int lists = 0; lists < 3; ++lists) {
          run_convert({from, to, src_kind, dst_kind, page, lists, num_blocks, seed++});
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
}

// --- scalar fast paths -------------------------------------------------------------------------
TEST(KVCacheKernels, HardwareConversionsMatchPortableOnAllFloats) {
  DeviceBuffer results(2 * cuda::kKVCodecChecks * sizeof(unsigned long long));
  check_cuda(cuda::launch_kv_codec_self_check(results.as<unsigned long long>(), nullptr),
             "self-check launch");
  synchronize();
  const std::vector<unsigned long long> r =
      to_host<unsigned long long>(results, 2 * cuda::kKVCodecChecks);
  const char* names[cuda::kKVCodecChecks] = {"e4m3 encode (low byte of a pair)",
                                             "e4m3 encode (high byte)",
                                             "fp16 encode",
                                             "e4m3 decode",
                                             "fp16 decode",
                                             "fp4 element encode (input: scale code << 32 | x)"};
  for (int i = 0; i < cuda::kKVCodecChecks; ++i) {
    EXPECT_EQ(r[2 * i], 0u) << names[i] << ": " << r[2 * i] << " inputs differ, the first 0x"
                            << std::hex << r[2 * i + 1];
  }
}

// --- CUDA graphs and the public entry points ---------------------------------------------------
TEST(KVCacheKernels, SmallWriteAndConvertCaptureIntoCudaGraph) {
  Rng rng(77);
  const KVLayout layout = default_kv_layout(KVFormat::kFP8_MX, 4, 512);
  const KVLayout bf16_layout = default_kv_layout(KVFormat::kBF16, 4, 512);
  HostKVCache expected(layout, 2, 0xA5), expected_bf16(bf16_layout, 2, 0x11);
  DeviceCache cache = cache_to_device(expected), bf16 = cache_to_device(expected_bf16);
  const std::vector<int64_t> slots = {5, -1, 0, 7, 2};
  const Rows rows = make_rows(input_tokens(5, 512, rng), DType::kBF16, 512, 0, 0);
  for (int i = 0; i < 5; ++i) {
    if (slots[i] >= 0) codec::encode_slot(expected.cache, slots[i], rows.values[i].data());
  }
  std::vector<float> row(512);
  for (int64_t s = 0; s < 8; ++s) {
    codec::decode_slot(expected.cache, s, row.data());
    codec::encode_slot(expected_bf16.cache, s, row.data());
  }
  DeviceBuffer kv = to_device(rows.bytes);
  DeviceIndices slot_t = indices_on_device(slots, DType::kInt32);
  KVCacheWriteArgs write;
  write.kv = TensorView::contiguous(kv.data(), DType::kBF16, {5, 512}, Device::cuda(0));
  write.slot_mapping = slot_t.view;
  write.cache = cache.cache;
  core::KVCacheWriteShape shape;
  ASSERT_TRUE(core::validate_kv_cache_write(write, &shape).ok());
  KVCacheConvertArgs convert;
  convert.src = cache.cache;
  convert.dst = bf16.cache;

  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "BeginCapture");
  const Status st1 = cuda::kv_cache_write_launch(write, shape, stream);
  const Status st2 = kv_cache_convert(convert, stream);
  cudaGraph_t graph;
  check_cuda(cudaStreamEndCapture(stream, &graph), "EndCapture");
  ASSERT_TRUE(st1.ok()) << st1.message();
  ASSERT_TRUE(st2.ok()) << st2.message();
  cudaGraphExec_t exec;
  check_cuda(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  for (int replay = 0; replay < 2; ++replay)
    check_cuda(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);
  (void)cudaStreamDestroy(stream);
  const std::vector<uint8_t> got = download(cache.buffer), got_bf16 = download(bf16.buffer);
  EXPECT_TRUE(same_bytes(got.data(), expected.buffer.data(), got.size(), &layout));
  EXPECT_TRUE(
      same_bytes(got_bf16.data(), expected_bf16.buffer.data(), got_bf16.size(), &bf16_layout));
}

// kv_cache_write / kv_cache_gather through the public API: passes once src/cuda/backend.cc
// routes them to kv_cache_write_launch / kv_cache_gather_launch.
TEST(KVCacheKernels, SmallPublicWriteAndGatherRunOnTheGpu) {
  Rng rng(78);
  const KVLayout layout = default_kv_layout(KVFormat::kFP8_V32, 4, 576);
  HostKVCache expected(layout, 2, 0xA5);
  DeviceCache cache = cache_to_device(expected);
  const std::vector<int64_t> slots = {6, 1, -1, 3};
  const Rows rows = make_rows(input_tokens(4, 576, rng), DType::kFP32, 576, 0, 0);
  for (int i = 0; i < 4; ++i) {
    if (slots[i] >= 0) codec::encode_slot(expected.cache, slots[i], rows.values[i].data());
  }
  DeviceBuffer kv = to_device(rows.bytes);
  DeviceIndices slot_t = indices_on_device(slots, DType::kInt64);
  KVCacheWriteArgs write;
  write.kv = TensorView::contiguous(kv.data(), DType::kFP32, {4, 576}, Device::cuda(0));
  write.slot_mapping = slot_t.view;
  write.cache = cache.cache;
  const Status st = kv_cache_write(write);
  ASSERT_TRUE(st.ok()) << st.message();
  synchronize();
  const std::vector<uint8_t> got = download(cache.buffer);
  EXPECT_TRUE(same_bytes(got.data(), expected.buffer.data(), got.size(), &layout));

  DeviceBuffer out(4 * 576 * sizeof(float));
  out.poison();
  KVCacheGatherArgs gather;
  gather.cache = cache.cache;
  gather.slots = slot_t.view;
  gather.out = TensorView::contiguous(out.data(), DType::kFP32, {4, 576}, Device::cuda(0));
  const Status st2 = kv_cache_gather(gather);
  ASSERT_TRUE(st2.ok()) << st2.message();
  synchronize();
  const std::vector<float> got_rows = to_host<float>(out, 4 * 576);
  std::vector<float> want(576);
  for (int i = 0; i < 4; ++i) {
    if (slots[i] >= 0) {
      codec::decode_slot(expected.cache, slots[i], want.data());
    } else {
      std::fill(want.begin(), want.end(), 0.0f);
    }
    EXPECT_EQ(std::memcmp(got_rows.data() + i * 576, want.data(), 576 * sizeof(float)), 0)
        << "row " << i;
  }
}

}  // namespace
}  // namespace openmla::testing
