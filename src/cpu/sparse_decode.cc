// Sparse decode on the CPU (docs/semantics.md, sparse decode). A work unit is (request, query token, chunk of heads);
// it gathers the token's valid indices of the main cache and then of the extra cache into one
// key list (one softmax over both), and decodes each tile of keys with the codec once for all of
// its heads. Invalid indices never reach the codec, so they are never read.
#include <algorithm>
#include <vector>

#include "core/codec.h"
#include "cpu/attention_row.h"
#include "cpu/cpu_backend.h"

namespace openmla::cpu {
namespace {

struct KeyRef {
  const KVCache* cache;
  int64_t slot;
};

// Entries [0, count) of indices[i, j, :] that address a slot of `cache`, in order.
void append_valid(const KVCache& cache, const TensorView& indices, int64_t i, int64_t j,
                  int64_t count, std::vector<KeyRef>* keys) {
  const int32_t* row =
      indices.data_as<const int32_t>() + i * indices.strides[0] + j * indices.strides[1];
  const int64_t num_slots = cache.num_tokens();
  for (int64_t e = 0; e < count; ++e) {
    const int64_t slot = row[e * indices.strides[2]];
    if (slot >= 0 && slot < num_slots) keys->push_back({&cache, slot});
  }
}

// How many entries of request i count: all `topk`, or topk_length[i] clamped to [0, topk].
int64_t counted(const TensorView& topk_length, int64_t i, int64_t topk) {
  if (!topk_length.defined()) return topk;
  const int64_t n = topk_length.data_as<const int32_t>()[i * topk_length.strides[0]];
  return std::clamp<int64_t>(n, 0, topk);
}

}  // namespace

Status sparse_decode(const SparseDecodeArgs& args, const core::SparseDecodeShape& shape) {
  const TensorView& q = args.q;
  const TensorView& out = args.out;
  const TensorView& lse = args.lse;
  const int64_t batch = shape.batch, s_q = shape.s_q, h_q = shape.h_q;
  const int d_qk = static_cast<int>(shape.d_qk), d_v = static_cast<int>(shape.d_v);
  const int chunk = row_chunk(h_q, batch * s_q);
  const int64_t chunks = (h_q + chunk - 1) / chunk;
  const int64_t units = batch * s_q * chunks;
  const bool has_extra = args.extra_k_cache.defined();
  const bool has_sink = args.attn_sink.defined();

#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t unit = 0; unit < units; ++unit) {
    const int64_t i = unit / (s_q * chunks);
    const int64_t j = unit / chunks % s_q;
    const int64_t h0 = unit % chunks * chunk;
    const int num_rows = static_cast<int>(std::min<int64_t>(chunk, h_q - h0));

    std::vector<KeyRef> keys;
    append_valid(args.k_cache, args.indices, i, j, counted(args.topk_length, i, shape.topk), &keys);
    if (has_extra) {
      append_valid(args.extra_k_cache, args.extra_indices, i, j,
                   counted(args.extra_topk_length, i, shape.extra_topk), &keys);
    }

    RowsAttention att(num_rows, d_qk, d_v, shape.softmax_scale);
    for (int r = 0; r < num_rows; ++r) {
      const int64_t offset = i * q.strides[0] + j * q.strides[1] + (h0 + r) * q.strides[2];
      load_floats(q, offset, d_qk, att.q(r));
    }
    std::vector<float> tile(static_cast<size_t>(kKeyTile) * d_qk);
    const int64_t num_keys = static_cast<int64_t>(keys.size());
    for (int64_t t0 = 0; t0 < num_keys; t0 += kKeyTile) {
      const int n = static_cast<int>(std::min<int64_t>(kKeyTile, num_keys - t0));
      for (int t = 0; t < n; ++t) {
        codec::decode_slot(*keys[t0 + t].cache, keys[t0 + t].slot, tile.data() + t * d_qk);
      }
      att.attend(tile.data(), n);
    }

    std::vector<float> o(d_v);
    for (int r = 0; r < num_rows; ++r) {
      const int64_t h = h0 + r;
      const RowsAttention::Result res = att.finish(r, o.data());
      if (has_sink && res.lse != kInf) {  // a lonely row stays 0 (and +inf - +inf is NaN)
        const float f = sink_factor(
            args.attn_sink.data_as<const float>()[h * args.attn_sink.strides[0]], res.lse);
        for (float& x : o) x *= f;
      }
      const int64_t offset = i * out.strides[0] + j * out.strides[1] + h * out.strides[2];
      store_floats(out.dtype, o.data(), d_v, element_ptr(out, offset), out.strides[3]);
      lse.data_as<float>()[i * lse.strides[0] + h * lse.strides[1] + j * lse.strides[2]] = res.lse;
      if (const TensorView& ml = args.max_logits; ml.defined()) {
        ml.data_as<float>()[i * ml.strides[0] + h * ml.strides[1] + j * ml.strides[2]] =
            res.max_logit;
      }
    }
  }
  return Status::Ok();
}

}  // namespace openmla::cpu
