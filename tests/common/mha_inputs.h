// The inputs of one dense MHA prefill test case (forward and backward, CPU and GPU tests): the
// varlen offsets from per-sequence lengths, and q, k, v, dout filled from one seeded Rng in that
// order, either contiguous or (strided) as slices of FlashMLA's packed rows
// qkv [tokens, h, 2 d_qk + d_v + pad], so each tensor's rows are strided.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/test_data.h"
#include "openmla/tensor.h"

namespace openmla::testing {

struct MhaInputs {
  int64_t total_q = 0, total_kv = 0, max_q = 0, max_kv = 0;
  int64_t pad = 0;  // 8 when strided: the gap after each packed row, and in padded outputs
  std::vector<int64_t> cu_q{0}, cu_kv{0};
  HostTensor q, k, v, dout, cu_q_t, cu_kv_t;  // cu_*_t: int32 [batch + 1]

  MhaInputs(const std::vector<int64_t>& seqlens_q, const std::vector<int64_t>& seqlens_kv,
            int64_t h_q, int64_t h_kv, int64_t d_qk, int64_t d_v, DType dtype, bool strided,
            uint64_t seed) {
    for (size_t i = 0; i < seqlens_q.size(); ++i) {
      cu_q.push_back(cu_q.back() + seqlens_q[i]);
      cu_kv.push_back(cu_kv.back() + seqlens_kv[i]);
      max_q = std::max(max_q, seqlens_q[i]);
      max_kv = std::max(max_kv, seqlens_kv[i]);
    }
    total_q = cu_q.back();
    total_kv = cu_kv.back();
    const int64_t b1 = static_cast<int64_t>(cu_q.size());
    cu_q_t = HostTensor(DType::kInt32, {b1});
    cu_kv_t = HostTensor(DType::kInt32, {b1});
    for (int64_t i = 0; i < b1; ++i) {
      cu_q_t.set({i}, static_cast<double>(cu_q[i]));
      cu_kv_t.set({i}, static_cast<double>(cu_kv[i]));
    }
    Rng rng(seed);
    pad = strided ? 8 : 0;
    if (strided) {
      const int64_t row = d_qk + d_qk + d_v + pad;
      q = HostTensor(dtype, {total_q, h_q, d_qk}, {h_q * row, row, 1});
      k = HostTensor(dtype, {total_kv, h_kv, d_qk}, {h_kv * row, row, 1});
      v = HostTensor(dtype, {total_kv, h_kv, d_v}, {h_kv * row, row, 1});
    } else {
      q = HostTensor(dtype, {total_q, h_q, d_qk});
      k = HostTensor(dtype, {total_kv, h_kv, d_qk});
      v = HostTensor(dtype, {total_kv, h_kv, d_v});
    }
    q.fill_normal(rng);
    k.fill_normal(rng);
    v.fill_normal(rng);
    dout = HostTensor(dtype, {total_q, h_q, d_v});
    dout.fill_normal(rng);
  }
};

}  // namespace openmla::testing
