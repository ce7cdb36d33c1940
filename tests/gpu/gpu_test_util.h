// GPU test harness: device buffers that free themselves, device mirrors of tests/common's host
// tensors (same shape and strides, gaps included, so a test can prove nothing was written
// outside a view), poison fills, and the check that a Hopper GPU is present.
//
// The GPU tier runs only on the device (tools/device_check.sh), so a machine without a Hopper GPU
// is a failure, not a skip: the binary stops with a message before any test runs.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/test_data.h"
#include "openmla/tensor.h"

namespace openmla::testing {

// Throws on a CUDA error; gtest reports a thrown exception as the test's failure.
inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(err) + " (" +
                             cudaGetErrorString(err) + ")");
  }
}

// Device memory of one allocation, freed on destruction; move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    // Even an empty tensor gets a real (16-byte aligned) pointer, so views are never null.
    check_cuda(cudaMalloc(&data_, bytes > 0 ? bytes : 16), "cudaMalloc");
  }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { release(); }

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

  // Every byte set to `byte`: 0xFF is NaN in fp32, bf16 and fp16, and -1 in integers.
  void fill_bytes(uint8_t byte) { check_cuda(cudaMemset(data_, byte, bytes_), "cudaMemset"); }
  void poison() { fill_bytes(0xFF); }

  void copy_from_host(const void* src, size_t bytes) {
    check_cuda(cudaMemcpy(data_, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  void copy_to_host(void* dst, size_t bytes) const {
    check_cuda(cudaMemcpy(dst, data_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  }

 private:
  void release() {
    if (data_ != nullptr) (void)cudaFree(data_);
    data_ = nullptr;
  }
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

template <typename T>
DeviceBuffer to_device(const std::vector<T>& host) {
  DeviceBuffer buffer(host.size() * sizeof(T));
  if (!host.empty()) buffer.copy_from_host(host.data(), host.size() * sizeof(T));
  return buffer;
}

template <typename T>
std::vector<T> to_host(const DeviceBuffer& buffer, size_t count) {
  std::vector<T> host(count);
  if (count > 0) buffer.copy_to_host(host.data(), count * sizeof(T));
  return host;
}

inline size_t storage_bytes(const HostTensor& host) {
  return static_cast<size_t>(host.storage_elements()) * dtype_size_bytes(host.dtype());
}

// A device tensor with a host tensor's shape and strides over its own storage.
struct DeviceTensor {
  DeviceBuffer buffer;
  TensorView view;
};

// Same shape and strides as `host`, its whole storage (gaps included) copied over.
inline DeviceTensor to_device(const HostTensor& host, int device_index = 0) {
  DeviceTensor t{DeviceBuffer(storage_bytes(host)), host.view()};
  t.buffer.copy_from_host(host.view().data, storage_bytes(host));
  t.view.data = t.buffer.data();
  t.view.device = Device::cuda(device_index);
  return t;
}

// Same shape and strides as `host`, every storage byte 0xFF (NaN for floats): an output buffer
// in which anything the kernel forgot to write, or wrote outside the view, shows.
inline DeviceTensor poisoned_like(const HostTensor& host, int device_index = 0) {
  DeviceTensor t{DeviceBuffer(storage_bytes(host)), host.view()};
  t.buffer.poison();
  t.view.data = t.buffer.data();
  t.view.device = Device::cuda(device_index);
  return t;
}

// Copies a device tensor's whole storage back into `host` (created with the same shape/strides).
inline void copy_to_host(const DeviceTensor& device, HostTensor* host) {
  device.buffer.copy_to_host(host->view().data, storage_bytes(*host));
}

// An empty host tensor with t's dtype, shape and strides (to copy a device result into).
inline HostTensor same_layout(const HostTensor& t) {
  const TensorView& v = t.view();
  return HostTensor(v.dtype, std::vector<int64_t>(v.shape, v.shape + v.rank),
                    std::vector<int64_t>(v.strides, v.strides + v.rank));
}

inline void synchronize() { check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

// --- the Hopper check --------------------------------------------------------------------------
// Empty when device 0 is a Hopper GPU (compute capability 9.0), else why not.
inline std::string hopper_problem() {
  int count = 0;
  if (cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    return std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(err);
  }
  if (count == 0) return "no CUDA device is visible";
  cudaDeviceProp prop{};
  if (cudaError_t err = cudaGetDeviceProperties(&prop, 0); err != cudaSuccess) {
    return std::string("cudaGetDeviceProperties failed: ") + cudaGetErrorString(err);
  }
  if (prop.major != 9 || prop.minor != 0) {
    return std::string("device 0 is ") + prop.name + " (sm_" + std::to_string(prop.major) +
           std::to_string(prop.minor) + "), not a Hopper sm_90 GPU";
  }
  return "";
}

class HopperEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const std::string problem = hopper_problem();
    if (!problem.empty()) {
      std::fprintf(stderr,
                   "\nFATAL: openmla_gpu_tests needs a Hopper (sm_90) GPU: %s.\n"
                   "These tests run only on the device (tools/device_check.sh); they do not "
                   "skip.\n",
                   problem.c_str());
      std::fflush(stderr);
      std::exit(1);
    }
    cudaDeviceProp prop{};
    check_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    std::printf("openmla_gpu_tests on %s: %d SMs, %.1f GiB\n", prop.name, prop.multiProcessorCount,
                prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
  }
};

// Registered once per binary (an inline variable is one object across translation units).
inline ::testing::Environment* const kHopperEnvironment =
    ::testing::AddGlobalTestEnvironment(new HopperEnvironment);

}  // namespace openmla::testing
