// Merge of partial attention states on the CPU (docs/semantics.md, merge), one (token, head) per iteration.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/attention_row.h"
#include "cpu/cpu_backend.h"

namespace openmla::cpu {

Status merge_attention_states(const MergeStatesArgs& args, const core::MergeStatesShape& shape) {
  const TensorView& part_out = args.part_out;
  const TensorView& part_lse = args.part_lse;
  const TensorView& out = args.out;
  const int64_t num_parts = shape.num_parts, tokens = shape.tokens, heads = shape.heads;
  const int d_v = static_cast<int>(shape.d_v);
  const size_t part_elem = dtype_size_bytes(part_out.dtype);
  const size_t out_elem = dtype_size_bytes(out.dtype);

#pragma omp parallel for schedule(static)
  for (int64_t th = 0; th < tokens * heads; ++th) {
    const int64_t t = th / heads, h = th % heads;
    auto part_lse_at = [&](int64_t p) {
      return part_lse.data_as<const float>()[p * part_lse.strides[0] + t * part_lse.strides[1] +
                                             h * part_lse.strides[2]];
    };
    // Parts whose lse is ±inf or NaN hold no keys.
    double max_lse = -INFINITY;
    for (int64_t p = 0; p < num_parts; ++p) {
      const float l = part_lse_at(p);
      if (std::isfinite(l)) max_lse = std::max(max_lse, static_cast<double>(l));
    }
    std::vector<float> acc(d_v, 0.f), row(d_v);
    float merged_lse = kInf;
    if (max_lse != -INFINITY) {
      double sum = 0.0;
      for (int64_t p = 0; p < num_parts; ++p) {
        const float l = part_lse_at(p);
        if (std::isfinite(l)) sum += std::exp(l - max_lse);
      }
      const double lse_total = max_lse + std::log(sum);
      merged_lse = static_cast<float>(lse_total);
      for (int64_t p = 0; p < num_parts; ++p) {
        const float l = part_lse_at(p);
        if (!std::isfinite(l)) continue;
        const float w = static_cast<float>(std::exp(l - lse_total));
        const int64_t offset =
            p * part_out.strides[0] + t * part_out.strides[1] + h * part_out.strides[2];
        const void* src = static_cast<const char*>(part_out.data) + offset * part_elem;
        if (part_out.dtype == DType::kFP32) {
          const float* x = static_cast<const float*>(src);
          for (int d = 0; d < d_v; ++d) acc[d] += w * x[d * part_out.strides[3]];
        } else {
          half_to_float(part_out.dtype, src, part_out.strides[3], d_v, row.data());
          for (int d = 0; d < d_v; ++d) acc[d] += w * row[d];
        }
      }
    }
    const int64_t offset = t * out.strides[0] + h * out.strides[1];
    store_floats(out.dtype, acc.data(), d_v, static_cast<char*>(out.data) + offset * out_elem,
                 out.strides[2]);
    if (args.lse.defined()) {
      args.lse.data_as<float>()[t * args.lse.strides[0] + h * args.lse.strides[1]] = merged_lse;
    }
  }
  return Status::Ok();
}

}  // namespace openmla::cpu
