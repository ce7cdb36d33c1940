// Bad input to every public entry point gets InvalidArgument naming the argument; nothing runs.
// Each test starts from a valid argument set (checked by the core validator) and breaks one thing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <locale>
#include <string>
#include <vector>

#include "core/validate.h"
#include "openmla/openmla.h"

namespace openmla {
namespace {

// Expects `st` to be InvalidArgument whose message contains every needle.
void expect_invalid(const Status& st, std::initializer_list<const char*> needles) {
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
  for (const char* n : needles) {
    EXPECT_NE(st.message().find(n), std::string::npos) << "missing '" << n << "' in: " << st.message();
  }
}

// Owns small CPU buffers for a dense decode: b=2, s_q=2, h_q=8, h_kv=1, d_qk=576, page 16.
struct DenseFixture {
  int64_t b = 2, s_q = 2, h_q = 8, h_kv = 1, d = 576, dv = 512, page = 16, blocks = 4, max_blocks = 2;
  std::vector<uint16_t> q, k, out;
  std::vector<int32_t> table, seqlens;
  std::vector<float> lse;
  DenseDecodeArgs args;

  DenseFixture() {
    q.assign(b * s_q * h_q * d, 0);
    k.assign(blocks * page * h_kv * d, 0);
    out.assign(b * s_q * h_q * dv, 0);
    lse.assign(b * h_q * s_q, 0.f);
    table = {0, 1, 2, 3};
    seqlens = {20, 5};
    args.q = TensorView::contiguous(q.data(), DType::kBF16, {b, s_q, h_q, d});
    args.k_cache = TensorView::contiguous(k.data(), DType::kBF16, {blocks, page, h_kv, d});
    args.block_table = TensorView::contiguous(table.data(), DType::kInt32, {b, max_blocks});
    args.cache_seqlens = TensorView::contiguous(seqlens.data(), DType::kInt32, {b});
    args.out = TensorView::contiguous(out.data(), DType::kBF16, {b, s_q, h_q, dv});
    args.lse = TensorView::contiguous(lse.data(), DType::kFP32, {b, h_q, s_q});
  }
};

TEST(Validation, DenseDecodeBaselineIsValid) {
  DenseFixture f;
  core::DenseDecodeShape shape;
  ASSERT_TRUE(core::validate_dense_decode(f.args, &shape).ok());
  EXPECT_EQ(shape.h_kv, 1);
  EXPECT_EQ(shape.page_size, 16);
  EXPECT_FLOAT_EQ(shape.softmax_scale, 1.f / std::sqrt(576.f));
}

// Messages do not depend on the caller's global C++ locale (str_cat, no iostreams): with a
// locale that groups digits in threes, a size of 12345 still prints as 12345.
TEST(Validation, MessagesIgnoreTheGlobalLocale) {
  struct Grouping : std::numpunct<char> {
    char do_thousands_sep() const override { return '\''; }
    std::string do_grouping() const override { return "\3"; }
  };
  const std::locale saved = std::locale::global(std::locale(std::locale::classic(), new Grouping));
  DenseFixture f;
  f.args.q.shape[3] = 12345;
  core::DenseDecodeShape shape;
  const Status st = core::validate_dense_decode(f.args, &shape);
  std::locale::global(saved);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("12345"), std::string::npos) << st.message();
  EXPECT_EQ(st.message().find("12'345"), std::string::npos) << st.message();
}

TEST(Validation, DenseDecodeRejectsEachBadArgument) {
  struct Case {
    const char* name;
    std::function<void(DenseFixture&)> breaker;
    std::vector<const char*> needles;
  };
  const std::vector<Case> cases = {
      {"missing q", [](DenseFixture& f) { f.args.q = TensorView{}; }, {"dense_decode", "q"}},
      {"q fp32", [](DenseFixture& f) { f.args.q.dtype = DType::kFP32; }, {"q", "bf16 or fp16", "fp32"}},
      {"q rank", [](DenseFixture& f) { f.args.q.rank = 3; }, {"q", "4 dimensions"}},
      {"q d_qk", [](DenseFixture& f) { f.args.q.shape[3] = 128; }, {"q", "576 or 512", "128"}},
      {"q last stride", [](DenseFixture& f) { f.args.q.strides[3] = 2; }, {"q", "contiguous"}},
      {"k dtype", [](DenseFixture& f) { f.args.k_cache.dtype = DType::kFP16; }, {"k_cache", "bf16", "fp16"}},
      {"k d_qk", [](DenseFixture& f) { f.args.k_cache.shape[3] = 512; }, {"k_cache", "576"}},
      {"k h_kv", [](DenseFixture& f) { f.args.k_cache.shape[2] = 3; }, {"k_cache", "h_kv", "3"}},
      {"k rank", [](DenseFixture& f) { f.args.k_cache.rank = 3; }, {"k_cache", "4 dimensions"}},
      {"table dtype", [](DenseFixture& f) { f.args.block_table.dtype = DType::kInt64; },
       {"block_table", "int32", "int64"}},
      {"table batch", [](DenseFixture& f) { f.args.block_table.shape[0] = 3; }, {"block_table", "batch"}},
      {"seqlens batch", [](DenseFixture& f) { f.args.cache_seqlens.shape[0] = 1; },
       {"cache_seqlens", "batch"}},
      {"seqlen over capacity", [](DenseFixture& f) { f.seqlens[0] = 33; },
       {"cache_seqlens[0]", "32", "33"}},
      {"negative seqlen", [](DenseFixture& f) { f.seqlens[1] = -1; }, {"cache_seqlens[1]", "-1"}},
      {"block out of range", [](DenseFixture& f) { f.table[1] = 4; }, {"block_table[0, 1]", "[0, 4)"}},
      {"d_v", [](DenseFixture& f) { f.args.d_v = 256; }, {"d_v", "512", "256"}},
      {"out dtype", [](DenseFixture& f) { f.args.out.dtype = DType::kFP16; }, {"out", "bf16"}},
      {"out heads", [](DenseFixture& f) { f.args.out.shape[2] = 4; }, {"out", "h_q"}},
      {"lse shape", [](DenseFixture& f) { f.args.lse.shape[1] = 2; }, {"lse", "h_q"}},
      {"lse dtype", [](DenseFixture& f) { f.args.lse.dtype = DType::kBF16; }, {"lse", "fp32"}},
      {"mixed device", [](DenseFixture& f) { f.args.block_table.device = Device::cuda(0); },
       {"block_table", "device", "cpu", "cuda:0"}},
      {"schedule shape",
       [](DenseFixture& f) {
         f.args.schedule.metadata = f.args.lse;  // wrong rank and dtype
       },
       {"schedule.metadata"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    DenseFixture f;
    c.breaker(f);
    Status st = dense_decode(f.args);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
    for (const char* n : c.needles) {
      EXPECT_NE(st.message().find(n), std::string::npos) << "missing '" << n << "' in: " << st.message();
    }
  }
}

// Sparse decode over an fp8_v32 cache of 2 blocks × 64 tokens: b=1, s_q=1, h_q=4, topk=8.
struct SparseFixture {
  std::vector<uint16_t> q, out, q512;
  std::vector<uint8_t> cache, extra;
  std::vector<int32_t> idx, topk_len;
  std::vector<float> lse, sink;
  SparseDecodeArgs args;

  SparseFixture() {
    q.assign(4 * 576, 0);
    out.assign(4 * 512, 0);
    lse.assign(4, 0.f);
    sink.assign(4, 0.f);
    idx.assign(8, 0);
    topk_len = {8};
    const KVLayout layout = default_kv_layout(KVFormat::kFP8_V32, 64);
    cache.assign(2 * layout.block_stride, 0);
    args.q = TensorView::contiguous(q.data(), DType::kBF16, {1, 1, 4, 576});
    args.k_cache = KVCache{cache.data(), layout, 2, Device::cpu()};
    args.indices = TensorView::contiguous(idx.data(), DType::kInt32, {1, 1, 8});
    args.topk_length = TensorView::contiguous(topk_len.data(), DType::kInt32, {1});
    args.attn_sink = TensorView::contiguous(sink.data(), DType::kFP32, {4});
    args.out = TensorView::contiguous(out.data(), DType::kBF16, {1, 1, 4, 512});
    args.lse = TensorView::contiguous(lse.data(), DType::kFP32, {1, 4, 1});
  }
};

TEST(Validation, SparseDecodeBaselineIsValid) {
  SparseFixture f;
  core::SparseDecodeShape shape;
  Status st = core::validate_sparse_decode(f.args, &shape);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(shape.topk, 8);
  EXPECT_EQ(shape.extra_topk, 0);
}

TEST(Validation, SparseDecodeRejectsEachBadArgument) {
  struct Case {
    const char* name;
    std::function<void(SparseFixture&)> breaker;
    std::vector<const char*> needles;
  };
  const std::vector<Case> cases = {
      {"q fp16", [](SparseFixture& f) { f.args.q.dtype = DType::kFP16; }, {"sparse_decode", "q", "bf16"}},
      {"no cache", [](SparseFixture& f) { f.args.k_cache.data = nullptr; }, {"k_cache", "missing"}},
      {"format d_qk mismatch",
       [](SparseFixture& f) { f.args.k_cache.layout = default_kv_layout(KVFormat::kFP8_MX, 64); },
       {"k_cache", "fp8_mx", "512", "576"}},
      {"block stride too small", [](SparseFixture& f) { f.args.k_cache.layout.block_stride = 100; },
       {"k_cache.layout"}},
      {"indices dtype", [](SparseFixture& f) { f.args.indices.dtype = DType::kInt64; }, {"indices", "int32"}},
      {"indices batch", [](SparseFixture& f) { f.args.indices.shape[0] = 2; }, {"indices", "batch"}},
      {"topk_length shape", [](SparseFixture& f) { f.args.topk_length.shape[0] = 3; }, {"topk_length"}},
      {"sink shape", [](SparseFixture& f) { f.args.attn_sink.shape[0] = 8; }, {"attn_sink", "h_q"}},
      {"sink dtype", [](SparseFixture& f) { f.args.attn_sink.dtype = DType::kBF16; }, {"attn_sink", "fp32"}},
      {"extra indices without cache", [](SparseFixture& f) { f.args.extra_indices = f.args.indices; },
       {"extra_indices", "without extra_k_cache"}},
      {"extra cache without indices",
       [](SparseFixture& f) { f.args.extra_k_cache = f.args.k_cache; },
       {"extra_indices", "required"}},
      {"out shape", [](SparseFixture& f) { f.args.out.shape[3] = 576; }, {"out", "d_v"}},
      {"lse device", [](SparseFixture& f) { f.args.lse.device = Device::cuda(1); }, {"lse", "cuda:1"}},
      {"cache device", [](SparseFixture& f) { f.args.k_cache.device = Device::cuda(0); },
       {"k_cache", "device"}},
      {"max_logits shape",
       [](SparseFixture& f) {
         f.args.max_logits = f.args.lse;
         f.args.max_logits.shape[1] = 8;
       },
       {"max_logits", "h_q"}},
      {"max_logits dtype",
       [](SparseFixture& f) {
         f.args.max_logits = f.args.lse;
         f.args.max_logits.dtype = DType::kBF16;
       },
       {"max_logits", "fp32"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    SparseFixture f;
    c.breaker(f);
    Status st = sparse_decode(f.args);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
    for (const char* n : c.needles) {
      EXPECT_NE(st.message().find(n), std::string::npos) << "missing '" << n << "' in: " << st.message();
    }
  }
}

struct PrefillFixture {
  std::vector<uint16_t> q, kv, out;
  std::vector<int32_t> idx;
  std::vector<float> max_logits, lse;
  SparsePrefillArgs args;

  PrefillFixture() {
    q.assign(3 * 4 * 512, 0);
    kv.assign(10 * 2 * 512, 0);
    out.assign(3 * 4 * 512, 0);
    idx.assign(3 * 2 * 5, 0);
    max_logits.assign(12, 0.f);
    lse.assign(12, 0.f);
    args.q = TensorView::contiguous(q.data(), DType::kBF16, {3, 4, 512});
    args.kv = TensorView::contiguous(kv.data(), DType::kBF16, {10, 2, 512});
    args.indices = TensorView::contiguous(idx.data(), DType::kInt32, {3, 2, 5});
    args.out = TensorView::contiguous(out.data(), DType::kBF16, {3, 4, 512});
    args.max_logits = TensorView::contiguous(max_logits.data(), DType::kFP32, {3, 4});
    args.lse = TensorView::contiguous(lse.data(), DType::kFP32, {3, 4});
  }
};

TEST(Validation, SparsePrefillRejectsEachBadArgument) {
  {
    PrefillFixture f;
    core::SparsePrefillShape shape;
    ASSERT_TRUE(core::validate_sparse_prefill(f.args, &shape).ok());
    EXPECT_EQ(shape.h_kv, 2);
  }
  struct Case {
    const char* name;
    std::function<void(PrefillFixture&)> breaker;
    std::vector<const char*> needles;
  };
  const std::vector<Case> cases = {
      {"q rank", [](PrefillFixture& f) { f.args.q.rank = 4; }, {"sparse_prefill", "q", "3 dimensions"}},
      {"kv heads", [](PrefillFixture& f) { f.args.kv.shape[1] = 3; }, {"kv", "h_kv"}},
      {"kv d_qk", [](PrefillFixture& f) { f.args.kv.shape[2] = 576; }, {"kv", "d_qk"}},
      {"indices h_kv", [](PrefillFixture& f) { f.args.indices.shape[1] = 1; }, {"indices", "h_kv"}},
      {"max_logits missing", [](PrefillFixture& f) { f.args.max_logits = TensorView{}; }, {"max_logits"}},
      {"lse shape", [](PrefillFixture& f) { f.args.lse.shape[0] = 2; }, {"lse", "s_q"}},
      {"topk_length dtype",
       [](PrefillFixture& f) {
         f.args.topk_length = TensorView::contiguous(f.lse.data(), DType::kFP32, {3});
       },
       {"topk_length", "int32"}},
      // The kv_cache variant: one of kv / kv_cache, a cache of q's d_qk, one kv head of indices.
      {"kv and kv_cache",
       [](PrefillFixture& f) {
         f.args.kv_cache = KVCache{f.kv.data(), default_kv_layout(KVFormat::kFP8_MX, 16), 1,
                                   Device::cpu()};
       },
       {"kv", "kv_cache"}},
      {"kv_cache d_qk",
       [](PrefillFixture& f) {
         f.args.kv = TensorView{};
         f.args.kv_cache = KVCache{f.kv.data(), default_kv_layout(KVFormat::kFP8_V32, 16), 1,
                                   Device::cpu()};
       },
       {"kv_cache", "fp8_v32", "576", "512"}},
      {"kv_cache indices h_kv",
       [](PrefillFixture& f) {
         f.args.kv = TensorView{};
         f.args.kv_cache = KVCache{f.kv.data(), default_kv_layout(KVFormat::kFP8_MX, 16), 1,
                                   Device::cpu()};
       },
       {"indices", "h_kv"}},
      {"kv_cache layout",
       [](PrefillFixture& f) {
         f.args.kv = TensorView{};
         KVLayout layout = default_kv_layout(KVFormat::kFP8_MX, 16);
         layout.block_stride = 100;
         f.args.kv_cache = KVCache{f.kv.data(), layout, 1, Device::cpu()};
       },
       {"kv_cache.layout"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    PrefillFixture f;
    c.breaker(f);
    Status st = sparse_prefill(f.args);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
    for (const char* n : c.needles) {
      EXPECT_NE(st.message().find(n), std::string::npos) << "missing '" << n << "' in: " << st.message();
    }
  }
}

// fp8_tensor_cores: the keys from kv_cache only, at d_qk 576 or 512 and d_v 512.
TEST(Validation, SparsePrefillFp8TensorCoresNeedsTheCache) {
  auto from_cache = [](PrefillFixture& f) {
    f.args.kv = TensorView{};
    f.args.kv_cache = KVCache{f.kv.data(), default_kv_layout(KVFormat::kFP8_Model1, 16), 1,
                              Device::cpu()};
    f.args.indices = TensorView::contiguous(f.idx.data(), DType::kInt32, {3, 1, 5});
    f.args.fp8_tensor_cores = true;
  };
  {
    PrefillFixture f;
    from_cache(f);
    core::SparsePrefillShape shape;
    const Status st = core::validate_sparse_prefill(f.args, &shape);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(shape.h_kv, 1);
  }
  {
    PrefillFixture f;  // kv rows
    f.args.fp8_tensor_cores = true;
    expect_invalid(sparse_prefill(f.args), {"sparse_prefill", "fp8_tensor_cores", "kv_cache"});
  }
  {
    PrefillFixture f;  // neither kv nor kv_cache
    f.args.kv = TensorView{};
    f.args.fp8_tensor_cores = true;
    expect_invalid(sparse_prefill(f.args), {"fp8_tensor_cores", "kv_cache"});
  }
  {
    PrefillFixture f;
    from_cache(f);
    f.args.d_v = 256;
    expect_invalid(sparse_prefill(f.args), {"sparse_prefill", "d_v", "512", "256"});
  }
  {
    PrefillFixture f;
    from_cache(f);
    f.args.q.shape[2] = 128;
    expect_invalid(sparse_prefill(f.args), {"sparse_prefill", "q", "576 or 512", "128"});
  }
  {
    PrefillFixture f;
    from_cache(f);
    f.args.kv = TensorView::contiguous(f.kv.data(), DType::kBF16, {10, 2, 512});
    expect_invalid(sparse_prefill(f.args), {"kv", "kv_cache"});
  }
}

TEST(Validation, MergeStatesRejectsBadArguments) {
  std::vector<float> parts(2 * 3 * 4 * 8), part_lse(2 * 3 * 4), out(3 * 4 * 8), lse(3 * 4);
  auto make = [&] {
    MergeStatesArgs a;
    a.part_out = TensorView::contiguous(parts.data(), DType::kFP32, {2, 3, 4, 8});
    a.part_lse = TensorView::contiguous(part_lse.data(), DType::kFP32, {2, 3, 4});
    a.out = TensorView::contiguous(out.data(), DType::kFP32, {3, 4, 8});
    a.lse = TensorView::contiguous(lse.data(), DType::kFP32, {3, 4});
    return a;
  };
  core::MergeStatesShape shape;
  ASSERT_TRUE(core::validate_merge_states(make(), &shape).ok());
  MergeStatesArgs a = make();
  a.part_lse.shape[0] = 3;
  expect_invalid(merge_attention_states(a), {"merge_attention_states", "part_lse", "parts"});
  a = make();
  a.out.shape[2] = 4;
  expect_invalid(merge_attention_states(a), {"out", "d_v"});
  a = make();
  a.part_out.dtype = DType::kInt32;
  expect_invalid(merge_attention_states(a), {"part_out", "int32"});
  a = make();
  a.part_out.shape[0] = 0;
  expect_invalid(merge_attention_states(a), {"part_out", "at least 1 part"});
  a = make();
  a.lse.dtype = DType::kFP16;
  expect_invalid(merge_attention_states(a), {"lse", "fp32"});
}

TEST(Validation, KVCacheWriteAndGatherRejectBadArguments) {
  const KVLayout layout = default_kv_layout(KVFormat::kFP8_MX, 16);
  std::vector<uint8_t> cache(2 * layout.block_stride);
  std::vector<uint16_t> kv(3 * 512);
  std::vector<int64_t> slots = {0, 5, -1};
  std::vector<float> out(3 * 512);
  KVCacheWriteArgs w;
  w.kv = TensorView::contiguous(kv.data(), DType::kBF16, {3, 512});
  w.slot_mapping = TensorView::contiguous(slots.data(), DType::kInt64, {3});
  w.cache = KVCache{cache.data(), layout, 2, Device::cpu()};
  core::KVCacheWriteShape shape;
  ASSERT_TRUE(core::validate_kv_cache_write(w, &shape).ok());

  KVCacheWriteArgs bad = w;
  bad.kv.shape[1] = 576;
  expect_invalid(kv_cache_write(bad), {"kv_cache_write", "kv", "512", "576"});
  bad = w;
  bad.slot_mapping.dtype = DType::kFP32;
  expect_invalid(kv_cache_write(bad), {"slot_mapping", "int32 or int64"});
  bad = w;
  bad.slot_mapping.shape[0] = 2;
  expect_invalid(kv_cache_write(bad), {"slot_mapping", "tokens"});
  bad = w;
  bad.kv.dtype = DType::kFP16;
  expect_invalid(kv_cache_write(bad), {"kv", "bf16 or fp32"});
  bad = w;
  bad.cache.layout.scale_offset = 1;  // scales overlapping the data
  expect_invalid(kv_cache_write(bad), {"cache.layout"});

  KVCacheGatherArgs g;
  g.cache = w.cache;
  g.slots = w.slot_mapping;
  g.out = TensorView::contiguous(out.data(), DType::kFP32, {3, 512});
  ASSERT_TRUE(core::validate_kv_cache_gather(g, &shape).ok());
  KVCacheGatherArgs bad_g = g;
  bad_g.out.dtype = DType::kFP16;
  expect_invalid(kv_cache_gather(bad_g), {"kv_cache_gather", "out", "fp32 or bf16"});
  bad_g = g;
  bad_g.slots = TensorView{};
  expect_invalid(kv_cache_gather(bad_g), {"slots", "missing"});
}

TEST(Validation, ScheduleRejectsBadArguments) {
  std::vector<int32_t> seqlens = {10, 0, 300}, meta(4 * kScheduleMetadataInts), splits(4);
  DecodeScheduleArgs a;
  a.seqlens = TensorView::contiguous(seqlens.data(), DType::kInt32, {3});
  a.metadata = TensorView::contiguous(meta.data(), DType::kInt32, {4, kScheduleMetadataInts});
  a.num_splits = TensorView::contiguous(splits.data(), DType::kInt32, {4});
  core::DecodeScheduleShape shape;
  ASSERT_TRUE(core::validate_decode_schedule(a, &shape).ok());
  EXPECT_EQ(shape.num_sm_parts, 4);

  DecodeScheduleArgs bad = a;
  bad.h_kv = 3;
  expect_invalid(plan_decode_schedule(bad), {"plan_decode_schedule", "h_kv"});
  bad = a;
  bad.num_sm_parts = 7;
  expect_invalid(plan_decode_schedule(bad), {"num_sm_parts", "7"});
  bad = a;
  bad.num_splits.shape[0] = 3;
  expect_invalid(plan_decode_schedule(bad), {"num_splits", "batch + 1"});
  bad = a;
  bad.metadata.shape[1] = 4;
  expect_invalid(plan_decode_schedule(bad), {"metadata"});
  seqlens[1] = -5;
  expect_invalid(plan_decode_schedule(a), {"seqlens[1]", "-5"});

  int parts = 0;
  expect_invalid(decode_num_sm_parts(Device::cpu(), 1, 6, 4, &parts), {"decode_num_sm_parts", "h_kv"});
  ASSERT_TRUE(decode_num_sm_parts(Device::cpu(), 1, 128, 1, &parts).ok());
  EXPECT_GE(parts, 1);
}

// Views a C++ caller fills by hand can hold anything; found by tools/fuzz.sh (ASan + UBSan).
TEST(Validation, ViewsWithImpossibleRanksOrSizes) {
  for (int rank : {kMaxTensorRank + 1, 64, -1}) {
    SCOPED_TRACE(rank);
    DenseFixture f;
    f.args.k_cache.rank = rank;  // a rank past the view's arrays
    expect_invalid(dense_decode(f.args), {"k_cache", "dimensions", std::to_string(rank).c_str()});
  }
  DenseFixture f;
  f.args.q.shape[0] = int64_t{1} << 60;  // 2^60 * 2 * 8 * 576 elements: past int64
  expect_invalid(dense_decode(f.args), {"q", "2^63 elements"});
  // The helpers read at most kMaxTensorRank sizes and saturate instead of overflowing.
  TensorView t = f.args.q;
  t.rank = 9;
  EXPECT_EQ(t.shape_string(), "[1152921504606846976, 2, 8, 576, 0]");
  EXPECT_EQ(t.numel(), 0);
  t.rank = 4;
  EXPECT_EQ(t.numel(), INT64_MAX);
}

TEST(Validation, FootprintOfAnUncheckedLayoutSaturates) {
  KVLayout layout = default_kv_layout(KVFormat::kFP8_MX, 64);
  layout.scale_stride = INT64_MAX / 8;  // 63 tokens of this stride overflow
  EXPECT_EQ(kv_block_footprint_bytes(layout), INT64_MAX);
  EXPECT_FALSE(check_kv_layout(layout, "cache.layout").ok());
}

#ifndef OPENMLA_WITH_CUDA
// Without a CUDA backend, CUDA tensors get a clear UnsupportedDevice, never a crash.
TEST(Validation, CudaTensorsWithoutCudaBackend) {
  DenseFixture f;
  for (TensorView* t : {&f.args.q, &f.args.k_cache, &f.args.block_table, &f.args.cache_seqlens,
                        &f.args.out, &f.args.lse}) {
    t->device = Device::cuda(0);
  }
  Status st = dense_decode(f.args);
  EXPECT_EQ(st.code(), StatusCode::kUnsupportedDevice);
  EXPECT_NE(st.message().find("no CUDA backend"), std::string::npos) << st.message();
  EXPECT_FALSE(cuda_backend_available());
}
#endif

}  // namespace
}  // namespace openmla
