// Translation between Python arrays and the C++ API: any DLPack array (numpy, torch CPU/CUDA,
// cupy, jax, ...) becomes an openmla::TensorView or KVCache, and a failed openmla::Status becomes
// the Python exception of its kind. The views borrow the arrays' memory; the arrays stay alive
// for the whole call because the caller holds them.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <optional>
#include <string>

#include "openmla/kv_format.h"
#include "openmla/ops.h"
#include "openmla/status.h"
#include "openmla/tensor.h"

namespace openmla::python {

namespace nb = nanobind;

// Read-only so that read-only numpy arrays are accepted too; the pointer is cast back to mutable
// for outputs, which the Python layer allocates (or checks) as writable.
using Array = nb::ndarray<nb::ro>;

// Raises the Python exception of `status`'s kind, message kept:
//   InvalidArgument → ValueError, NotImplemented → NotImplementedError,
//   UnsupportedDevice / CudaError / Internal → RuntimeError.
void throw_if_error(const Status& status);

[[noreturn]] void throw_type_error(const std::string& message);
[[noreturn]] void throw_value_error(const std::string& message);

// The device of a DLPack array (CPU, pinned host memory → CPU; CUDA → CUDA ordinal).
Device array_device(const Array& array, const char* op, const char* arg);

// A view of `array`: dtype (bf16, fp16, fp32, int32, int64, uint8), shape and strides in elements,
// device. Raises TypeError on another dtype, ValueError on a rank above kMaxTensorRank, a
// negative stride or an unsupported device. Strides of size-1 dims are normalised (they never
// address memory).
TensorView to_view(const Array& array, const char* op, const char* arg);
TensorView to_optional_view(const std::optional<Array>& array, const char* op, const char* arg);

// A call's workspace: none when `workspace` is None, else a contiguous 1-D uint8 array (its
// bytes); ValueError naming `op` otherwise.
Workspace to_workspace(const std::optional<Array>& workspace, const char* op);

// A paged KV cache from one array:
//   bytes (any 8-bit dtype: uint8, int8, float8) [num_blocks, page_size, 1, bytes_per_token] or
//   [num_blocks, page_size, bytes_per_token]: the format is `format_name` or, when empty,
//   inferred from bytes_per_token (656, 584, 528, 288);
//   bf16/fp16 [num_blocks, page_size, 1, d_qk] or [num_blocks, page_size, d_qk]: a plain cache.
// `layout_name` is "default" or "interleaved" (docs/formats.md). The block stride is the array's
// stride of dim 0; a token's bytes must be contiguous (dims 1.. packed).
KVCache to_kv_cache(const Array& array, const std::optional<std::string>& format_name,
                    const std::string& layout_name, const char* op, const char* arg);

KVFormat parse_format(const std::string& name, const char* op, const char* arg);
KVLayout make_layout(KVFormat format, int page_size, int d_qk, const std::string& layout_name,
                     const char* op, const char* arg);

Device parse_device(const std::string& type, int index, const char* op);

inline Stream to_stream(uintptr_t stream) { return reinterpret_cast<Stream>(stream); }

}  // namespace openmla::python
