// Per-device opt-in to large dynamic shared memory (smem_opt_in.h).
#include "cuda/common/smem_opt_in.h"

#include <mutex>
#include <vector>

namespace openmla::cuda {

cudaError_t allow_dynamic_smem(const void* kernel, size_t bytes) {
  constexpr size_t kDefaultLimit = 48 * 1024;
  if (bytes <= kDefaultLimit) return cudaSuccess;
  int device = 0;
  if (const cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  struct Granted {
    const void* kernel;
    int device;
    size_t bytes;
  };
  static std::mutex mutex;
  static std::vector<Granted> granted;  // a few kernels x devices
  const std::lock_guard<std::mutex> lock(mutex);
  Granted* entry = nullptr;
  for (Granted& g : granted) {
    if (g.kernel == kernel && g.device == device) entry = &g;
  }
  if (entry != nullptr && entry->bytes >= bytes) return cudaSuccess;
  const cudaError_t err = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (err != cudaSuccess) return err;
  if (entry != nullptr) {
    entry->bytes = bytes;
  } else {
    granted.push_back({kernel, device, bytes});
  }
  return cudaSuccess;
}

}  // namespace openmla::cuda
