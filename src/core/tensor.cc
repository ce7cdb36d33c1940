#include "openmla/tensor.h"

#include "core/str_cat.h"

#include <cassert>
#include <string>

namespace openmla {

size_t dtype_size_bytes(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
    case DType::kFP16: return 2;
    case DType::kFP32:
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
    case DType::kUInt8: return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return "bf16";
    case DType::kFP16: return "fp16";
    case DType::kFP32: return "fp32";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kUInt8: return "uint8";
  }
  return "unknown";
}

std::string device_name(Device device) {
  if (device.type == DeviceType::kCPU) return "cpu";
  return "cuda:" + std::to_string(device.index);
}

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                                  Device device) {
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.rank = static_cast<int>(shape.size());
  assert(t.rank <= kMaxTensorRank);
  int i = 0;
  for (int64_t s : shape) t.shape[i++] = s;
  int64_t stride = 1;
  for (int d = t.rank - 1; d >= 0; --d) {
    t.strides[d] = stride;
    stride *= t.shape[d];
  }
  return t;
}

TensorView TensorView::strided(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               std::initializer_list<int64_t> strides, Device device) {
  TensorView t = contiguous(data, dtype, shape, device);
  assert(strides.size() == shape.size());
  int i = 0;
  for (int64_t s : strides) t.strides[i++] = s;
  return t;
}

// A view whose rank is outside [0, kMaxTensorRank] is bad input (validation says so); these
// helpers read at most kMaxTensorRank sizes so that reporting it stays in bounds.
namespace {
int stored_rank(int rank) { return rank < 0 ? 0 : (rank > kMaxTensorRank ? kMaxTensorRank : rank); }
}  // namespace

int64_t TensorView::numel() const {
  int64_t n = 1;
  bool overflow = false;
  for (int d = 0; d < stored_rank(rank); ++d) {
    if (shape[d] == 0) return 0;
    overflow = overflow || __builtin_mul_overflow(n, shape[d], &n);
  }
  return overflow ? INT64_MAX : n;  // INT64_MAX: past int64 (validation rejects it)
}

bool TensorView::is_contiguous() const {
  int64_t stride = 1;
  for (int d = stored_rank(rank) - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != stride) return false;
    if (__builtin_mul_overflow(stride, shape[d], &stride)) return false;
  }
  return true;
}

std::string TensorView::shape_string() const {
  std::string s = "[";
  for (int d = 0; d < stored_rank(rank); ++d) s += core::str_cat(d ? ", " : "", shape[d]);
  return s + "]";
}

}  // namespace openmla
