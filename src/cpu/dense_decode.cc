// Dense decode on the CPU (docs/semantics.md, dense decode). A work unit is (request, kv head, chunk of query rows);
// it walks the request's keys in tiles of kKeyTile, converting each tile to float once for all of
// its rows. The split-KV schedule is a GPU concern: the CPU ignores args.schedule, since every row
// sees its keys in the same order either way.
#include <algorithm>
#include <vector>

#include "core/codec.h"
#include "cpu/attention_row.h"
#include "cpu/cpu_backend.h"

namespace openmla::cpu {

Status dense_decode(const DenseDecodeArgs& args, const core::DenseDecodeShape& shape) {
  const TensorView& q = args.q;
  const TensorView& k = args.k_cache;
  const TensorView& out = args.out;
  const TensorView& lse = args.lse;
  const int64_t batch = shape.batch, s_q = shape.s_q, h_kv = shape.h_kv;
  const int d_qk = static_cast<int>(shape.d_qk), d_v = static_cast<int>(shape.d_v);
  const int64_t page_size = shape.page_size;
  const int64_t group = shape.h_q / h_kv;  // query heads per kv head, consecutive
  const int64_t rows = s_q * group;        // row = token * group + head-in-group
  const int chunk = row_chunk(rows, batch * h_kv);
  const int64_t chunks = (rows + chunk - 1) / chunk;
  const int64_t units = batch * h_kv * chunks;
  const size_t elem = dtype_size_bytes(q.dtype);  // q, out and a plain k_cache
  const auto* q_bytes = static_cast<const char*>(q.data);
  const auto* k_bytes = static_cast<const char*>(k.data);
  auto* out_bytes = static_cast<char*>(out.data);

#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t unit = 0; unit < units; ++unit) {
    const int64_t i = unit / (h_kv * chunks);
    const int64_t g = unit / chunks % h_kv;
    const int64_t row0 = unit % chunks * chunk;
    const int num_rows = static_cast<int>(std::min<int64_t>(chunk, rows - row0));
    const int64_t len =
        args.cache_seqlens.data_as<const int32_t>()[i * args.cache_seqlens.strides[0]];

    const int32_t* table_row =
        args.block_table.data_as<const int32_t>() + i * args.block_table.strides[0];

    RowsAttention att(num_rows, d_qk, d_v, shape.softmax_scale);
    std::vector<int> limit(num_rows), tile_limit(num_rows);
    int64_t max_limit = 0;
    for (int r = 0; r < num_rows; ++r) {
      const int64_t j = (row0 + r) / group, h = g * group + (row0 + r) % group;
      const int64_t offset = i * q.strides[0] + j * q.strides[1] + h * q.strides[2];
      half_to_float(q.dtype, q_bytes + offset * elem, 1, d_qk, att.q(r));
      const int64_t visible = args.causal ? std::clamp<int64_t>(len - s_q + j + 1, 0, len) : len;
      limit[r] = static_cast<int>(visible);
      max_limit = std::max(max_limit, visible);
    }

    std::vector<float> tile(static_cast<size_t>(kKeyTile) * d_qk);
    for (int64_t t0 = 0; t0 < max_limit; t0 += kKeyTile) {
      const int n = static_cast<int>(std::min<int64_t>(kKeyTile, max_limit - t0));
      for (int t = 0; t < n; ++t) {
        const int64_t key = t0 + t;
        const int64_t block = table_row[key / page_size * args.block_table.strides[1]];
        if (args.kv_cache.defined()) {  // any format, through the codec (one kv head)
          codec::decode_slot(args.kv_cache, block * page_size + key % page_size,
                             tile.data() + t * d_qk);
          continue;
        }
        const int64_t offset =
            block * k.strides[0] + key % page_size * k.strides[1] + g * k.strides[2];
        half_to_float(k.dtype, k_bytes + offset * elem, 1, d_qk, tile.data() + t * d_qk);
      }
      for (int r = 0; r < num_rows; ++r) {
        tile_limit[r] = static_cast<int>(std::clamp<int64_t>(limit[r] - t0, 0, n));
      }
      att.attend(tile.data(), n, tile_limit.data());
    }

    std::vector<float> o(d_v);
    for (int r = 0; r < num_rows; ++r) {
      const int64_t j = (row0 + r) / group, h = g * group + (row0 + r) % group;
      const RowsAttention::Result res = att.finish(r, o.data());
      const int64_t offset = i * out.strides[0] + j * out.strides[1] + h * out.strides[2];
      store_floats(out.dtype, o.data(), d_v, out_bytes + offset * elem, out.strides[3]);
      lse.data_as<float>()[i * lse.strides[0] + h * lse.strides[1] + j * lse.strides[2]] = res.lse;
    }
  }
  return Status::Ok();
}

}  // namespace openmla::cpu
