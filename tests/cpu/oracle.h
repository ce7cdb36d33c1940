// The naive double-precision oracle of every attention operation (docs/semantics.md), written from the
// definitions and independently of src/cpu: plain loops, one query at a time, every logit and
// sum in double. It shares only the codec's decode of quantised caches with the library.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/test_data.h"
#include "core/codec.h"
#include "openmla/kv_format.h"

namespace openmla::testing {

constexpr double kOracleInf = std::numeric_limits<double>::infinity();

// One query's attention: out [d_v], lse, max scaled logit.
struct OracleRow {
  std::vector<double> out;
  double lse = kOracleInf;
  double max_logit = -kOracleInf;
};

// softmax(scale · q·k_t) over `keys` (each at least d_v long; V = the first d_v dims).
inline OracleRow oracle_attend(const std::vector<double>& q,
                               const std::vector<const std::vector<double>*>& keys, double scale,
                               int d_v) {
  OracleRow row;
  row.out.assign(d_v, 0.0);
  if (keys.empty()) return row;  // lonely: out 0, lse +inf, max -inf
  std::vector<double> logits(keys.size());
  for (size_t t = 0; t < keys.size(); ++t) {
    double dot = 0.0;
    for (size_t d = 0; d < q.size(); ++d) dot += q[d] * (*keys[t])[d];
    logits[t] = scale * dot;
    row.max_logit = std::max(row.max_logit, logits[t]);
  }
  double sum = 0.0;
  for (double l : logits) sum += std::exp(l - row.max_logit);
  for (size_t t = 0; t < keys.size(); ++t) {
    const double p = std::exp(logits[t] - row.max_logit) / sum;
    for (int d = 0; d < d_v; ++d) row.out[d] += p * (*keys[t])[d];
  }
  row.lse = row.max_logit + std::log(sum);
  return row;
}

// out *= 1 / (1 + exp(sink - lse)); a lonely row stays 0.
inline void oracle_apply_sink(double sink, OracleRow* row) {
  if (row->lse == kOracleInf) return;
  const double factor = 1.0 / (1.0 + std::exp(sink - row->lse));
  for (double& x : row->out) x *= factor;
}

// Vector `index` (all but the last dim) of a tensor, the last dim read whole.
inline std::vector<double> oracle_vector(const HostTensor& t, std::vector<int64_t> index) {
  const int64_t n = t.size(t.rank() - 1);
  std::vector<double> v(n);
  index.push_back(0);
  for (int64_t d = 0; d < n; ++d) {
    index.back() = d;
    v[d] = t.get(index);
  }
  return v;
}

inline std::vector<double> oracle_decode_slot(const KVCache& cache, int64_t slot) {
  const int d_qk = kv_format_info(cache.layout.format, cache.layout.d_qk).d_qk;
  std::vector<float> f(d_qk);
  codec::decode_slot(cache, slot, f.data());
  return std::vector<double>(f.begin(), f.end());
}

// Results in the logical order of the outputs: out [.., d_v] flattened, lse / max per query.
struct OracleOutputs {
  std::vector<double> out;  // row-major over out's logical shape
  std::vector<double> lse;  // row-major over lse's logical shape
  std::vector<double> max_logits;
};

// Dense decode: q [b, s_q, h_q, d], k_cache [blocks, page, h_kv, d], lse [b, h_q, s_q].
inline OracleOutputs oracle_dense_decode(const HostTensor& q, const HostTensor& k_cache,
                                         const std::vector<std::vector<int32_t>>& block_table,
                                         const std::vector<int32_t>& seqlens, bool causal,
                                         double scale, int d_v) {
  const int64_t b = q.size(0), s_q = q.size(1), h_q = q.size(2);
  const int64_t page = k_cache.size(1), h_kv = k_cache.size(2);
  OracleOutputs res;
  res.out.assign(b * s_q * h_q * d_v, 0.0);
  res.lse.assign(b * h_q * s_q, kOracleInf);
  for (int64_t i = 0; i < b; ++i) {
    for (int64_t g = 0; g < h_kv; ++g) {
      std::vector<std::vector<double>> keys(seqlens[i]);
      for (int64_t t = 0; t < seqlens[i]; ++t) {
        keys[t] = oracle_vector(k_cache, {block_table[i][t / page], t % page, g});
      }
      for (int64_t j = 0; j < s_q; ++j) {
        const int64_t last = causal ? seqlens[i] - s_q + j : seqlens[i] - 1;  // inclusive
        std::vector<const std::vector<double>*> seen;
        for (int64_t t = 0; t <= last && t < seqlens[i]; ++t) seen.push_back(&keys[t]);
        for (int64_t h = g * (h_q / h_kv); h < (g + 1) * (h_q / h_kv); ++h) {
          const OracleRow row = oracle_attend(oracle_vector(q, {i, j, h}), seen, scale, d_v);
          std::copy(row.out.begin(), row.out.end(),
                    res.out.begin() + ((i * s_q + j) * h_q + h) * d_v);
          res.lse[(i * h_q + h) * s_q + j] = row.lse;
        }
      }
    }
  }
  return res;
}

// Sparse decode: q [b, s_q, h_q, d], indices [b, s_q, topk] into `cache` (+ the extra cache).
// Lengths / sink vectors may be empty (absent).
struct OracleSparseInputs {
  const HostTensor* q = nullptr;
  const KVCache* cache = nullptr;
  const HostTensor* indices = nullptr;
  std::vector<int32_t> topk_length;
  const KVCache* extra_cache = nullptr;
  const HostTensor* extra_indices = nullptr;
  std::vector<int32_t> extra_topk_length;
  std::vector<float> attn_sink;
  double scale = 0.0;
  int d_v = 512;
};

inline void oracle_gather(const KVCache& cache, const HostTensor& indices, int64_t i, int64_t j,
                          const std::vector<int32_t>& lengths,
                          std::vector<std::vector<double>>* keys) {
  const int64_t topk = indices.size(2);
  const int64_t count = lengths.empty() ? topk : std::clamp<int64_t>(lengths[i], 0, topk);
  for (int64_t e = 0; e < count; ++e) {
    const int64_t slot = static_cast<int64_t>(indices.get({i, j, e}));
    if (slot >= 0 && slot < cache.num_blocks * cache.layout.page_size) {
      keys->push_back(oracle_decode_slot(cache, slot));
    }
  }
}

inline OracleOutputs oracle_sparse_decode(const OracleSparseInputs& in) {
  const HostTensor& q = *in.q;
  const int64_t b = q.size(0), s_q = q.size(1), h_q = q.size(2);
  OracleOutputs res;
  res.out.assign(b * s_q * h_q * in.d_v, 0.0);
  res.lse.assign(b * h_q * s_q, kOracleInf);
  for (int64_t i = 0; i < b; ++i) {
    for (int64_t j = 0; j < s_q; ++j) {
      std::vector<std::vector<double>> keys;
      oracle_gather(*in.cache, *in.indices, i, j, in.topk_length, &keys);
      if (in.extra_cache)
        oracle_gather(*in.extra_cache, *in.extra_indices, i, j, in.extra_topk_length, &keys);
      std::vector<const std::vector<double>*> seen;
      for (const auto& k : keys) seen.push_back(&k);
      for (int64_t h = 0; h < h_q; ++h) {
        OracleRow row = oracle_attend(oracle_vector(q, {i, j, h}), seen, in.scale, in.d_v);
        if (!in.attn_sink.empty()) oracle_apply_sink(in.attn_sink[h], &row);
        std::copy(row.out.begin(), row.out.end(),
                  res.out.begin() + ((i * s_q + j) * h_q + h) * in.d_v);
        res.lse[(i * h_q + h) * s_q + j] = row.lse;
      }
    }
  }
  return res;
}

// Sparse prefill: q [s_q, h_q, d], kv [s_kv, h_kv, d], indices [s_q, h_kv, topk].
inline OracleOutputs oracle_sparse_prefill(const HostTensor& q, const HostTensor& kv,
                                           const HostTensor& indices,
                                           const std::vector<int32_t>& topk_length,
                                           const std::vector<float>& attn_sink, double scale,
                                           int d_v) {
  const int64_t s_q = q.size(0), h_q = q.size(1), s_kv = kv.size(0), h_kv = kv.size(1);
  const int64_t topk = indices.size(2);
  OracleOutputs res;
  res.out.assign(s_q * h_q * d_v, 0.0);
  res.lse.assign(s_q * h_q, kOracleInf);
  res.max_logits.assign(s_q * h_q, -kOracleInf);
  for (int64_t s = 0; s < s_q; ++s) {
    const int64_t count = topk_length.empty() ? topk : std::clamp<int64_t>(topk_length[s], 0, topk);
    for (int64_t g = 0; g < h_kv; ++g) {
      std::vector<std::vector<double>> keys;
      for (int64_t e = 0; e < count; ++e) {
        const int64_t t = static_cast<int64_t>(indices.get({s, g, e}));
        if (t >= 0 && t < s_kv) keys.push_back(oracle_vector(kv, {t, g}));
      }
      std::vector<const std::vector<double>*> seen;
      for (const auto& k : keys) seen.push_back(&k);
      for (int64_t h = g * (h_q / h_kv); h < (g + 1) * (h_q / h_kv); ++h) {
        OracleRow row = oracle_attend(oracle_vector(q, {s, h}), seen, scale, d_v);
        if (!attn_sink.empty()) oracle_apply_sink(attn_sink[h], &row);
        std::copy(row.out.begin(), row.out.end(), res.out.begin() + (s * h_q + h) * d_v);
        res.lse[s * h_q + h] = row.lse;
        res.max_logits[s * h_q + h] = row.max_logit;
      }
    }
  }
  return res;
}

// Merge: part_out [n, tokens, heads, d_v], part_lse [n, tokens, heads].
inline OracleOutputs oracle_merge(const HostTensor& part_out, const HostTensor& part_lse) {
  const int64_t n = part_out.size(0), tokens = part_out.size(1), heads = part_out.size(2);
  const int64_t d_v = part_out.size(3);
  OracleOutputs res;
  res.out.assign(tokens * heads * d_v, 0.0);
  res.lse.assign(tokens * heads, kOracleInf);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      double sum = 0.0;
      for (int64_t p = 0; p < n; ++p) {
        const double l = part_lse.get({p, t, h});
        if (std::isfinite(l)) sum += std::exp(l);  // test lse values stay small
      }
      if (sum == 0.0) continue;
      const double lse = std::log(sum);
      res.lse[t * heads + h] = lse;
      for (int64_t p = 0; p < n; ++p) {
        const double l = part_lse.get({p, t, h});
        if (!std::isfinite(l)) continue;
        for (int64_t d = 0; d < d_v; ++d) {
          res.out[(t * heads + h) * d_v + d] += std::exp(l - lse) * part_out.get({p, t, h, d});
        }
      }
    }
  }
  return res;
}

}  // namespace openmla::testing
