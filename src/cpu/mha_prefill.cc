// Dense MHA prefill forward on the CPU (docs/semantics.md, dense MHA prefill). A work unit is
// (sequence, query head, chunk of kMhaRowChunk query tokens): it converts its kv head's keys and
// values of the sequence to float once, then each query row runs an exact softmax over the keys
// it sees (no online rescaling: the row's logits are all computed first).
#include "cpu/mha_prefill.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/attention_row.h"

namespace openmla::cpu {

std::vector<MhaSequence> mha_sequences(const TensorView& cu_seqlens_q,
                                       const TensorView& cu_seqlens_kv, int64_t batch) {
  auto at = [](const TensorView& t, int64_t i) {
    return static_cast<int64_t>(t.data_as<const int32_t>()[i * t.strides[0]]);
  };
  std::vector<MhaSequence> seqs(batch);
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t q0 = at(cu_seqlens_q, i), kv0 = at(cu_seqlens_kv, i);
    seqs[i] = {q0, at(cu_seqlens_q, i + 1) - q0, kv0, at(cu_seqlens_kv, i + 1) - kv0};
  }
  return seqs;
}

void mha_load_rows(const TensorView& t, int64_t r0, int64_t n, int64_t h, int dim, float* dst) {
  const size_t elem = dtype_size_bytes(t.dtype);
  const auto* base = static_cast<const char*>(t.data);
  for (int64_t r = 0; r < n; ++r) {
    const char* row = base + ((r0 + r) * t.strides[0] + h * t.strides[1]) * elem;
    half_to_float(t.dtype, row, 1, dim, dst + r * dim);
  }
}

float mha_dot(const float* a, const float* b, int n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

Status mha_prefill(const MhaPrefillArgs& args, const core::MhaPrefillShape& shape) {
  const std::vector<MhaSequence> seqs = mha_sequences(args.cu_seqlens_q, args.cu_seqlens_kv,
                                                      shape.batch);
  const int d_qk = static_cast<int>(shape.d_qk), d_v = static_cast<int>(shape.d_v);
  const int64_t group = shape.h_q / shape.h_kv;
  const float scale = shape.softmax_scale;
  const std::vector<MhaUnit> units =
      mha_units(seqs, shape.h_q, [](const MhaSequence& s) { return s.s_q; });
  const int64_t num_units = static_cast<int64_t>(units.size());
  const size_t out_elem = dtype_size_bytes(args.out.dtype);

#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t u = 0; u < num_units; ++u) {
    const MhaSequence& seq = seqs[units[u].seq];
    const int64_t h = units[u].head, g = h / group, t0 = units[u].r0;
    const int64_t rows = std::min(kMhaRowChunk, seq.s_q - t0);
    // Only the keys some row of the chunk sees.
    const int64_t keys = mha_visible_keys(seq, t0 + rows - 1, args.causal);
    std::vector<float> k(static_cast<size_t>(keys) * d_qk), v(static_cast<size_t>(keys) * d_v);
    mha_load_rows(args.k, seq.kv0, keys, g, d_qk, k.data());
    mha_load_rows(args.v, seq.kv0, keys, g, d_v, v.data());

    std::vector<float> q(d_qk), logits(keys), o(d_v);
    std::vector<double> acc(d_v);
    for (int64_t t = t0; t < t0 + rows; ++t) {
      const int64_t token = seq.q0 + t;
      mha_load_rows(args.q, token, 1, h, d_qk, q.data());
      const int64_t n = mha_visible_keys(seq, t, args.causal);
      float lse = -std::numeric_limits<float>::infinity();
      std::fill(o.begin(), o.end(), 0.f);
      if (n > 0) {
        float max_logit = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < n; ++j) {
          logits[j] = scale * mha_dot(q.data(), k.data() + j * d_qk, d_qk);
          max_logit = std::max(max_logit, logits[j]);
        }
        std::fill(acc.begin(), acc.end(), 0.0);
        double sum = 0.0;
        for (int64_t j = 0; j < n; ++j) {
          const double p = std::exp(static_cast<double>(logits[j]) - max_logit);
          sum += p;
          const float* vj = v.data() + j * d_v;
          for (int d = 0; d < d_v; ++d) acc[d] += p * vj[d];
        }
        for (int d = 0; d < d_v; ++d) o[d] = static_cast<float>(acc[d] / sum);
        lse = static_cast<float>(max_logit + std::log(sum));
      }
      char* dst = static_cast<char*>(args.out.data) +
                  (token * args.out.strides[0] + h * args.out.strides[1]) * out_elem;
      store_floats(args.out.dtype, o.data(), d_v, dst, 1);
      mha_lse_at(args.lse, token, h) = lse;
    }
  }
  return Status::Ok();
}

}  // namespace openmla::cpu
