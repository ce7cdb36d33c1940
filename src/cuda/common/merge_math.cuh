// The arithmetic of merging attention states (docs/semantics.md, merge), shared by the split-KV
// decode combine (combine.cu) and merge_attention_states (merge_states.cu): parts are weighed by
// e^(lse_i - lse), lse = max + log Σ e^(lse_i - max), and a merge of parts that hold no key has
// lse +inf and output 0.
#pragma once

#include <cmath>

namespace openmla::cuda::merge_math {

// The merged lse from the parts' largest lse and their sum of e^(lse_i - max_lse): +inf when no
// part held a key (max_lse -inf).
__device__ __forceinline__ float merged_lse(float max_lse, float sum) {
  return max_lse == -INFINITY ? INFINITY : max_lse + logf(sum);
}

// One part of lse l into a running (max, sum) of e^(lse_i - max): the factor the sums so far
// take (1 while the max stays, 0 from an empty start) and l's weight against the new max (0 for
// a part without keys, l = -inf, whose values may be garbage and must be selected away).
struct OnlineStep {
  float rescale, weight;
};
__device__ __forceinline__ OnlineStep online_add(float& max_lse, float& sum, float l) {
  const float m = fmaxf(max_lse, l);
  OnlineStep step;
  step.rescale = max_lse == m ? 1.f : __expf(max_lse - m);
  step.weight = l == -INFINITY ? 0.f : __expf(l - m);
  max_lse = m;
  sum = sum * step.rescale + step.weight;
  return step;
}

// The attention sink's factor on a merged row: 1 / (1 + e^(sink - lse)); 1 for a row without
// keys (lse +inf, out 0), whatever the sink (+inf too).
__device__ __forceinline__ float sink_factor(float sink, float lse) {
  return lse == INFINITY ? 1.f : 1.f / (1.f + expf(sink - lse));
}

}  // namespace openmla::cuda::merge_math
