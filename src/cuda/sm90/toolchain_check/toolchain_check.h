// A tiny Hopper GEMM that proves the toolchain can build what the kernel families need: a CuTe
// TMA load (SM90_TMA_LOAD completing on an mbarrier with a transaction count) feeding a wgmma
// atom (SM90_64x64x16_F32BF16BF16_SS) from 128 B-swizzled shared memory. tests/gpu checks it
// numerically on the device; CI only compiles it for sm_90a.
#pragma once

#include "openmla/ops.h"
#include "openmla/status.h"

namespace openmla::cuda {

constexpr int kToolchainCheckM = 64;
constexpr int kToolchainCheckN = 64;
constexpr int kToolchainCheckK = 64;

// c[m][n] = sum_k a[m][k] * b[n][k] ("TN": both operands K-major), one CTA, one warpgroup.
// a: [64, 64] bf16 row-major, b: [64, 64] bf16 row-major, c: [64, 64] fp32 row-major; all device
// pointers, 16-byte aligned. Launches on `stream`; returns CudaError if a CUDA call fails.
Status toolchain_check_gemm(const void* a, const void* b, float* c, Stream stream);

}  // namespace openmla::cuda
