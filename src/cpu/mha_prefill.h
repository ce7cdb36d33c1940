// Dense MHA prefill on the CPU (docs/semantics.md, dense MHA prefill): forward in
// mha_prefill.cc, backward in mha_prefill_backward.cc, and what the two share. Logits and dot
// products in float32, softmax sums and every accumulation over keys or queries in double.
#pragma once

#include <cstdint>
#include <vector>

#include "core/validate_mha.h"
#include "openmla/ops.h"

namespace openmla::cpu {

Status mha_prefill(const MhaPrefillArgs& args, const core::MhaPrefillShape& shape);
Status mha_prefill_backward(const MhaPrefillBackwardArgs& args, const core::MhaPrefillShape& shape);

// One sequence of a varlen batch: its first query token and key, and its lengths.
struct MhaSequence {
  int64_t q0, s_q, kv0, s_kv;
};

// The sequences cu_seqlens_q / cu_seqlens_kv describe (validated: on the host, consistent).
std::vector<MhaSequence> mha_sequences(const TensorView& cu_seqlens_q,
                                       const TensorView& cu_seqlens_kv, int64_t batch);

// How many keys query t of `seq` sees: all of them, or with `causal` the first
// t + s_kv - s_q + 1 (bottom-right aligned), clamped to [0, s_kv].
inline int64_t mha_visible_keys(const MhaSequence& seq, int64_t t, bool causal) {
  if (!causal) return seq.s_kv;
  const int64_t n = t + seq.s_kv - seq.s_q + 1;
  return n < 0 ? 0 : (n > seq.s_kv ? seq.s_kv : n);
}

// Rows r0 .. r0 + n - 1 of head `h` of a [tokens, heads, dim] bf16/fp16 tensor (last dim
// contiguous) as float, `dim` floats a row.
void mha_load_rows(const TensorView& t, int64_t r0, int64_t n, int64_t h, int dim, float* dst);

// Σ a[i] · b[i] in float32.
float mha_dot(const float* a, const float* b, int n);

// lse element (token, head) of a [total_q, h_q] fp32 view of any strides.
inline float& mha_lse_at(const TensorView& lse, int64_t token, int64_t h) {
  return lse.data_as<float>()[token * lse.strides[0] + h * lse.strides[1]];
}

// Rows a work unit takes at once (queries in the forward, keys in the backward's dk/dv pass):
// every unit converts its sequence's keys (or queries) once, so a unit holds many rows.
constexpr int64_t kMhaRowChunk = 64;

// A unit of the CPU passes' parallel loops: a sequence, a head and a chunk of kMhaRowChunk rows
// from r0 (query tokens or keys, as `rows` gives a sequence's count).
struct MhaUnit {
  int64_t seq, head, r0;
};
template <typename Rows>
std::vector<MhaUnit> mha_units(const std::vector<MhaSequence>& seqs, int64_t heads, Rows rows) {
  std::vector<MhaUnit> units;
  for (int64_t i = 0; i < static_cast<int64_t>(seqs.size()); ++i) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t r0 = 0; r0 < rows(seqs[i]); r0 += kMhaRowChunk) units.push_back({i, h, r0});
    }
  }
  return units;
}

}  // namespace openmla::cpu
