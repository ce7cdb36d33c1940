// Sparse decode on the CPU backend (through the public API) against the double-precision oracle,
// over every KV format (caches written through the codec from random data; the oracle decodes
// with the codec too). Tolerances: ‖out − ref‖/‖ref‖ <= 1e-2 (bf16 output; ~2e-3 seen), lse
// within 1e-4 · max(1, |lse|), lonely queries exactly 0 / +inf. Slots no counted index names
// hold NaN bytes, so attending an ignored entry shows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "common/test_data.h"
#include "cpu/oracle.h"
#include "openmla/openmla.h"

namespace openmla::testing {
namespace {

enum class Sink { kNone, kFinite, kPlusInf, kMinusInf, kMixed };

struct CacheSpec {
  KVFormat format = KVFormat::kBF16;
  int d_qk = 576;  // bf16/fp16 only; the others have a fixed d_qk
  bool interleaved = false;
  int page = 64;
  int64_t num_blocks = 6;
  int64_t pad_bytes = 0;
};

struct SparseCase {
  int64_t b = 2, s_q = 1, h_q = 16, topk = 96;
  CacheSpec cache;
  bool topk_length = false;
  std::optional<CacheSpec> extra;
  int64_t extra_topk = 40;
  bool extra_topk_length = false;
  Sink sink = Sink::kNone;
  bool strided_out = false;
  uint64_t seed = 1;
};

// One cache with a random 70% of its slots written.
struct TestCache {
  HostKVCache host;
  std::vector<int64_t> live;

  TestCache(const CacheSpec& s, Rng& rng)
      : host(test_layout(s.format, s.page, s.d_qk, s.interleaved, s.pad_bytes), s.num_blocks) {
    for (int64_t slot = 0; slot < host.cache.num_tokens(); ++slot) {
      if (rng.coin(0.7)) live.push_back(slot);
    }
    if (live.empty()) live.push_back(0);
    fill_random_cache(&host, rng, live);
  }
  int64_t num_slots() const { return host.cache.num_tokens(); }
};

// indices [b, s_q, topk]: the first `counted[i]` entries of request i mix live slots (some
// repeated), -1, other negatives and slots past the end; the rest name any slot, dead ones too.
HostTensor random_indices(int64_t b, int64_t s_q, int64_t topk, const TestCache& cache,
                          const std::vector<int32_t>& counted, Rng& rng) {
  HostTensor t(DType::kInt32, {b, s_q, topk});
  for (int64_t i = 0; i < b; ++i) {
    for (int64_t j = 0; j < s_q; ++j) {
      for (int64_t e = 0; e < topk; ++e) {
        int64_t v;
        const double u = rng.uniform(0, 1);
        if (e >= counted[i]) {
          v = rng.randint(0, cache.num_slots() - 1);
        } else if (u < 0.1) {
          v = -1;
        } else if (u < 0.15) {
          v = -rng.randint(2, 1 << 30);
        } else if (u < 0.2) {
          v = cache.num_slots() + rng.randint(0, 1000);
        } else if (u < 0.3 && e > 0) {
          v = static_cast<int64_t>(t.get({i, j, rng.randint(0, e - 1)}));  // a duplicate
        } else {
          v = cache.live[rng.randint(0, cache.live.size() - 1)];
        }
        t.set({i, j, e}, static_cast<double>(v));
      }
    }
  }
  return t;
}

std::vector<int32_t> random_lengths(int64_t b, int64_t topk, bool present, Rng& rng) {
  std::vector<int32_t> len(b, static_cast<int32_t>(topk));
  if (!present) return len;
  for (int64_t i = 0; i < b; ++i) len[i] = static_cast<int32_t>(rng.randint(0, topk));
  if (b >= 2) len[rng.randint(0, b - 1)] = 0;  // one request attends nothing of this cache
  return len;
}

HostTensor lengths_tensor(const std::vector<int32_t>& len) {
  HostTensor t(DType::kInt32, {static_cast<int64_t>(len.size())});
  for (size_t i = 0; i < len.size(); ++i) t.set({static_cast<int64_t>(i)}, len[i]);
  return t;
}

struct SparseProblem {
  SparseCase c;
  Rng rng;
  TestCache cache;
  std::optional<TestCache> extra;
  std::vector<int32_t> topk_length, extra_topk_length;
  HostTensor q, indices, extra_indices, topk_length_t, extra_topk_length_t, sink_t, out, lse;
  std::vector<float> sink;
  SparseDecodeArgs args;

