// KV-cache format facts and layout descriptors (include/openmla/kv_format.h, docs/formats.md).
#include "openmla/kv_format.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

namespace openmla {
namespace {

constexpr KVFormat kAllFormats[] = {KVFormat::kBF16,       KVFormat::kFP16,   KVFormat::kFP8_V32,
                                    KVFormat::kFP8_Model1, KVFormat::kFP8_MX, KVFormat::kFP4};

bool has(const Status& status, const std::string& text) {
  return status.message().find(text) != std::string::npos;
}

TEST(KVFormatNames, RoundTrip) {
  const char* names[] = {"bf16", "fp16", "fp8_v32", "fp8_model1", "fp8_mx", "fp4"};
  for (int i = 0; i < 6; ++i) {
    EXPECT_STREQ(kv_format_name(kAllFormats[i]), names[i]);
    EXPECT_EQ(kv_format_from_name(names[i]), kAllFormats[i]);
  }
  EXPECT_EQ(kv_format_from_name("fp8"), std::nullopt);
  EXPECT_EQ(kv_format_from_name("BF16"), std::nullopt);
  EXPECT_EQ(kv_format_from_name(""), std::nullopt);
}

TEST(KVFormatInfo, StaticFacts) {
  struct Row {
    KVFormat format;
    int d_qk, quantized, rope, group, scales, data, scale, rope_bytes, total;
  };
  const Row rows[] = {
      {KVFormat::kBF16, 576, 576, 0, 0, 0, 1152, 0, 0, 1152},
      {KVFormat::kFP16, 576, 576, 0, 0, 0, 1152, 0, 0, 1152},
      {KVFormat::kFP8_V32, 576, 512, 64, 128, 4, 512, 16, 128, 656},
      {KVFormat::kFP8_Model1, 512, 448, 64, 64, 7, 448, 8, 128, 584},
      {KVFormat::kFP8_MX, 512, 512, 0, 32, 16, 512, 16, 0, 528},
      {KVFormat::kFP4, 512, 512, 0, 16, 32, 256, 32, 0, 288},
  };
  for (const Row& r : rows) {
    const KVFormatInfo info = kv_format_info(r.format);
    SCOPED_TRACE(kv_format_name(r.format));
    EXPECT_EQ(info.format, r.format);
    EXPECT_EQ(info.d_qk, r.d_qk);
    EXPECT_EQ(info.quantized_dims, r.quantized);
    EXPECT_EQ(info.rope_dims, r.rope);
    EXPECT_EQ(info.group_size, r.group);
    EXPECT_EQ(info.num_scales, r.scales);
    EXPECT_EQ(info.data_bytes, r.data);
    EXPECT_EQ(info.scale_bytes, r.scale);
    EXPECT_EQ(info.rope_bytes, r.rope_bytes);
    EXPECT_EQ(info.bytes_per_token, r.total);
    EXPECT_EQ(info.quantized(), r.group > 0);
  }
}

TEST(KVFormatInfo, FactsAreConsistent) {
  for (KVFormat format : kAllFormats) {
    const KVFormatInfo info = kv_format_info(format);
    SCOPED_TRACE(kv_format_name(format));
    EXPECT_EQ(info.data_bytes + info.scale_bytes + info.rope_bytes, info.bytes_per_token);
    EXPECT_EQ(info.quantized_dims + info.rope_dims, info.d_qk);
    EXPECT_EQ(info.rope_bytes, 2 * info.rope_dims);
    if (info.quantized()) {
      EXPECT_EQ(info.num_scales * info.group_size, info.quantized_dims);
      const int bits = format == KVFormat::kFP4 ? 4 : 8;
      EXPECT_EQ(info.data_bytes * 8, info.quantized_dims * bits);
      EXPECT_GE(info.scale_bytes, info.num_scales);
    }
  }
}

TEST(KVFormatInfo, PlainFormatsFollowDqk) {
  for (KVFormat format : {KVFormat::kBF16, KVFormat::kFP16}) {
    const KVFormatInfo info = kv_format_info(format, 512);
    EXPECT_EQ(info.d_qk, 512);
    EXPECT_EQ(info.data_bytes, 1024);
    EXPECT_EQ(info.bytes_per_token, 1024);
  }
  // Fixed-size formats ignore d_qk.
  EXPECT_EQ(kv_format_info(KVFormat::kFP8_MX, 576).d_qk, 512);
  EXPECT_EQ(kv_format_info(KVFormat::kFP8_V32, 512).d_qk, 576);
}

TEST(KVFormatInfo, FromBytesPerToken) {
  EXPECT_EQ(kv_format_from_bytes_per_token(656), KVFormat::kFP8_V32);
  EXPECT_EQ(kv_format_from_bytes_per_token(584), KVFormat::kFP8_Model1);
  EXPECT_EQ(kv_format_from_bytes_per_token(528), KVFormat::kFP8_MX);
  EXPECT_EQ(kv_format_from_bytes_per_token(288), KVFormat::kFP4);
  for (int64_t bytes : std::vector<int64_t>{0, -1, 576, 1152, 1024, 512, 657, int64_t{1} << 40}) {
    EXPECT_EQ(kv_format_from_bytes_per_token(bytes), std::nullopt) << bytes;
  }
}

// --- layouts --------------------------------------------------------------------------------

void expect_layout(const KVLayout& got, const KVLayout& want) {
  EXPECT_EQ(got.format, want.format);
  EXPECT_EQ(got.d_qk, want.d_qk);
  EXPECT_EQ(got.page_size, want.page_size);
  EXPECT_EQ(got.block_stride, want.block_stride);
  EXPECT_EQ(got.data_offset, want.data_offset);
  EXPECT_EQ(got.data_stride, want.data_stride);
  EXPECT_EQ(got.scale_offset, want.scale_offset);
  EXPECT_EQ(got.scale_stride, want.scale_stride);
  EXPECT_EQ(got.rope_offset, want.rope_offset);
  EXPECT_EQ(got.rope_stride, want.rope_stride);
}

KVLayout make(KVFormat format, int d_qk, int page_size, int64_t block_stride, int64_t data_offset,
              int64_t data_stride, int64_t scale_offset, int64_t scale_stride, int64_t rope_offset,
              int64_t rope_stride) {
  KVLayout l;
  l.format = format, l.d_qk = d_qk, l.page_size = page_size, l.block_stride = block_stride;
  l.data_offset = data_offset, l.data_stride = data_stride;
  l.scale_offset = scale_offset, l.scale_stride = scale_stride;
  l.rope_offset = rope_offset, l.rope_stride = rope_stride;
  return l;
}

TEST(KVLayoutDefaults, MatchDesign) {
  const int p = 64;
  expect_layout(default_kv_layout(KVFormat::kBF16, p),
                make(KVFormat::kBF16, 576, p, p * 1152, 0, 1152, 0, 0, 0, 0));
  expect_layout(default_kv_layout(KVFormat::kFP16, p, 512),
                make(KVFormat::kFP16, 512, p, p * 1024, 0, 1024, 0, 0, 0, 0));
  expect_layout(default_kv_layout(KVFormat::kFP8_V32, p),
                make(KVFormat::kFP8_V32, 576, p, p * 656, 0, 656, 512, 656, 528, 656));
  // 64 * 584 = 37376 B, padded to 65 * 576 = 37440 B.
  expect_layout(default_kv_layout(KVFormat::kFP8_Model1, p),
                make(KVFormat::kFP8_Model1, 512, p, 37440, 0, 576, p * 576, 8, 448, 576));
  expect_layout(default_kv_layout(KVFormat::kFP8_MX, p),
                make(KVFormat::kFP8_MX, 512, p, p * 528, 0, 512, p * 512, 16, 0, 0));
  expect_layout(default_kv_layout(KVFormat::kFP4, p),
                make(KVFormat::kFP4, 512, p, p * 288, 0, 256, p * 256, 32, 0, 0));
}

TEST(KVLayoutDefaults, InterleavedVariants) {
  const int p = 16;
  expect_layout(interleaved_kv_layout(KVFormat::kFP8_V32, p),
                default_kv_layout(KVFormat::kFP8_V32, p));
  expect_layout(interleaved_kv_layout(KVFormat::kBF16, p, 512),
                default_kv_layout(KVFormat::kBF16, p, 512));
  expect_layout(interleaved_kv_layout(KVFormat::kFP8_Model1, p),
                make(KVFormat::kFP8_Model1, 512, p, p * 584, 0, 584, 576, 584, 448, 584));
  expect_layout(interleaved_kv_layout(KVFormat::kFP8_MX, p),
                make(KVFormat::kFP8_MX, 512, p, p * 528, 0, 528, 512, 528, 0, 0));
  expect_layout(interleaved_kv_layout(KVFormat::kFP4, p),
                make(KVFormat::kFP4, 512, p, p * 288, 0, 288, 256, 288, 0, 0));
}

TEST(KVLayoutDefaults, Model1BlockStrideIsAMultipleOf576) {
  for (int p : {1, 2, 3, 8, 63, 64, 65, 72, 128}) {
    const KVLayout l = default_kv_layout(KVFormat::kFP8_Model1, p);
    EXPECT_EQ(l.block_stride % 576, 0) << p;
    EXPECT_GE(l.block_stride, int64_t{p} * 584) << p;
    EXPECT_LT(l.block_stride, int64_t{p} * 584 + 576) << p;
    EXPECT_EQ(kv_block_footprint_bytes(l), int64_t{p} * 584) << p;
  }
  EXPECT_EQ(default_kv_layout(KVFormat::kFP8_Model1, 1).block_stride, 1152);
  // 72 * 584 = 73 * 576 exactly: no padding.
  EXPECT_EQ(default_kv_layout(KVFormat::kFP8_Model1, 72).block_stride, 73 * 576);
}

TEST(KVLayoutDefaults, FootprintIsTheFurthestByte) {
  for (KVFormat format : kAllFormats) {
    for (int p : {1, 7, 64}) {
      const int bpt = kv_format_info(format).bytes_per_token;
      EXPECT_EQ(kv_block_footprint_bytes(default_kv_layout(format, p)), int64_t{p} * bpt);
      EXPECT_EQ(kv_block_footprint_bytes(interleaved_kv_layout(format, p)), int64_t{p} * bpt);
    }
  }
  // Gaps: the last token's rope ends at 1000 + 3 * 200 + 128.
  const KVLayout l = make(KVFormat::kFP8_V32, 576, 4, 0, 0, 512, 2048, 16, 1000 + 2048, 200);
  EXPECT_EQ(kv_block_footprint_bytes(l), 3048 + 3 * 200 + 128);
}

TEST(KVLayoutCheck, DefaultAndInterleavedLayoutsAreValid) {
  for (KVFormat format : kAllFormats) {
    for (int p : {1, 2, 3, 16, 64, 65, 256}) {
      for (const KVLayout& l : {default_kv_layout(format, p), interleaved_kv_layout(format, p)}) {
        const Status s = check_kv_layout(l, "k_cache.layout");
        EXPECT_TRUE(s.ok()) << kv_format_name(format) << " page " << p << ": " << s.message();
      }
    }
  }
  for (KVFormat format : {KVFormat::kBF16, KVFormat::kFP16}) {
    EXPECT_TRUE(check_kv_layout(default_kv_layout(format, 64, 512), "k_cache.layout").ok());
  }
}

TEST(KVLayoutCheck, BlockStrideBelowFootprint) {
  KVLayout l = default_kv_layout(KVFormat::kFP8_Model1, 64);
  l.block_stride = 1000;
  const Status s = check_kv_layout(l, "k_cache.layout");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(
      s.message(),
      "k_cache.layout.block_stride: expected >= 37376 bytes (the block's footprint), got 1000");
  l.block_stride = 37374;
  EXPECT_TRUE(has(check_kv_layout(l, "k_cache.layout"), "expected >= 37376 bytes"));
  l.block_stride = 37376;  // the footprint itself is legal, the padding is optional
  EXPECT_TRUE(check_kv_layout(l, "k_cache.layout").ok());
  l.block_stride = 37376 + 4096;  // a strided view of a larger buffer
  EXPECT_TRUE(check_kv_layout(l, "k_cache.layout").ok());
  // Byte-aligned parts: one byte short is rejected too.
  KVLayout mx = default_kv_layout(KVFormat::kFP8_MX, 4);
  mx.block_stride = 4 * 528 - 1;
  EXPECT_TRUE(has(check_kv_layout(mx, "k_cache.layout"), "expected >= 2112 bytes"));
}

TEST(KVLayoutCheck, PartStrideSmallerThanThePart) {
  KVLayout l = default_kv_layout(KVFormat::kFP8_MX, 64);
  l.data_stride = 511;
  Status s = check_kv_layout(l, "extra_k_cache.layout");
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(has(s, "extra_k_cache.layout.data_stride")) << s.message();
  EXPECT_TRUE(has(s, ">= 512")) << s.message();
  EXPECT_TRUE(has(s, "got 511")) << s.message();

  l = default_kv_layout(KVFormat::kFP4, 8);
  l.scale_stride = 16;
  s = check_kv_layout(l, "kv.layout");
  EXPECT_TRUE(has(s, "kv.layout.scale_stride")) << s.message();

  l = default_kv_layout(KVFormat::kFP8_V32, 8);
  l.rope_stride = 0;
  s = check_kv_layout(l, "kv.layout");
  EXPECT_TRUE(has(s, "kv.layout.rope_stride")) << s.message();
}

TEST(KVLayoutCheck, PartsOfOneTokenOverlap) {
  KVLayout l = interleaved_kv_layout(KVFormat::kFP8_V32, 4);
  l.rope_offset = 520;  // inside the scales [512, 528)
  Status s = check_kv_layout(l, "k_cache.layout");
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(has(s, "k_cache.layout")) << s.message();
  EXPECT_TRUE(has(s, "overlap")) << s.message();
  EXPECT_TRUE(has(s, "token 0's scale bytes [512, 528)")) << s.message();

  l = interleaved_kv_layout(KVFormat::kFP8_MX, 4);
  l.scale_offset = 500;
  s = check_kv_layout(l, "k_cache.layout");
  EXPECT_TRUE(has(s, "token 0's data bytes [0, 512) overlap token 0's scale bytes [500, 516)"))
      << s.message();
}

TEST(KVLayoutCheck, OneByteOverlapIsCaughtAndAdjacencyIsLegal) {
  KVLayout l = interleaved_kv_layout(KVFormat::kFP8_MX, 4);
  l.scale_offset = 511;  // scales [511, 527) share data's last byte; stride 528 still fits
  EXPECT_TRUE(has(check_kv_layout(l, "k_cache.layout"), "overlap"))
      << check_kv_layout(l, "k_cache.layout").message();
  l.data_offset = 16, l.scale_offset = 1;  // scales [1, 17) before data [16, 528)
  l.block_stride += 16;
  EXPECT_TRUE(has(check_kv_layout(l, "k_cache.layout"), "overlap"))
      << check_kv_layout(l, "k_cache.layout").message();
  l.scale_offset = 0;  // [0, 16) then [16, 528), then token 1's scales at [528, 544): legal
  EXPECT_TRUE(check_kv_layout(l, "k_cache.layout").ok())
      << check_kv_layout(l, "k_cache.layout").message();
}

TEST(KVLayoutCheck, PartsOfDifferentTokensOverlap) {
  // Scales placed inside the data region, inside token 3's data.
  KVLayout l = default_kv_layout(KVFormat::kFP8_MX, 8);
  l.scale_offset = 3 * 512 + 100;
  Status s = check_kv_layout(l, "k_cache.layout");
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(
      has(s, "token 3's data bytes [1536, 2048) overlap token 7's scale bytes [1748, 1764)"))
      << s.message();

  // Interleaved stride too short for data + scales: token 0's scales run into token 1's data.
  l = interleaved_kv_layout(KVFormat::kFP4, 4);
  l.data_stride = l.scale_stride = 272;
  l.scale_offset = 256 + 8;
  s = check_kv_layout(l, "k_cache.layout");
  EXPECT_TRUE(has(s, "overlap token 1's scale bytes") || has(s, "overlap token 0's scale bytes"))
      << s.message();

  // Scales placed inside the last token's rope.
  l = default_kv_layout(KVFormat::kFP8_Model1, 4);
  l.scale_offset = 3 * 576 + 500;
  s = check_kv_layout(l, "k_cache.layout");
  EXPECT_TRUE(
      has(s, "token 0's scale bytes [2228, 2236) overlap token 3's rope bytes [2176, 2304)"))
      << s.message();
}

TEST(KVLayoutCheck, Misalignment) {
  KVLayout l = default_kv_layout(KVFormat::kFP8_Model1, 4);
  l.rope_offset = 449, l.data_stride = l.rope_stride = 578;
  l.scale_offset = 4 * 578, l.block_stride = 4 * 586;
  Status s = check_kv_layout(l, "k_cache.layout");
  EXPECT_TRUE(
      has(s, "k_cache.layout.rope_offset: expected a multiple of 2 bytes (bf16 elements), got 449"))
      << s.message();

  l = default_kv_layout(KVFormat::kFP8_V32, 4);
  l.scale_offset = 514, l.rope_offset = 530;
  s = check_kv_layout(l, "k_cache.layout");
  EXPECT_TRUE(
      has(s, "k_cache.layout.scale_offset: expected a multiple of 4 bytes (float32 scales)"))
      << s.message();

  l = default_kv_layout(KVFormat::kFP8_V32, 4);
  l.data_stride = l.scale_stride = l.rope_stride = 658, l.block_stride = 4 * 658;
  s = check_kv_layout(l, "k_cache.layout");
  EXPECT_TRUE(has(s, "k_cache.layout.scale_stride: expected a multiple of 4")) << s.message();

  l = default_kv_layout(KVFormat::kBF16, 4);
  l.data_stride = 1153, l.block_stride = 4 * 1153;
  s = check_kv_layout(l, "k_cache.layout");
  EXPECT_TRUE(has(s, "k_cache.layout.data_stride: expected a multiple of 2 bytes")) << s.message();

  l = default_kv_layout(KVFormat::kFP16, 4);
  l.block_stride += 1;
  s = check_kv_layout(l, "k_cache.layout");
  EXPECT_TRUE(has(s, "k_cache.layout.block_stride: expected a multiple of 2")) << s.message();

  // Byte-sized parts need no alignment: fp8_mx shifted by one byte is legal.
  l = default_kv_layout(KVFormat::kFP8_MX, 4);
  l.data_offset = 1, l.scale_offset += 3, l.block_stride += 5;
  EXPECT_TRUE(check_kv_layout(l, "k_cache.layout").ok())
      << check_kv_layout(l, "k_cache.layout").message();
}

TEST(KVLayoutCheck, PageSizeDqkFormatAndOffsets) {
  KVLayout l = default_kv_layout(KVFormat::kFP8_MX, 64);
  l.page_size = 0;
  Status s = check_kv_layout(l, "k_cache.layout");
  EXPECT_TRUE(has(s, "k_cache.layout.page_size")) << s.message();
  EXPECT_TRUE(has(s, "got 0")) << s.message();

  l = default_kv_layout(KVFormat::kFP8_MX, 64);
  l.d_qk = 576;
  s = check_kv_layout(l, "k_cache.layout");
  EXPECT_TRUE(has(s, "k_cache.layout.d_qk: expected 512 for fp8_mx, got 576")) << s.message();

  l = default_kv_layout(KVFormat::kBF16, 64);
  l.d_qk = 128;
  s = check_kv_layout(l, "q_cache.layout");
  EXPECT_TRUE(has(s, "q_cache.layout.d_qk: expected 576 or 512 for bf16, got 128")) << s.message();

  l = default_kv_layout(KVFormat::kFP4, 64);
  l.format = static_cast<KVFormat>(42);
  s = check_kv_layout(l, "k_cache.layout");
  EXPECT_TRUE(has(s, "k_cache.layout.format")) << s.message();

  l = default_kv_layout(KVFormat::kFP4, 64);
  l.data_offset = -256;
  s = check_kv_layout(l, "k_cache.layout");
  EXPECT_TRUE(has(s, "k_cache.layout.data_offset")) << s.message();
  EXPECT_TRUE(has(s, "got -256")) << s.message();
}

TEST(KVLayoutCheck, UnusedPartsAreIgnored) {
  // bf16 has no scales or rope; whatever their fields hold does not matter.
  KVLayout l = default_kv_layout(KVFormat::kBF16, 8);
  l.scale_offset = -7, l.scale_stride = 3, l.rope_offset = 5, l.rope_stride = 1;
  EXPECT_TRUE(check_kv_layout(l, "k_cache.layout").ok());
  KVLayout mx = default_kv_layout(KVFormat::kFP8_MX, 8);
  mx.rope_offset = 1, mx.rope_stride = 1;
  EXPECT_TRUE(check_kv_layout(mx, "k_cache.layout").ok());
}

// Overlap of any two parts of any two tokens, by listing every interval.
bool brute_force_overlap(const KVLayout& l) {
  const KVFormatInfo info = kv_format_info(l.format, l.d_qk);
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (int t = 0; t < l.page_size; ++t) {
    spans.push_back({l.data_offset + t * l.data_stride, info.data_bytes});
    if (info.scale_bytes) spans.push_back({l.scale_offset + t * l.scale_stride, info.scale_bytes});
    if (info.rope_bytes) spans.push_back({l.rope_offset + t * l.rope_stride, info.rope_bytes});
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i - 1].first + spans[i - 1].second > spans[i].first) return true;
  }
  return false;
}

