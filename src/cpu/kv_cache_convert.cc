// kv_cache_convert on the CPU: codec::decode_token then codec::encode_token for every token of
// every converted block; the codec does every byte.
#include "cpu/kv_cache_convert.h"

#include <omp.h>

#include <vector>

#include "core/codec.h"

namespace openmla::cpu {
namespace {

int64_t block_at(const TensorView& t, int64_t i) {
  const int64_t offset = i * t.strides[0];
  return t.dtype == DType::kInt64 ? t.data_as<const int64_t>()[offset]
                                  : t.data_as<const int32_t>()[offset];
}

void convert_block(const KVCache& src, int64_t src_block, const KVCache& dst, int64_t dst_block,
                   std::vector<float>& row) {
  const uint8_t* from = codec::block_ptr(static_cast<const void*>(src.data), src.layout, src_block);
  uint8_t* to = codec::block_ptr(dst.data, dst.layout, dst_block);
  for (int t = 0; t < src.layout.page_size; ++t) {
    codec::decode_token(src.layout, from, t, row.data());
    codec::encode_token(dst.layout, row.data(), to, t);
  }
}

}  // namespace

Status kv_cache_convert(const KVCacheConvertArgs& args, const core::KVCacheConvertShape& shape) {
  const int64_t n = shape.num_blocks;
  if (!shape.block_lists) {
#pragma omp parallel
    {
      std::vector<float> row(shape.d_qk);
#pragma omp for schedule(static)
      for (int64_t b = 0; b < n; ++b) convert_block(args.src, b, args.dst, b, row);
    }
    return Status::Ok();
  }
  // Each thread owns the dst blocks with block % threads == its id and walks the list in order,
  // so pairs naming one dst block never race (the last of them lands, whatever the thread
  // count). Ids were checked by validation: -1 or in range.
#pragma omp parallel
  {
    const int64_t me = omp_get_thread_num(), threads = omp_get_num_threads();
    std::vector<float> row(shape.d_qk);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t src_block = block_at(args.src_blocks, i);
      const int64_t dst_block = block_at(args.dst_blocks, i);
      if (src_block < 0 || dst_block < 0 || dst_block % threads != me) continue;
      convert_block(args.src, src_block, args.dst, dst_block, row);
    }
  }
  return Status::Ok();
}

}  // namespace openmla::cpu
