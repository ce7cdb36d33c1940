// Dense MHA prefill backward on the CPU (docs/semantics.md, dense MHA prefill). With the
// forward's lse and out, for query t and a key u it sees:
//   P = exp(scale · q·k_u − lse_t),  D_t = dout_t · out_t,  dS = P · (dout_t · v_u − D_t)
//   dq_t = scale · Σ_u dS · k_u,  dk_u = scale · Σ_t dS · q_t,  dv_u = Σ_t P · dout_t
// (dk, dv also summed over the query heads of the kv head). Two passes, each over independent
// outputs so no two threads write one element: dq by (sequence, query head, chunk of query
// tokens), then dk and dv by (sequence, kv head, chunk of keys), recomputing P and dS.
#include <algorithm>
#include <vector>

#include "cpu/attention_row.h"
#include "cpu/mha_prefill.h"

namespace openmla::cpu {
namespace {

void store_row(const TensorView& t, int64_t token, int64_t h, const std::vector<double>& acc,
               double factor, std::vector<float>* tmp) {
  const int n = static_cast<int>(acc.size());
  for (int d = 0; d < n; ++d) (*tmp)[d] = static_cast<float>(acc[d] * factor);
  char* dst = static_cast<char*>(t.data) +
              (token * t.strides[0] + h * t.strides[1]) * dtype_size_bytes(t.dtype);
  store_floats(t.dtype, tmp->data(), n, dst, 1);
}

}  // namespace

Status mha_prefill_backward(const MhaPrefillBackwardArgs& args,
                            const core::MhaPrefillShape& shape) {
  const std::vector<MhaSequence> seqs = mha_sequences(args.cu_seqlens_q, args.cu_seqlens_kv,
                                                      shape.batch);
  const int d_qk = static_cast<int>(shape.d_qk), d_v = static_cast<int>(shape.d_v);
  const int64_t h_q = shape.h_q, group = shape.h_q / shape.h_kv;
  const double scale = shape.softmax_scale;
  const float fscale = shape.softmax_scale;
  // D_t = dout_t · out_t for every (token, query head), filled by the first pass.
  std::vector<double> delta(static_cast<size_t>(shape.total_q * h_q));

  // --- pass 1: D and dq, by (sequence, query head, chunk of query tokens) ----------------------
  const std::vector<MhaUnit> q_units =
      mha_units(seqs, h_q, [](const MhaSequence& s) { return s.s_q; });
  const int64_t num_q_units = static_cast<int64_t>(q_units.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t u = 0; u < num_q_units; ++u) {
    const MhaSequence& seq = seqs[q_units[u].seq];
    const int64_t h = q_units[u].head, g = h / group, t0 = q_units[u].r0;
    const int64_t rows = std::min(kMhaRowChunk, seq.s_q - t0);
    const int64_t keys = mha_visible_keys(seq, t0 + rows - 1, args.causal);
    std::vector<float> k(static_cast<size_t>(keys) * d_qk), v(static_cast<size_t>(keys) * d_v);
    mha_load_rows(args.k, seq.kv0, keys, g, d_qk, k.data());
    mha_load_rows(args.v, seq.kv0, keys, g, d_v, v.data());
    std::vector<float> q(d_qk), dout(d_v), out(d_v), tmp(d_qk);
    std::vector<double> dq(d_qk);
    for (int64_t t = t0; t < t0 + rows; ++t) {
      const int64_t token = seq.q0 + t;
      mha_load_rows(args.q, token, 1, h, d_qk, q.data());
      mha_load_rows(args.dout, token, 1, h, d_v, dout.data());
      mha_load_rows(args.out, token, 1, h, d_v, out.data());
      double dsum = 0.0;
      for (int d = 0; d < d_v; ++d) dsum += static_cast<double>(dout[d]) * out[d];
      delta[token * h_q + h] = dsum;
      const double lse = mha_lse_at(args.lse, token, h);
      std::fill(dq.begin(), dq.end(), 0.0);
      const int64_t n = mha_visible_keys(seq, t, args.causal);  // 0: dq stays 0
      for (int64_t j = 0; j < n; ++j) {
        const float* kj = k.data() + j * d_qk;
        const double p = std::exp(fscale * mha_dot(q.data(), kj, d_qk) - lse);
        const double ds = p * (mha_dot(dout.data(), v.data() + j * d_v, d_v) - dsum);
        for (int d = 0; d < d_qk; ++d) dq[d] += ds * kj[d];
      }
      store_row(args.dq, token, h, dq, scale, &tmp);
    }
  }

  // --- pass 2: dk and dv, by (sequence, kv head, chunk of keys) -------------------------------
  const std::vector<MhaUnit> kv_units =
      mha_units(seqs, shape.h_kv, [](const MhaSequence& s) { return s.s_kv; });
  const int64_t num_kv_units = static_cast<int64_t>(kv_units.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t u = 0; u < num_kv_units; ++u) {
    const MhaSequence& seq = seqs[kv_units[u].seq];
    const int64_t g = kv_units[u].head, j0 = kv_units[u].r0;
    const int64_t keys = std::min(kMhaRowChunk, seq.s_kv - j0);
    // Query t sees key j iff t >= j - (s_kv - s_q) (causal); the chunk's first key decides
    // which queries matter at all.
    const int64_t t_first =
        args.causal ? std::clamp<int64_t>(j0 - (seq.s_kv - seq.s_q), 0, seq.s_q) : 0;
    const int64_t rows = seq.s_q - t_first;
    std::vector<float> k(static_cast<size_t>(keys) * d_qk), v(static_cast<size_t>(keys) * d_v);
    mha_load_rows(args.k, seq.kv0 + j0, keys, g, d_qk, k.data());
    mha_load_rows(args.v, seq.kv0 + j0, keys, g, d_v, v.data());
    std::vector<double> dk(static_cast<size_t>(keys) * d_qk, 0.0);
    std::vector<double> dv(static_cast<size_t>(keys) * d_v, 0.0);
    std::vector<float> q(static_cast<size_t>(rows) * d_qk), dout(static_cast<size_t>(rows) * d_v);
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      mha_load_rows(args.q, seq.q0 + t_first, rows, h, d_qk, q.data());
      mha_load_rows(args.dout, seq.q0 + t_first, rows, h, d_v, dout.data());
      for (int64_t j = 0; j < keys; ++j) {
        const int64_t key = j0 + j;
        const int64_t t_min =
            args.causal ? std::max<int64_t>(key - (seq.s_kv - seq.s_q), t_first) : 0;
        const float* kj = k.data() + j * d_qk;
        const float* vj = v.data() + j * d_v;
        double* dkj = dk.data() + j * d_qk;
        double* dvj = dv.data() + j * d_v;
        for (int64_t t = t_min; t < seq.s_q; ++t) {
          const int64_t token = seq.q0 + t;
          const float* qt = q.data() + (t - t_first) * d_qk;
          const float* dot = dout.data() + (t - t_first) * d_v;
          const double lse = mha_lse_at(args.lse, token, h);
          const double p = std::exp(fscale * mha_dot(qt, kj, d_qk) - lse);
          const double ds = p * (mha_dot(dot, vj, d_v) - delta[token * h_q + h]);
          for (int d = 0; d < d_qk; ++d) dkj[d] += ds * qt[d];
          for (int d = 0; d < d_v; ++d) dvj[d] += p * dot[d];
        }
      }
    }
    std::vector<float> tmp(std::max(d_qk, d_v));
    std::vector<double> row_k(d_qk), row_v(d_v);
    for (int64_t j = 0; j < keys; ++j) {
      std::copy(dk.begin() + j * d_qk, dk.begin() + (j + 1) * d_qk, row_k.begin());
      std::copy(dv.begin() + j * d_v, dv.begin() + (j + 1) * d_v, row_v.begin());
      store_row(args.dk, seq.kv0 + j0 + j, g, row_k, scale, &tmp);
      store_row(args.dv, seq.kv0 + j0 + j, g, row_v, 1.0, &tmp);
    }
  }
  return Status::Ok();
}

}  // namespace openmla::cpu
