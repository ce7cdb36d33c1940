// Run-time KV formats and dims to the compile-time codecs of kv_codec.cuh: each helper calls
// fn with a tag type (CodecTag<...>, DimsTag<...>) whose ::value the callee uses as a template
// argument. The arguments are validated before, so every switch is exhaustive.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/common/kv_codec.cuh"
#include "openmla/kv_format.h"
#include "openmla/tensor.h"

namespace openmla::cuda::kvcodec {

template <Codec C>
using CodecTag = std::integral_constant<Codec, C>;
template <int D>
using DimsTag = std::integral_constant<int, D>;

// Calls fn(CodecTag<...>) for a cache format (validated, so the default is unreachable).
template <typename F>
auto with_cache_codec(KVFormat format, F&& fn) {
  switch (format) {
    case KVFormat::kBF16:
      return fn(CodecTag<Codec::kBF16>{});
    case KVFormat::kFP16:
      return fn(CodecTag<Codec::kFP16>{});
    case KVFormat::kFP8_V32:
      return fn(CodecTag<Codec::kFP8_V32>{});
    case KVFormat::kFP8_Model1:
      return fn(CodecTag<Codec::kFP8_Model1>{});
    case KVFormat::kFP8_MX:
      return fn(CodecTag<Codec::kFP8_MX>{});
    case KVFormat::kFP4:
      return fn(CodecTag<Codec::kFP4>{});
  }
  return fn(CodecTag<Codec::kBF16>{});
}
// A dense row's codec: bf16 or fp32 (validated).
template <typename F>
auto with_dense_codec(DType dtype, F&& fn) {
  return dtype == DType::kFP32 ? fn(CodecTag<Codec::kF32>{}) : fn(CodecTag<Codec::kBF16>{});
}
template <typename F>
auto with_dims(int64_t d_qk, F&& fn) {
  return d_qk == 576 ? fn(DimsTag<576>{}) : fn(DimsTag<512>{});
}

}  // namespace openmla::cuda::kvcodec
