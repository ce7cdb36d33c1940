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

KVFormat parse_format(const std::string& name, const char* op, const char* arg) {
  const std::optional<KVFormat> format = kv_format_from_name(name);
  if (!format) {
    throw_value_error(where(op, arg) + "unknown KV format '" + name +
                      "' (expected bf16, fp16, fp8_v32, fp8_model1, fp8_mx or fp4)");
  }
  return *format;
}

KVLayout make_layout(KVFormat format, int page_size, int d_qk, const std::string& layout_name,
                     const char* op, const char* arg) {
  if (layout_name == "default") return default_kv_layout(format, page_size, d_qk);
  if (layout_name == "interleaved") return interleaved_kv_layout(format, page_size, d_qk);
  throw_value_error(where(op, arg) + "unknown KV layout '" + layout_name +
                    "' (expected 'default' or 'interleaved')");
}

KVCache to_kv_cache(const Array& array, const std::optional<std::string>& format_name,
                    const std::string& layout_name, const char* op, const char* arg) {
  const nb::dlpack::dtype dt = array.dtype();
  const bool bytes = is_byte_dtype(dt);
  const std::optional<DType> dtype = to_dtype(dt);
  const bool plain = dtype && (*dtype == DType::kBF16 || *dtype == DType::kFP16);
  if (!bytes && !plain) {
    throw_type_error(where(op, arg) + "unsupported dtype " + dlpack_dtype_name(dt) +
                     " for a KV cache (expected uint8/int8/float8 bytes, bf16 or fp16)");
  }
  const int rank = static_cast<int>(array.ndim());
  const int64_t* shape = array.shape_ptr();
  if (rank != 3 && rank != 4) {
    throw_value_error(where(op, arg) +
                      "expected shape [num_blocks, page_size, 1, bytes_per_token] (or "
                      "[num_blocks, page_size, bytes_per_token]), got " +
                      std::to_string(rank) + " dimensions");
  }
  if (rank == 4 && shape[2] != 1) {
    throw_value_error(where(op, arg) + "expected one kv head (size 1 in dim 2), got " +
                      std::to_string(shape[2]));
  }
  const int64_t num_blocks = shape[0], page_size = shape[1], last = shape[rank - 1];
  if (page_size < 1) throw_value_error(where(op, arg) + "expected page_size (dim 1) >= 1, got 0");
  // An empty cache (no blocks) gets the strides of a packed one: numpy 2 reports all zeros.
  int64_t strides[4];
  for (int d = rank - 1; d >= 0; --d) {
    const int64_t packed = d == rank - 1 ? 1 : strides[d + 1] * shape[d + 1];
    strides[d] = num_blocks > 0 ? array.stride_ptr()[d] : packed;
  }
  for (int d = 0; d < rank; ++d) {
    if (strides[d] < 0) throw_value_error(where(op, arg) + "negative strides are not supported");
  }
  const int64_t itemsize = static_cast<int64_t>(array.itemsize());
  if (last > 1 && strides[rank - 1] != 1) {
    throw_value_error(where(op, arg) +
                      "the last dimension must be contiguous (stride 1), got "
                      "stride " +
                      std::to_string(strides[rank - 1]));
  }

  KVFormat format;
  int d_qk = 576;
  if (plain) {
    format = *dtype == DType::kBF16 ? KVFormat::kBF16 : KVFormat::kFP16;
    d_qk = static_cast<int>(last);
    if (format_name && parse_format(*format_name, op, arg) != format) {
      throw_value_error(where(op, arg) + "format '" + *format_name + "' given for a " +
                        dtype_name(*dtype) + " array (" + dtype_name(*dtype) +
                        " arrays hold the plain " + kv_format_name(format) + " format)");
    }
  } else if (format_name) {
    format = parse_format(*format_name, op, arg);
    if (format == KVFormat::kBF16 || format == KVFormat::kFP16) d_qk = static_cast<int>(last / 2);
    const int64_t expected = kv_format_info(format, d_qk).bytes_per_token;
    if (last != expected) {
      throw_value_error(where(op, arg) + "format " + kv_format_name(format) + " has " +
                        std::to_string(expected) + " bytes per token, but the last dimension is " +
                        std::to_string(last));
    }
  } else {
    const std::optional<KVFormat> inferred = kv_format_from_bytes_per_token(last);
    if (!inferred) {
      throw_value_error(where(op, arg) + "cannot infer the KV format from " + std::to_string(last) +
                        " bytes per token (known: 656 fp8_v32, 584 fp8_model1, 528 fp8_mx, "
                        "288 fp4; pass a bf16/fp16 array for a plain cache, or name the format)");
    }
    format = *inferred;
  }
  if (page_size > (int64_t{1} << 30)) throw_value_error(where(op, arg) + "page_size too large");

  KVLayout layout = make_layout(format, static_cast<int>(page_size), d_qk, layout_name, op, arg);
  const int64_t token_bytes = last * itemsize;  // the bytes one token row holds in the array
  const int64_t token_stride_bytes = (page_size > 1 ? strides[1] : last) * itemsize;
  const bool plain_format = format == KVFormat::kBF16 || format == KVFormat::kFP16;
  if (plain_format) {
    // A plain cache may be a strided view: honour its token stride.
    layout.data_stride = token_stride_bytes;
    layout.block_stride = page_size * token_stride_bytes;
  } else if (token_stride_bytes != token_bytes) {
    throw_value_error(where(op, arg) +
                      "a quantised cache's tokens must be packed inside a block "
                      "(stride of dim 1 = " +
                      std::to_string(last) + "), got stride " + std::to_string(strides[1]));
  }
  const int64_t footprint = kv_block_footprint_bytes(layout);
  const int64_t block_extent = (page_size - 1) * token_stride_bytes + token_bytes;
  if (footprint > block_extent) {
    throw_value_error(where(op, arg) + "the " + layout_name + " layout of " +
                      kv_format_name(format) + " needs " + std::to_string(footprint) +
                      " bytes per block, but a block of the array spans " +
                      std::to_string(block_extent));
  }
  if (num_blocks > 1) layout.block_stride = strides[0] * itemsize;

  KVCache cache;
  cache.data = const_cast<void*>(static_cast<const void*>(array.data()));
  cache.layout = layout;
  cache.num_blocks = num_blocks;
  cache.device = array_device(array, op, arg);
  return cache;
}

Device parse_device(const std::string& type, int index, const char* op) {
  if (type == "cpu") return Device::cpu();
  if (type == "cuda") return Device::cuda(index);
  throw_value_error(std::string(op) + ": device: expected 'cpu' or 'cuda', got '" + type + "'");
}

}  // namespace openmla::python
