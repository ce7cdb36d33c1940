// Sparse prefill from a paged cache on the FP8 tensor-core path (fp8_tensor_cores; docs/
// semantics.md), through the public API, against:
//   (a) the definition written out again here, naively (one row at a time, double wherever the
//       definition leaves the precision open, e4m3 / bf16 rounding by the test oracles of
//       codec_test_vectors.h / test_data.h rather than the library's codec): out within about
//       bf16 rounding, lse and max_logits within 1e-5 · max(1, |ref|);
//   (b) the ordinary (bf16) path on the same call: another arithmetic, so out differs, but by
//       less than 0.1 relative;
//   (c) the ordinary path's semantics of topk_length, invalid indices, duplicates, attn_sink and
//       lonely rows (out exactly 0, lse +inf, max_logits -inf).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <vector>

#include "common/codec_test_vectors.h"
#include "common/test_data.h"
#include "cpu/oracle.h"
#include "openmla/openmla.h"

namespace openmla::testing {
namespace {

// --- the definition, written out independently -------------------------------------------------
// The smallest e in [-64, 64] with a <= 448 · 2^e (64 when there is none); 0 for a == 0.
int ref_pow2_exponent(double a) {
  if (a == 0.0) return 0;
  int e = -64;
  while (e < 64 && a > std::ldexp(448.0, e)) ++e;
  return e;
}

double ref_e4m3(double x) { return e4m3_value(nearest_code(x, 127, 0x80, e4m3_value)); }
double ref_bf16(double x) { return bf16_bits_to_double(double_to_bf16_bits(x)); }

// Largest |v| over v[0..n), NaN skipped (an infinity counts: its exponent is then 64).
double ref_amax(const std::vector<double>& v, int n) {
  double a = 0.0;
  for (int i = 0; i < n; ++i) {
    if (!std::isnan(v[i])) a = std::max(a, std::fabs(v[i]));
  }
  return a;
}

// A key re-quantised: c (512 e4m3 values), r (64 bf16 values), its exponent e.
struct RefKey {
  std::vector<double> c, r;
  int e = 0;
};

RefKey ref_key(const KVCache& cache, int64_t slot) {
  const std::vector<double> x = oracle_decode_slot(cache, slot);  // = kv_cache_gather's values
  const int d_nope = static_cast<int>(x.size()) - 64;
  RefKey k;
  k.e = ref_pow2_exponent(ref_amax(x, 512));
  const double s = std::ldexp(1.0, k.e);
  for (int d = 0; d < 512; ++d) k.c.push_back(ref_e4m3(x[d] / s));
  for (int j = 0; j < 64; ++j) k.r.push_back(ref_bf16(x[d_nope + j] / s));
  return k;
}

// One query row against its keys (already re-quantised), then the sink.
OracleRow ref_row(const std::vector<double>& q, const std::vector<const RefKey*>& keys,
                  double scale, const std::vector<float>& sink, int64_t h) {
  OracleRow row;
  row.out.assign(512, 0.0);
  if (!keys.empty()) {
    const int d_nope = static_cast<int>(q.size()) - 64;
    const int e_q = ref_pow2_exponent(ref_amax(q, d_nope));
    const double sigma = std::ldexp(1.0, e_q);
    std::vector<double> qc(d_nope), qr(64);
    for (int d = 0; d < d_nope; ++d) qc[d] = ref_e4m3(q[d] / sigma);
    for (int j = 0; j < 64; ++j) qr[j] = ref_bf16(q[d_nope + j] / sigma);
    const double l2e = 1.0 / std::log(2.0);
    std::vector<double> x(keys.size()), y(keys.size());
    double y_max = -kOracleInf;
    for (size_t k = 0; k < keys.size(); ++k) {
      double dot = 0.0;
      for (int d = 0; d < d_nope; ++d) dot += qc[d] * keys[k]->c[d];
      for (int j = 0; j < 64; ++j) dot += qr[j] * keys[k]->r[j];
      x[k] = scale * sigma * std::ldexp(dot, keys[k]->e);
      y[k] = x[k] * l2e + keys[k]->e;
      row.max_logit = std::max(row.max_logit, x[k]);
      y_max = std::max(y_max, y[k]);
    }
    const double m = std::ceil(y_max);
    double l = 0.0;
    for (size_t k = 0; k < keys.size(); ++k) {
      l += std::exp2(x[k] * l2e - m);
      const double p = ref_e4m3(std::exp2(y[k] - m + 8));
      for (int d = 0; d < 512; ++d) row.out[d] += p * keys[k]->c[d];
    }
    for (double& o : row.out) o /= 256.0 * l;
    row.lse = std::log(l) + m * std::log(2.0);
  }
  if (!sink.empty()) oracle_apply_sink(sink[h], &row);
  return row;
}

// --- problems ------------------------------------------------------------------------------------
struct Fp8Case {
  KVFormat format = KVFormat::kFP8_V32;
  int d_qk = 576;
  int64_t s_q = 6, h_q = 16, topk = 80, page = 16, blocks = 6;
  bool topk_length = false;
  int sink = 0;          // 0: none, 1: finite, 2: mixed finite / +inf / -inf
  bool strided = false;  // gaps in q and every output
  float softmax_scale = 0.f;
  uint64_t seed = 1;
};

struct Fp8Problem {
  Fp8Case c;
  HostKVCache cache;
  HostTensor q, indices, topk_length_t, sink_t;
  std::vector<int32_t> topk_length;
  std::vector<float> sink;
  SparsePrefillArgs args;

