// A naive double-precision oracle of dense MHA prefill, forward and backward (docs/semantics.md,
// dense MHA prefill), written from the definitions and independently of src/cpu: one query at a
// time, every logit, sum and gradient in double, the causal mask spelt as its definition
// (query t of s_q sees key u of s_kv iff u <= t + s_kv - s_q).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace openmla::testing {

// Row-major double tensors: q [total_q, h_q, d_qk], k [total_kv, h_kv, d_qk],
// v [total_kv, h_kv, d_v]; cu_q / cu_kv [b + 1].
struct MhaOracleInput {
  std::vector<double> q, k, v;
  std::vector<int64_t> cu_q, cu_kv;
  int64_t h_q = 1, h_kv = 1, d_qk = 128, d_v = 128;
  bool causal = false;
  double scale = 0.0;
};

struct MhaOracleForward {
  std::vector<double> out;  // [total_q, h_q, d_v]
  std::vector<double> lse;  // [total_q, h_q]; -inf for a query that sees no key
};

struct MhaOracleGrads {
  std::vector<double> dq, dk, dv;  // shaped as q, k, v
};

inline bool mha_oracle_sees(int64_t t, int64_t u, int64_t s_q, int64_t s_kv, bool causal) {
  return !causal || u <= t + s_kv - s_q;
}

// out and lse of every query token and head, from the definition.
inline MhaOracleForward mha_oracle_forward(const MhaOracleInput& in) {
  const int64_t total_q = static_cast<int64_t>(in.q.size()) / (in.h_q * in.d_qk);
  MhaOracleForward r;
  r.out.assign(total_q * in.h_q * in.d_v, 0.0);
  r.lse.assign(total_q * in.h_q, -std::numeric_limits<double>::infinity());
  const int64_t group = in.h_q / in.h_kv;
  for (size_t b = 0; b + 1 < in.cu_q.size(); ++b) {
    const int64_t q0 = in.cu_q[b], s_q = in.cu_q[b + 1] - q0;
    const int64_t kv0 = in.cu_kv[b], s_kv = in.cu_kv[b + 1] - kv0;
    for (int64_t t = 0; t < s_q; ++t) {
      for (int64_t h = 0; h < in.h_q; ++h) {
        const int64_t g = h / group;
        const double* q = &in.q[((q0 + t) * in.h_q + h) * in.d_qk];
        std::vector<double> logits;
        std::vector<int64_t> keys;
        for (int64_t u = 0; u < s_kv; ++u) {
          if (!mha_oracle_sees(t, u, s_q, s_kv, in.causal)) continue;
          const double* k = &in.k[((kv0 + u) * in.h_kv + g) * in.d_qk];
          double dot = 0.0;
          for (int64_t d = 0; d < in.d_qk; ++d) dot += q[d] * k[d];
          logits.push_back(in.scale * dot);
          keys.push_back(u);
        }
        if (keys.empty()) continue;  // out 0, lse -inf
        double m = -std::numeric_limits<double>::infinity();
        for (double l : logits) m = std::max(m, l);
        double sum = 0.0;
        for (double l : logits) sum += std::exp(l - m);
        double* out = &r.out[((q0 + t) * in.h_q + h) * in.d_v];
        for (size_t i = 0; i < keys.size(); ++i) {
          const double p = std::exp(logits[i] - m) / sum;
          const double* v = &in.v[((kv0 + keys[i]) * in.h_kv + g) * in.d_v];
          for (int64_t d = 0; d < in.d_v; ++d) out[d] += p * v[d];
        }
        r.lse[(q0 + t) * in.h_q + h] = m + std::log(sum);
      }
    }
  }
  return r;
}

// The exact gradients of L = Σ dout · out(q, k, v), from the oracle's own softmax (not from a
// given lse or out).
inline MhaOracleGrads mha_oracle_backward(const MhaOracleInput& in,
                                          const std::vector<double>& dout) {
  const MhaOracleForward fwd = mha_oracle_forward(in);
  MhaOracleGrads g;
  g.dq.assign(in.q.size(), 0.0);
  g.dk.assign(in.k.size(), 0.0);
  g.dv.assign(in.v.size(), 0.0);
  const int64_t group = in.h_q / in.h_kv;
  for (size_t b = 0; b + 1 < in.cu_q.size(); ++b) {
    const int64_t q0 = in.cu_q[b], s_q = in.cu_q[b + 1] - q0;
    const int64_t kv0 = in.cu_kv[b], s_kv = in.cu_kv[b + 1] - kv0;
    for (int64_t t = 0; t < s_q; ++t) {
      for (int64_t h = 0; h < in.h_q; ++h) {
        const int64_t row = (q0 + t) * in.h_q + h, kvh = h / group;
        const double lse = fwd.lse[row];
        if (std::isinf(lse)) continue;  // sees no key: no gradient
        const double* q = &in.q[row * in.d_qk];
        const double* dq_out = &dout[row * in.d_v];
        const double* out = &fwd.out[row * in.d_v];
        double delta = 0.0;
        for (int64_t d = 0; d < in.d_v; ++d) delta += dq_out[d] * out[d];
        for (int64_t u = 0; u < s_kv; ++u) {
          if (!mha_oracle_sees(t, u, s_q, s_kv, in.causal)) continue;
          const int64_t krow = (kv0 + u) * in.h_kv + kvh;
          const double* k = &in.k[krow * in.d_qk];
          const double* v = &in.v[krow * in.d_v];
          double dot = 0.0, dp = 0.0;
          for (int64_t d = 0; d < in.d_qk; ++d) dot += q[d] * k[d];
          for (int64_t d = 0; d < in.d_v; ++d) dp += dq_out[d] * v[d];
          const double p = std::exp(in.scale * dot - lse);
          const double ds = p * (dp - delta);
          for (int64_t d = 0; d < in.d_qk; ++d) {
            g.dq[row * in.d_qk + d] += in.scale * ds * k[d];
            g.dk[krow * in.d_qk + d] += in.scale * ds * q[d];
          }
          for (int64_t d = 0; d < in.d_v; ++d) g.dv[krow * in.d_v + d] += p * dq_out[d];
        }
      }
    }
  }
  return g;
}

}  // namespace openmla::testing
