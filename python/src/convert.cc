#include "convert.h"

#include <Python.h>

#include <string>


namespace openmla::python {
namespace {

// DLPack type codes (dlpack.h); the float8 codes arrived with DLPack 1.1.
constexpr uint8_t kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4;
constexpr uint8_t kDLFloat8First = 7, kDLFloat8Last = 14;  // e3m4 … e8m0fnu
// DLPack device types.
constexpr int kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13;

std::string where(const char* op, const char* arg) { return std::string(op) + ": " + arg + ": "; }

std::string dlpack_dtype_name(nb::dlpack::dtype dt) {
  const char* prefix = "code";
  switch (dt.code) {
    case kDLInt:
      prefix = "int";
      break;
    case kDLUInt:
      prefix = "uint";
      break;
    case kDLFloat:
      prefix = "float";
      break;
    case kDLBfloat:
      prefix = "bfloat";
      break;
    case 5:
      prefix = "complex";
      break;
    case 6:
      prefix = "bool";
      break;
    default:
      if (dt.code >= kDLFloat8First && dt.code <= kDLFloat8Last) prefix = "float8_code";
      break;
  }
  std::string name = std::string(prefix) + std::to_string(dt.bits);
  if (dt.lanes != 1) name += "x" + std::to_string(dt.lanes);
  return name;
}

std::optional<DType> to_dtype(nb::dlpack::dtype dt) {
  if (dt.lanes != 1) return std::nullopt;
  if (dt.code == kDLBfloat && dt.bits == 16) return DType::kBF16;
  if (dt.code == kDLFloat && dt.bits == 16) return DType::kFP16;
  if (dt.code == kDLFloat && dt.bits == 32) return DType::kFP32;
  if (dt.code == kDLInt && dt.bits == 32) return DType::kInt32;
  if (dt.code == kDLInt && dt.bits == 64) return DType::kInt64;
  if (dt.code == kDLUInt && dt.bits == 8) return DType::kUInt8;
  return std::nullopt;
}

// Cache bytes may arrive as uint8, int8 or any float8 dtype.
bool is_byte_dtype(nb::dlpack::dtype dt) {
  return dt.lanes == 1 && dt.bits == 8 &&
         (dt.code == kDLInt || dt.code == kDLUInt ||
          (dt.code >= kDLFloat8First && dt.code <= kDLFloat8Last));
}

// Shape and strides of `array` with size-1 dims given their contiguous stride, and every dim
// of an empty array too (numpy 2 gives an empty array all-zero strides, which would fail the
// contiguity checks of a batch of 0 requests; nothing of it is ever read).
void fill_shape(const Array& array, TensorView* view, const char* op, const char* arg) {
  const int rank = static_cast<int>(array.ndim());
  if (rank > kMaxTensorRank) {
    throw_value_error(where(op, arg) + "expected at most " + std::to_string(kMaxTensorRank) +
                      " dimensions, got " + std::to_string(rank));
  }
  view->rank = rank;
  bool empty = false;
  for (int d = 0; d < rank; ++d) empty = empty || array.shape_ptr()[d] == 0;
  int64_t contiguous_stride = 1;
  for (int d = rank - 1; d >= 0; --d) {
    const int64_t size = array.shape_ptr()[d];
    const int64_t stride = array.stride_ptr()[d];
    if (stride < 0) {
      throw_value_error(where(op, arg) + "negative strides are not supported (dim " +
                        std::to_string(d) + " has stride " + std::to_string(stride) + ")");
    }
    view->shape[d] = size;
    view->strides[d] = size == 1 || empty ? contiguous_stride : stride;
    contiguous_stride = (size == 0 ? 1 : size) * view->strides[d];
  }
}

}  // namespace

void throw_type_error(const std::string& message) { throw nb::type_error(message.c_str()); }
void throw_value_error(const std::string& message) { throw nb::value_error(message.c_str()); }

void throw_if_error(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOk:
      return;
    case StatusCode::kInvalidArgument:
      throw nb::value_error(status.message().c_str());
    case StatusCode::kNotImplemented:
      PyErr_SetString(PyExc_NotImplementedError, status.message().c_str());
      throw nb::python_error();
    case StatusCode::kUnsupportedDevice:
    case StatusCode::kCudaError:
    case StatusCode::kInternal:
      break;
  }
  const std::string message =
      std::string(status_code_name(status.code())) + ": " + status.message();
  PyErr_SetString(PyExc_RuntimeError, message.c_str());
  throw nb::python_error();
}