  explicit Fp8Problem(const Fp8Case& cs)
      : c(cs), cache(default_kv_layout(cs.format, static_cast<int>(cs.page), cs.d_qk), cs.blocks) {
    Rng rng(c.seed);
    const int64_t slots = c.blocks * c.page, d = c.d_qk, pad = c.strided ? 8 : 0;
    std::vector<int64_t> live(slots);
    for (int64_t i = 0; i < slots; ++i) live[i] = i;
    fill_random_cache(&cache, rng, live);
    // Two all-zero keys (exponent 0, every product 0), and keys whose RoPE part is the largest
    // (at d_qk 576 outside the 512 dims that set a key's scale).
    const std::vector<float> zeros(d, 0.f);
    codec::encode_slot(cache.cache, 3, zeros.data());
    codec::encode_slot(cache.cache, slots - 1, zeros.data());
    for (int64_t slot = 5; slot < slots; slot += 7) {
      std::vector<float> x = random_token(rng, static_cast<int>(d));
      for (int64_t j = d - 64; j < d; ++j) x[j] *= 64.f;
      codec::encode_slot(cache.cache, slot, x.data());
    }

    // q: heads of magnitudes 2^-4 to 2^6 (so σ varies), one head of zeros.
    q = HostTensor(DType::kBF16, {c.s_q, c.h_q, d}, {c.h_q * (d + pad), d + pad, 1});
    for (int64_t s = 0; s < c.s_q; ++s) {
      for (int64_t h = 0; h < c.h_q; ++h) {
        const double magnitude = h == 1 ? 0.0 : std::ldexp(1.0, static_cast<int>(h % 6) - 4);
        for (int64_t e = 0; e < d; ++e) q.set({s, h, e}, magnitude * rng.normal());
      }
    }
    // Entries: valid slots (some repeated), -1, other negatives, slots past the cache.
    indices = HostTensor(DType::kInt32, {c.s_q, 1, c.topk});
    for (int64_t s = 0; s < c.s_q; ++s) {
      for (int64_t e = 0; e < c.topk; ++e) {
        const double u = rng.uniform(0, 1);
        int64_t v = rng.randint(0, slots - 1);
        if (u < 0.1)
          v = -1;
        else if (u < 0.15)
          v = -rng.randint(2, 1 << 30);
        else if (u < 0.2)
          v = slots + rng.randint(0, 100);
        else if (u < 0.3 && e > 0)
          v = static_cast<int64_t>(indices.get({s, 0, rng.randint(0, e - 1)}));
        indices.set({s, 0, e}, static_cast<double>(v));
      }
    }
    args.q = q.view();
    args.kv_cache = cache.cache;
    args.indices = indices.view();
    if (c.topk_length) {
      topk_length_t = HostTensor(DType::kInt32, {c.s_q});
      for (int64_t s = 0; s < c.s_q; ++s) {
        topk_length.push_back(s == 0 ? 0 : static_cast<int32_t>(rng.randint(1, c.topk + 5)));
        topk_length_t.set({s}, topk_length.back());
      }
      args.topk_length = topk_length_t.view();
    }
    if (c.sink) {
      const float inf = std::numeric_limits<float>::infinity();
      sink_t = HostTensor(DType::kFP32, {c.h_q});
      for (int64_t h = 0; h < c.h_q; ++h) {
        float v = static_cast<float>(rng.uniform(-2, 6));
        if (c.sink == 2 && h % 3 == 1) v = inf;
        if (c.sink == 2 && h % 3 == 2) v = -inf;
        sink.push_back(v);
        sink_t.set({h}, v);
      }
      args.attn_sink = sink_t.view();
    }
    args.softmax_scale = c.softmax_scale;
  }
};

// The outputs of one call (poisoned first; strided ones leave gaps that must stay poisoned).
struct Outputs {
  HostTensor out, max_logits, lse;
  Outputs(const Fp8Case& c) {
    if (c.strided) {
      out = HostTensor(DType::kBF16, {c.s_q, c.h_q, 512}, {c.h_q * 520, 520, 1});
      max_logits = HostTensor(DType::kFP32, {c.s_q, c.h_q}, {1, c.s_q + 1});
      lse = HostTensor(DType::kFP32, {c.s_q, c.h_q}, {2 * c.h_q, 2});
    } else {
      out = HostTensor(DType::kBF16, {c.s_q, c.h_q, 512});
      max_logits = HostTensor(DType::kFP32, {c.s_q, c.h_q});
      lse = HostTensor(DType::kFP32, {c.s_q, c.h_q});
    }
    out.poison();
    max_logits.poison();
    lse.poison();
  }
};

Outputs run(const Fp8Problem& p, bool fp8) {
  Outputs o(p.c);
  SparsePrefillArgs a = p.args;
  a.fp8_tensor_cores = fp8;
  a.out = o.out.view();
  a.max_logits = o.max_logits.view();
  a.lse = o.lse.view();
  const Status st = sparse_prefill(a);
  EXPECT_TRUE(st.ok()) << st.message();
  return o;
}

OracleOutputs reference(const Fp8Problem& p) {
  const Fp8Case& c = p.c;
  const double scale =
      c.softmax_scale > 0.f ? c.softmax_scale : 1.f / std::sqrt(static_cast<float>(c.d_qk));
  const int64_t slots = c.blocks * c.page;
  std::vector<RefKey> keys(slots);
  for (int64_t slot = 0; slot < slots; ++slot) keys[slot] = ref_key(p.cache.cache, slot);
  OracleOutputs res;
  for (int64_t s = 0; s < c.s_q; ++s) {
    const int64_t count =
        p.topk_length.empty() ? c.topk : std::clamp<int64_t>(p.topk_length[s], 0, c.topk);
    std::vector<const RefKey*> seen;
    for (int64_t e = 0; e < count; ++e) {
      const int64_t slot = static_cast<int64_t>(p.indices.get({s, 0, e}));
      if (slot >= 0 && slot < slots) seen.push_back(&keys[slot]);
    }
    for (int64_t h = 0; h < c.h_q; ++h) {
      const OracleRow row = ref_row(oracle_vector(p.q, {s, h}), seen, scale, p.sink, h);
      res.out.insert(res.out.end(), row.out.begin(), row.out.end());
      res.lse.push_back(row.lse);
      res.max_logits.push_back(row.max_logit);
    }
  }
  return res;
}

// Lonely rows (exactly out 0, lse +inf, max_logits -inf) of one result, by (s, h).
std::vector<bool> lonely_rows(const Outputs& o) {
  std::vector<bool> lonely;
  const std::vector<double> lse = o.lse.values(), ml = o.max_logits.values(), out = o.out.values();
  for (size_t i = 0; i < lse.size(); ++i) {
    bool zero = true;
    for (size_t d = 0; d < 512; ++d) zero = zero && out[i * 512 + d] == 0.0;
    lonely.push_back(lse[i] == kOracleInf && ml[i] == -kOracleInf && zero);
  }
  return lonely;
}

const char* format_label(KVFormat f) { return kv_format_name(f); }

void check_fp8(const Fp8Case& c) {
  SCOPED_TRACE(::testing::Message()
               << format_label(c.format) << " d_qk=" << c.d_qk << " s_q=" << c.s_q
               << " h_q=" << c.h_q << " topk=" << c.topk << " sink=" << c.sink
               << " topk_length=" << c.topk_length << " seed=" << c.seed);
  const Fp8Problem p(c);
  const Outputs fp8 = run(p, true), plain = run(p, false);
  const OracleOutputs ref = reference(p);
  const std::vector<double> out = fp8.out.values(), lse = fp8.lse.values();
  const std::vector<double> ml = fp8.max_logits.values();

  // (a) the definition: out within bf16 rounding (its last rounding; fp32 sums in another order
  // may move a value to the next bf16), each element within 2 bf16 ulps.
  const double rel = relative_l2_error(out, ref.out);
  int64_t far = 0;
  for (size_t row = 0; row < ref.lse.size(); ++row) {
    double row_max = 0.0;
    for (size_t d = 0; d < 512; ++d) row_max = std::max(row_max, std::fabs(ref.out[row * 512 + d]));
    for (size_t k = row * 512; k < (row + 1) * 512; ++k) {
      // (plus 1e-5 of the row's largest value: fp32 sums of values that cancel)
      if (std::fabs(out[k] - ref.out[k]) > 0x1p-7 * std::fabs(ref.out[k]) + 1e-5 * row_max) ++far;
    }
  }
  // (b) against the bf16 path on the same call: another arithmetic, close to it.
  const double vs_plain = relative_l2_error(out, plain.out.values());
  const double lse_vs_plain = max_lse_error(lse, plain.lse.values());
  if (verbose()) {
    std::printf("fp8 %-10s d_qk %d: out vs definition %.2e (%ld > 2 ulps), lse %.2e, max %.2e; "
                "vs bf16 path: out %.2e, lse %.2e\n",
                format_label(c.format), c.d_qk, rel, long(far), max_lse_error(lse, ref.lse),
                max_lse_error(ml, ref.max_logits), vs_plain, lse_vs_plain);
  }
  EXPECT_LE(rel, 2e-3);
  EXPECT_EQ(far, 0);
  EXPECT_LE(max_lse_error(lse, ref.lse), 1e-5);
  EXPECT_LE(max_lse_error(ml, ref.max_logits), 1e-5);
  for (size_t k = 0; k < ref.out.size(); ++k) {
    if (ref.out[k] == 0.0) {
      ASSERT_EQ(out[k], 0.0) << "element " << k;
    }
  }
  EXPECT_LT(vs_plain, 0.1);
  EXPECT_GT(vs_plain, 1e-3);  // a different arithmetic, not the bf16 path again
  // e4m3's 2^-4 relative rounding of q and keys moves these logits (up to ~30 here) by up to
  // ~0.5, and lse with them (0.14 · max(1, |lse|) seen); a wrong base (M · ln 2) is off by more.
  EXPECT_LT(lse_vs_plain, 0.25);

  // (c) the same rows are lonely on both paths, and lonely exactly.
  EXPECT_EQ(lonely_rows(fp8), lonely_rows(plain));
  for (size_t i = 0; i < ref.lse.size(); ++i) {
    if (ref.lse[i] == kOracleInf) {
      EXPECT_EQ(lse[i], kOracleInf) << "row " << i;
      EXPECT_EQ(ml[i], -kOracleInf) << "row " << i;
    }
  }
  EXPECT_EQ(count_written_gaps(fp8.out), 0);
  EXPECT_EQ(count_written_gaps(fp8.lse), 0);
  EXPECT_EQ(count_written_gaps(fp8.max_logits), 0);
}

TEST(CpuSparsePrefillFp8, MatchesItsDefinitionOnEveryFormat) {
  const std::pair<KVFormat, int> formats[] = {{KVFormat::kFP8_V32, 576},
                                              {KVFormat::kFP8_Model1, 512},
                                              {KVFormat::kFP8_MX, 512},
                                              {KVFormat::kFP4, 512}};
  uint64_t seed = 1000;
  for (const auto& [format, d_qk] : formats) {
    Fp8Case c;
    c.format = format;
    c.d_qk = d_qk;
    c.seed = seed++;
    check_fp8(c);
  }
}

TEST(CpuSparsePrefillFp8, TopkLengthSinkAndStridedOutputs) {
  uint64_t seed = 1100;
  for (int sink : {1, 2}) {
    for (const auto& [format, d_qk] :
         {std::pair{KVFormat::kFP8_V32, 576}, std::pair{KVFormat::kFP8_Model1, 512}}) {
      Fp8Case c;
      c.format = format;
      c.d_qk = d_qk;
      c.sink = sink;
      c.topk_length = true;
      c.topk = 150;  // more than two key tiles
      c.strided = sink == 2;
      c.softmax_scale = sink == 2 ? 0.07f : 0.f;
      c.seed = seed++;
      check_fp8(c);
    }
  }
}

TEST(CpuSparsePrefillFp8, ManyHeadsAndOneHead) {
  uint64_t seed = 1200;
  for (int64_t h_q : {1, 128}) {
    Fp8Case c;
    c.format = KVFormat::kFP8_MX;
    c.d_qk = 512;
    c.h_q = h_q;
    c.s_q = h_q == 1 ? 9 : 2;
    c.seed = seed++;
    check_fp8(c);
  }
}

// Every index invalid, or topk_length 0: lonely rows, exactly as on the bf16 path (a sink too).
TEST(CpuSparsePrefillFp8, LonelyRows) {
  Fp8Case c;
  c.format = KVFormat::kFP8_Model1;
  c.d_qk = 512;
  c.topk_length = true;  // row 0 has topk_length 0
  c.sink = 1;
  c.seed = 1300;
  Fp8Problem p(c);
  const int64_t slots = c.blocks * c.page;
  for (int64_t e = 0; e < c.topk; ++e) p.indices.set({1, 0, e}, e % 2 ? -1 : slots + e);
  const Outputs fp8 = run(p, true);
  const std::vector<double> lse = fp8.lse.values(), ml = fp8.max_logits.values();
  const std::vector<double> out = fp8.out.values();
  for (int64_t s : {0, 1}) {
    for (int64_t h = 0; h < c.h_q; ++h) {
      EXPECT_EQ(lse[s * c.h_q + h], kOracleInf);
      EXPECT_EQ(ml[s * c.h_q + h], -kOracleInf);
      for (int d = 0; d < 512; ++d) ASSERT_EQ(out[(s * c.h_q + h) * 512 + d], 0.0);
    }
  }
  EXPECT_EQ(lonely_rows(fp8), lonely_rows(run(p, false)));
}

// Options of the FP8 path that are errors, through the public entry point.
// The problem's arguments on the FP8 path, writing into `o`.
SparsePrefillArgs fp8_args(const Fp8Problem& p, Outputs& o) {
  SparsePrefillArgs a = p.args;
  a.fp8_tensor_cores = true;
  a.out = o.out.view();
  a.max_logits = o.max_logits.view();
  a.lse = o.lse.view();
  return a;
}

TEST(CpuSparsePrefillFp8, NeedsTheCache) {
  Fp8Case c;
  Fp8Problem p(c);
  Outputs o(c);
  HostTensor kv(DType::kBF16, {8, 1, 576});
  SparsePrefillArgs a = fp8_args(p, o);
  a.kv_cache = KVCache{};
  a.kv = kv.view();
  const Status st = sparse_prefill(a);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("fp8_tensor_cores"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("kv_cache"), std::string::npos) << st.message();
}

// A bf16 cache holds no quantised keys: the FP8 path refuses it (the default path reads it).
TEST(CpuSparsePrefillFp8, RefusesABf16Cache) {
  Fp8Case c;
  c.format = KVFormat::kBF16;
  Fp8Problem p(c);
  Outputs o(c);
  SparsePrefillArgs a = fp8_args(p, o);
  const Status st = sparse_prefill(a);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("fp8_tensor_cores"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("bf16"), std::string::npos) << st.message();
  a.fp8_tensor_cores = false;
  EXPECT_TRUE(sparse_prefill(a).ok());
}

}  // namespace
}  // namespace openmla::testing
