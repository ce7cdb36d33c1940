// Non-owning tensor views: the only way data crosses the public API.
// Strides are in elements (not bytes), like torch and DLPack; any stride is allowed unless an
// operation's documentation asks for a contiguous last dimension.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace openmla {

enum class DType : int32_t { kBF16, kFP16, kFP32, kInt32, kInt64, kUInt8 };

enum class DeviceType : int32_t { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;  // CUDA ordinal; ignored for the CPU
  static Device cpu() { return {DeviceType::kCPU, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::kCUDA, index}; }
  bool operator==(const Device& o) const {
    return type == o.type && (type == DeviceType::kCPU || index == o.index);
  }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

size_t dtype_size_bytes(DType dtype);
const char* dtype_name(DType dtype);
std::string device_name(Device device);

constexpr int kMaxTensorRank = 5;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kFP32;
  int rank = 0;
  int64_t shape[kMaxTensorRank] = {};
  int64_t strides[kMaxTensorRank] = {};  // in elements
  Device device;

  // A view with row-major (contiguous) strides.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               Device device = Device::cpu());
  // A view with explicit strides (in elements).
  static TensorView strided(void* data, DType dtype, std::initializer_list<int64_t> shape,
                            std::initializer_list<int64_t> strides, Device device = Device::cpu());

  // Optional arguments are passed as an empty view (data == nullptr, rank == 0).
  bool defined() const { return data != nullptr || rank > 0; }
  int64_t numel() const;
  int64_t size(int dim) const { return shape[dim]; }
  int64_t stride(int dim) const { return strides[dim]; }
  bool is_contiguous() const;
  std::string shape_string() const;  // "[4, 1, 128, 576]"

  template <typename T>
  T* data_as() const { return static_cast<T*>(data); }
};

}  // namespace openmla
