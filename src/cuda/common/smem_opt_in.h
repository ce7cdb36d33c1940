// Dynamic shared memory above 48 KB is opt-in per kernel (cudaFuncSetAttribute), and the opt-in
// acts on the current device only: each device's context holds its own copy of a kernel. So a
// process that drives several GPUs (a thread each, or one after another) opts a kernel in on
// every device it launches on. (A once-per-process static opted in the first device only; a
// launch on the next one then failed as an invalid argument.)
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace openmla::cuda {

// Lets `kernel` launch with `bytes` of dynamic shared memory on the current device. Nothing to
// do at or below 48 KB; after the first call for a (kernel, device), a lookup under a mutex.
cudaError_t allow_dynamic_smem(const void* kernel, size_t bytes);

template <typename Kernel>
cudaError_t allow_dynamic_smem(Kernel* kernel, size_t bytes) {
  return allow_dynamic_smem(reinterpret_cast<const void*>(kernel), bytes);
}

}  // namespace openmla::cuda