TEST(KVLayoutCheck, OverlapVerdictMatchesBruteForceOnRandomLayouts) {
  std::mt19937 rng(61);
  int rejected = 0, accepted = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    const KVFormat format = kAllFormats[2 + trial % 4];  // the formats with two or three parts
    const KVFormatInfo info = kv_format_info(format);
    const int page_size = 1 + static_cast<int>(rng() % 9);
    // Strides at least the part size; offsets and strides at each part's alignment (e4m3 data
    // 1 B, so overlaps of a single byte occur).
    auto stride = [&](int bytes, int align) {
      return (bytes + align - 1) / align * align + align * static_cast<int64_t>(rng() % 640);
    };
    auto offset = [&](int align) { return align * static_cast<int64_t>(rng() % 4096); };
    const int scale_align = format == KVFormat::kFP8_V32 ? 4 : 1;
    KVLayout l;
    l.format = format, l.d_qk = info.d_qk, l.page_size = page_size;
    l.data_offset = offset(1), l.data_stride = stride(info.data_bytes, 1);
    l.scale_offset = offset(scale_align), l.scale_stride = stride(info.scale_bytes, scale_align);
    l.rope_offset = info.rope_bytes ? offset(2) : 0;
    l.rope_stride = info.rope_bytes ? stride(info.rope_bytes, 2) : 0;
    if (trial % 3 == 0) {  // interleaved-like: one stride, aligned for every part
      l.data_stride = l.scale_stride = l.rope_stride = (l.data_stride + 3) / 4 * 4;
    }
    l.block_stride = (kv_block_footprint_bytes(l) + 3) / 4 * 4;
    const Status s = check_kv_layout(l, "k_cache.layout");
    ASSERT_EQ(!s.ok(), brute_force_overlap(l)) << "trial " << trial << ": " << s.message();
    (s.ok() ? accepted : rejected) += 1;
  }
  EXPECT_GT(accepted, 100);  // both verdicts exercised
  EXPECT_GT(rejected, 100);
}

}  // namespace
}  // namespace openmla
