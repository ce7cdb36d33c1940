// KV-cache write and gather on the CPU (docs/semantics.md, KV-cache write): the codec does every byte.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "core/codec.h"
#include "cpu/attention_row.h"
#include "cpu/cpu_backend.h"

namespace openmla::cpu {
namespace {

int64_t slot_at(const TensorView& slots, int64_t i) {
  const int64_t offset = i * slots.strides[0];
  return slots.dtype == DType::kInt64 ? slots.data_as<const int64_t>()[offset]
                                      : slots.data_as<const int32_t>()[offset];
}

}  // namespace

Status kv_cache_write(const KVCacheWriteArgs& args, const core::KVCacheWriteShape& shape) {
  const TensorView& kv = args.kv;
  const int64_t n = shape.num_tokens;
  const int d_qk = static_cast<int>(shape.d_qk);
  const int64_t num_slots = args.cache.num_tokens();
  const int64_t page_size = args.cache.layout.page_size;

  // Each thread owns the blocks with block % threads == its id and walks the rows in order, so
  // rows naming one slot never race and the last of them lands, whatever the thread count.
#pragma omp parallel
  {
    const int64_t me = omp_get_thread_num(), threads = omp_get_num_threads();
    std::vector<float> row(d_qk);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t slot = slot_at(args.slot_mapping, i);
      if (slot < 0 || slot >= num_slots || slot / page_size % threads != me) continue;
      if (kv.dtype == DType::kFP32) {
        const float* src = kv.data_as<const float>() + i * kv.strides[0];
        for (int d = 0; d < d_qk; ++d) row[d] = src[d * kv.strides[1]];
      } else {
        bf16_to_float(kv.data_as<const uint16_t>() + i * kv.strides[0], kv.strides[1], d_qk,
                      row.data());
      }
      codec::encode_slot(args.cache, slot, row.data());
    }
  }
  return Status::Ok();
}

Status kv_cache_gather(const KVCacheGatherArgs& args, const core::KVCacheWriteShape& shape) {
  const TensorView& out = args.out;
  const int64_t n = shape.num_tokens;
  const int d_qk = static_cast<int>(shape.d_qk);
  const int64_t num_slots = args.cache.num_tokens();
  const size_t elem = dtype_size_bytes(out.dtype);

#pragma omp parallel
  {
    std::vector<float> row(d_qk);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t slot = slot_at(args.slots, i);
      if (slot >= 0 && slot < num_slots) {
        codec::decode_slot(args.cache, slot, row.data());
      } else {
        std::fill(row.begin(), row.end(), 0.f);
      }
      store_floats(out.dtype, row.data(), d_qk,
                   static_cast<char*>(out.data) + i * out.strides[0] * elem, out.strides[1]);
    }
  }
  return Status::Ok();
}

}  // namespace openmla::cpu