Device array_device(const Array& array, const char* op, const char* arg) {
  switch (array.device_type()) {
    case kDLCPU:
    case kDLCUDAHost:
      return Device::cpu();
    case kDLCUDA:
    case kDLCUDAManaged:
      return Device::cuda(array.device_id());
    default:
      throw_value_error(where(op, arg) + "unsupported device (DLPack device type " +
                        std::to_string(array.device_type()) + "); expected a CPU or CUDA array");
  }
}

TensorView to_view(const Array& array, const char* op, const char* arg) {
  const std::optional<DType> dtype = to_dtype(array.dtype());
  if (!dtype) {
    throw_type_error(where(op, arg) + "unsupported dtype " + dlpack_dtype_name(array.dtype()) +
                     " (expected bf16, fp16, fp32, int32, int64 or uint8)");
  }
  TensorView view;
  view.dtype = *dtype;
  view.device = array_device(array, op, arg);
  fill_shape(array, &view, op, arg);
  view.data = const_cast<void*>(static_cast<const void*>(array.data()));
  return view;
}

TensorView to_optional_view(const std::optional<Array>& array, const char* op, const char* arg) {
  return array ? to_view(*array, op, arg) : TensorView{};
}

Workspace to_workspace(const std::optional<Array>& workspace, const char* op) {
  Workspace w;
  if (!workspace) return w;
  const TensorView view = to_view(*workspace, op, "workspace");
  if (view.rank != 1 || view.dtype != DType::kUInt8 ||
      (view.shape[0] > 1 && view.strides[0] != 1)) {
    throw_value_error(std::string(op) + ": workspace: expected a contiguous 1-D uint8 array");
  }
  w.data = view.data;
  w.bytes = static_cast<size_t>(view.shape[0]);
  return w;
}

KVFormat parse_format(const std::string& name, const char* op, const char* arg) {
  const std::optional<KVFormat> format = kv_format_from_name(name);
  if (!format) {
    throw_value_error(where(op, arg) + "unknown KV format '" + name +
                      "' (expected bf16, fp16, fp8_v32, fp8_model1, fp8_mx or fp4)");
  }
  return *format;
}

KVLayoutKind parse_layout(const std::string& layout_name, const char* op, const char* arg) {
  if (layout_name == "default") return KVLayoutKind::kDefault;
  if (layout_name == "interleaved") return KVLayoutKind::kInterleaved;
  throw_value_error(where(op, arg) + "unknown KV layout '" + layout_name +
                    "' (expected 'default' or 'interleaved')");
}

KVLayout make_layout(KVFormat format, int page_size, int d_qk, const std::string& layout_name,
                     const char* op, const char* arg) {
  return parse_layout(layout_name, op, arg) == KVLayoutKind::kInterleaved
             ? interleaved_kv_layout(format, page_size, d_qk)
             : default_kv_layout(format, page_size, d_qk);
}

// The array's element type here (DLPack); its format, layout and every check: infer_kv_cache.
KVCache to_kv_cache(const Array& array, const std::optional<std::string>& format_name,
                    const std::string& layout_name, const char* op, const char* arg) {
  const nb::dlpack::dtype dt = array.dtype();
  const std::optional<DType> dtype = to_dtype(dt);
  const bool plain = dtype && (*dtype == DType::kBF16 || *dtype == DType::kFP16);
  if (!is_byte_dtype(dt) && !plain) {
    throw_type_error(where(op, arg) + "unsupported dtype " + dlpack_dtype_name(dt) +
                     " for a KV cache (expected uint8/int8/float8 bytes, bf16 or fp16)");
  }
  CacheArray cache_array;
  cache_array.data = const_cast<void*>(static_cast<const void*>(array.data()));
  cache_array.element = !plain                     ? CacheArrayElement::kBytes
                        : *dtype == DType::kBF16 ? CacheArrayElement::kBF16
                                                 : CacheArrayElement::kFP16;
  cache_array.rank = static_cast<int>(array.ndim());
  cache_array.shape = array.shape_ptr();
  cache_array.strides = array.stride_ptr();
  std::optional<KVFormat> format;
  if (format_name) format = parse_format(*format_name, op, arg);
  const KVLayoutKind layout = parse_layout(layout_name, op, arg);
  cache_array.device = array_device(array, op, arg);
  KVCache cache;
  throw_if_error(infer_kv_cache(cache_array, format, layout, op, arg, &cache));
  return cache;
}

Device parse_device(const std::string& type, int index, const char* op) {
  if (type == "cpu") return Device::cpu();
  if (type == "cuda") return Device::cuda(index);
  throw_value_error(std::string(op) + ": device: expected 'cpu' or 'cuda', got '" + type + "'");
}

}  // namespace openmla::python
