// Sparse prefill on the CPU (docs/semantics.md, sparse prefill). A work unit is (query token, kv head, chunk of that kv
// head's query heads): the heads of one kv head share the token's index list, so each tile of
// gathered keys is converted once for all of them.
#include <algorithm>
#include <vector>

#include "cpu/attention_row.h"
#include "cpu/cpu_backend.h"

namespace openmla::cpu {

Status sparse_prefill(const SparsePrefillArgs& args, const core::SparsePrefillShape& shape) {
  const TensorView& q = args.q;
  const TensorView& kv = args.kv;
  const TensorView& idx = args.indices;
  const int64_t s_q = shape.s_q, s_kv = shape.s_kv, h_kv = shape.h_kv, topk = shape.topk;
  const int d_qk = static_cast<int>(shape.d_qk), d_v = static_cast<int>(shape.d_v);
  const int64_t group = shape.h_q / h_kv;
  const int chunk = row_chunk(group, s_q * h_kv);
  const int64_t chunks = (group + chunk - 1) / chunk;
  const int64_t units = s_q * h_kv * chunks;

#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t unit = 0; unit < units; ++unit) {
    const int64_t s = unit / (h_kv * chunks);
    const int64_t g = unit / chunks % h_kv;
    const int64_t h0 = g * group + unit % chunks * chunk;  // first query head of the unit
    const int num_rows = static_cast<int>(std::min<int64_t>(chunk, (g + 1) * group - h0));

    int64_t count = topk;
    if (args.topk_length.defined()) {
      count = std::clamp<int64_t>(
          args.topk_length.data_as<const int32_t>()[s * args.topk_length.strides[0]], 0, topk);
    }
    const int32_t* row = idx.data_as<const int32_t>() + s * idx.strides[0] + g * idx.strides[1];
    std::vector<int64_t> keys;
    keys.reserve(count);
    for (int64_t e = 0; e < count; ++e) {
      const int64_t key = row[e * idx.strides[2]];
      if (key >= 0 && key < s_kv) keys.push_back(key);
    }

    RowsAttention att(num_rows, d_qk, d_v, shape.softmax_scale);
    for (int r = 0; r < num_rows; ++r) {
      const int64_t offset = s * q.strides[0] + (h0 + r) * q.strides[1];
      load_floats(q, offset, d_qk, att.q(r));
    }
    std::vector<float> tile(static_cast<size_t>(kKeyTile) * d_qk);
    const int64_t num_keys = static_cast<int64_t>(keys.size());
    for (int64_t t0 = 0; t0 < num_keys; t0 += kKeyTile) {
      const int n = static_cast<int>(std::min<int64_t>(kKeyTile, num_keys - t0));
      for (int t = 0; t < n; ++t) {
        const int64_t offset = keys[t0 + t] * kv.strides[0] + g * kv.strides[1];
        bf16_to_float(kv.data_as<const uint16_t>() + offset, 1, d_qk, tile.data() + t * d_qk);
      }
      att.attend(tile.data(), n);
    }

    std::vector<float> o(d_v);
    for (int r = 0; r < num_rows; ++r) {
      const int64_t h = h0 + r;
      const RowsAttention::Result res = att.finish(r, o.data());
      store_prefill_row(args, s, h, o.data(), d_v, res.lse, res.max_logit);
    }
  }
  return Status::Ok();
}

void store_prefill_row(const SparsePrefillArgs& args, int64_t s, int64_t h, float* o, int d_v,
                       float lse, float max_logit) {
  if (args.attn_sink.defined() && lse != kInf) {  // a lonely row stays 0
    const float f =
        sink_factor(args.attn_sink.data_as<const float>()[h * args.attn_sink.strides[0]], lse);
    for (int d = 0; d < d_v; ++d) o[d] *= f;
  }
  const TensorView& out = args.out;
  store_floats(out.dtype, o, d_v, element_ptr(out, s * out.strides[0] + h * out.strides[1]),
               out.strides[2]);
  const TensorView& ml = args.max_logits;
  ml.data_as<float>()[s * ml.strides[0] + h * ml.strides[1]] = max_logit;
  args.lse.data_as<float>()[s * args.lse.strides[0] + h * args.lse.strides[1]] = lse;
}

}  // namespace openmla::cpu