  explicit SparseProblem(const SparseCase& cs) : c(cs), rng(cs.seed), cache(cs.cache, rng) {
    const int64_t d = kv_format_info(c.cache.format, c.cache.d_qk).d_qk, d_v = 512;
    q = HostTensor(DType::kBF16, {c.b, c.s_q, c.h_q, d});
    q.fill_normal(rng, rng.uniform(0.5, 2.0));
    topk_length = random_lengths(c.b, c.topk, c.topk_length, rng);
    indices = random_indices(c.b, c.s_q, c.topk, cache, topk_length, rng);
    args.q = q.view();
    args.k_cache = cache.host.cache;
    args.indices = indices.view();
    if (c.topk_length) {
      topk_length_t = lengths_tensor(topk_length);
      args.topk_length = topk_length_t.view();
    }
    if (c.extra) {
      extra.emplace(*c.extra, rng);
      extra_topk_length = random_lengths(c.b, c.extra_topk, c.extra_topk_length, rng);
      extra_indices = random_indices(c.b, c.s_q, c.extra_topk, *extra, extra_topk_length, rng);
      args.extra_k_cache = extra->host.cache;
      args.extra_indices = extra_indices.view();
      if (c.extra_topk_length) {
        extra_topk_length_t = lengths_tensor(extra_topk_length);
        args.extra_topk_length = extra_topk_length_t.view();
      }
    }
    if (c.sink != Sink::kNone) {
      const float inf = std::numeric_limits<float>::infinity();
      sink_t = HostTensor(DType::kFP32, {c.h_q});
      for (int64_t h = 0; h < c.h_q; ++h) {
        Sink kind = c.sink;
        if (kind == Sink::kMixed)
          kind = std::vector<Sink>{Sink::kFinite, Sink::kPlusInf, Sink::kMinusInf}[h % 3];
        const float v = kind == Sink::kPlusInf    ? inf
                        : kind == Sink::kMinusInf ? -inf
                                                  : static_cast<float>(rng.uniform(-2, 6));
        sink.push_back(v);
        sink_t.set({h}, v);
      }
      args.attn_sink = sink_t.view();
    }
    if (c.strided_out) {
      out = HostTensor(DType::kBF16, {c.b, c.s_q, c.h_q, d_v},
                       {c.s_q * c.h_q * (d_v + 8), c.h_q * (d_v + 8), d_v + 8, 1});
      lse = HostTensor(DType::kFP32, {c.b, c.h_q, c.s_q}, {c.s_q * c.h_q, 1, c.h_q});
    } else {
      out = HostTensor(DType::kBF16, {c.b, c.s_q, c.h_q, d_v});
      lse = HostTensor(DType::kFP32, {c.b, c.h_q, c.s_q});
    }
    out.poison();
    lse.poison();
    args.out = out.view();
    args.lse = lse.view();
  }

