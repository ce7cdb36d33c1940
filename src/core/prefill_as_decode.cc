#include "core/prefill_as_decode.h"

namespace openmla::core {
namespace {

TensorView add_unit_dim(TensorView t, int at) {
  for (int d = t.rank; d > at; --d) {
    t.shape[d] = t.shape[d - 1];
    t.strides[d] = t.strides[d - 1];
  }
  t.shape[at] = 1;
  t.strides[at] = 0;
  ++t.rank;
  return t;
}

}  // namespace

SparseDecodeArgs sparse_prefill_as_decode(const SparsePrefillArgs& a) {
  SparseDecodeArgs d;
  d.q = add_unit_dim(a.q, 1);
  d.k_cache = a.kv_cache;
  d.indices = a.indices;
  d.topk_length = a.topk_length;
  d.attn_sink = a.attn_sink;
  d.d_v = a.d_v;
  d.softmax_scale = a.softmax_scale;
  d.out = add_unit_dim(a.out, 1);
  d.lse = add_unit_dim(a.lse, 2);
  d.max_logits = add_unit_dim(a.max_logits, 2);
  d.workspace = a.workspace;
  return d;
}

}  // namespace openmla::core