  OracleOutputs reference() const {
    OracleSparseInputs in;
    in.q = &q;
    in.cache = &cache.host.cache;
    in.indices = &indices;
    if (c.topk_length) in.topk_length = topk_length;
    if (extra) {
      in.extra_cache = &extra->host.cache;
      in.extra_indices = &extra_indices;
      if (c.extra_topk_length) in.extra_topk_length = extra_topk_length;
    }
    in.attn_sink = sink;
    in.scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
    return oracle_sparse_decode(in);
  }
};

void check_sparse(const SparseCase& c) {
  SCOPED_TRACE(::testing::Message()
               << kv_format_name(c.cache.format) << (c.cache.interleaved ? " interleaved" : "")
               << " page=" << c.cache.page << " h_q=" << c.h_q << " s_q=" << c.s_q
               << (c.extra ? std::string(" extra=") + kv_format_name(c.extra->format) : "")
               << " seed=" << c.seed);
  SparseProblem p(c);
  const Status st = sparse_decode(p.args);
  ASSERT_TRUE(st.ok()) << st.message();
  const OracleOutputs ref = p.reference();
  const std::vector<double> out = p.out.values(), lse = p.lse.values();
  if (verbose()) {
    std::printf("sparse %s%s: out rel %.2e, lse %.2e\n", kv_format_name(c.cache.format),
                c.extra ? " +extra" : "", relative_l2_error(out, ref.out),
                max_lse_error(lse, ref.lse));
  }
  EXPECT_LE(relative_l2_error(out, ref.out), 1e-2);
  EXPECT_LE(max_lse_error(lse, ref.lse), 1e-4);
  for (size_t k = 0; k < ref.out.size(); ++k) {
    // Lonely rows and +inf sinks: exactly zero.
    if (ref.out[k] == 0.0) {
      ASSERT_EQ(out[k], 0.0) << "element " << k;
    }
  }
  EXPECT_EQ(count_written_gaps(p.out), 0);
  EXPECT_EQ(count_written_gaps(p.lse), 0);
}

const CacheSpec kFormats[] = {
    {KVFormat::kBF16, 576},  {KVFormat::kBF16, 512}, {KVFormat::kFP16, 576}, {KVFormat::kFP8_V32},
    {KVFormat::kFP8_Model1}, {KVFormat::kFP8_MX},    {KVFormat::kFP4},
};

TEST(CpuSparseDecode, EveryFormatBothLayouts) {
  uint64_t seed = 100;
  for (CacheSpec spec : kFormats) {
    for (bool interleaved : {false, true}) {
      spec.interleaved = interleaved;
      spec.pad_bytes = interleaved ? 64 : 0;  // a block stride past the block's bytes
      SparseCase c;
      c.cache = spec;
      c.seed = seed++;
      check_sparse(c);
    }
  }
}

TEST(CpuSparseDecode, TopkLengthIncludingZero) {
  uint64_t seed = 200;
  for (KVFormat f : {KVFormat::kFP8_V32, KVFormat::kFP8_MX}) {
    SparseCase c;
    c.b = 4;
    c.s_q = 2;
    c.cache.format = f;
    c.topk_length = true;
    c.seed = seed++;
    check_sparse(c);
  }
}

TEST(CpuSparseDecode, AllIndicesInvalidIsLonely) {
  SparseCase c;
  c.seed = 250;
  SparseProblem p(c);
  for (int64_t i = 0; i < c.b; ++i) {
    for (int64_t e = 0; e < c.topk; ++e) {
      const int64_t bad[] = {-1, -5, p.cache.num_slots(), p.cache.num_slots() + 7};
      p.indices.set({i, 0, e}, static_cast<double>(bad[e % 4]));
    }
  }
  ASSERT_TRUE(sparse_decode(p.args).ok());
  for (double x : p.lse.values()) EXPECT_EQ(x, kOracleInf);
  for (double x : p.out.values()) ASSERT_EQ(x, 0.0);
}

TEST(CpuSparseDecode, ExtraCacheOfAnotherFormat) {
  struct Pair {
    KVFormat main, extra;
    int d_qk;
  };
  const Pair pairs[] = {{KVFormat::kFP8_Model1, KVFormat::kFP4, 512},
                        {KVFormat::kFP8_MX, KVFormat::kFP4, 512},
                        {KVFormat::kFP8_V32, KVFormat::kBF16, 576},
                        {KVFormat::kBF16, KVFormat::kFP8_MX, 512}};
  uint64_t seed = 300;
  for (const Pair& pr : pairs) {
    for (bool lengths : {false, true}) {
      SparseCase c;
      c.b = 3;
      c.h_q = 32;
      c.cache.format = pr.main;
      c.cache.d_qk = pr.d_qk;
      c.cache.page = 64;
      CacheSpec extra;
      extra.format = pr.extra;
      extra.d_qk = pr.d_qk;
      extra.page = 16;
      extra.num_blocks = 9;
      c.extra = extra;
      c.topk_length = lengths;
      c.extra_topk_length = lengths;
      c.seed = seed++;
      check_sparse(c);
    }
  }
}

TEST(CpuSparseDecode, AttnSinkFiniteAndInfinite) {
  uint64_t seed = 400;
  for (Sink s : {Sink::kFinite, Sink::kPlusInf, Sink::kMinusInf, Sink::kMixed}) {
    SparseCase c;
    c.cache.format = KVFormat::kFP8_Model1;
    c.sink = s;
    c.topk_length = true;
    c.b = 3;
    c.seed = seed++;
    check_sparse(c);
  }
}

// sink = -inf leaves the output bit for bit; +inf zeroes it; the lse never includes the sink.
TEST(CpuSparseDecode, AttnSinkLimitsAgainstNoSink) {
  SparseCase c;
  c.cache.format = KVFormat::kFP8_MX;
  c.seed = 450;
  SparseProblem base(c);
  ASSERT_TRUE(sparse_decode(base.args).ok());
  for (Sink s : {Sink::kMinusInf, Sink::kPlusInf}) {
    SparseCase cs = c;
    cs.sink = s;
    SparseProblem p(cs);  // same seed: the same data up to the sink draw, which comes last
    ASSERT_TRUE(sparse_decode(p.args).ok());
    EXPECT_EQ(p.lse.values(), base.lse.values());
    const std::vector<double> out = p.out.values(), base_out = base.out.values();
    for (size_t k = 0; k < out.size(); ++k) {
      ASSERT_EQ(out[k], s == Sink::kMinusInf ? base_out[k] : 0.0) << "element " << k;
    }
  }
}

TEST(CpuSparseDecode, MultiTokenManyHeadsStridedOut) {
  uint64_t seed = 500;
  for (int64_t h_q : {1, 64, 128}) {
    SparseCase c;
    c.h_q = h_q;
    c.s_q = 2;
    c.b = h_q >= 64 ? 1 : 2;
    c.cache.format = KVFormat::kFP8_V32;
    c.cache.page = 16;
    c.cache.num_blocks = 20;
    c.strided_out = true;
    c.seed = seed++;
    check_sparse(c);
  }
}

}  // namespace
}  // namespace openmla::testing
