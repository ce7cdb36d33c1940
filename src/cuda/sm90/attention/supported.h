// What each SM90 kernel family serves: the one list the backend's dispatch (backend.cc), its
// "not implemented" messages and the family's own launch switch (dense_decode/launch.cu) read.
// A new family adds its kernels' macro and one kSupported row; core validation still decides
// what is valid input, this list what has a kernel.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "openmla/tensor.h"

namespace openmla::cuda::sm90::attention {

// Dense decode: one kernel a (q / k_cache dtype, d_qk), each in its own
// dense_decode/instantiations/dense_decode_<dtype>_d<d_qk>_sm90.cu (configuring fails when that
// folder and this list differ: cmake/cuda_kernels.cmake).
// X(DType enumerator, CuTe element type, d_qk)
#define OPENMLA_SM90_DENSE_DECODE_KERNELS(X) \
  X(kBF16, cute::bfloat16_t, 576)            \
  X(kBF16, cute::bfloat16_t, 512)            \
  X(kFP16, cute::half_t, 576)                \
  X(kFP16, cute::half_t, 512)

struct KernelShape {
  DType dtype;
  int d_qk;
};

inline constexpr KernelShape kDenseDecodeKernels[] = {
#define OPENMLA_KERNEL_SHAPE(dtype, element, d_qk) {DType::dtype, d_qk},
    OPENMLA_SM90_DENSE_DECODE_KERNELS(OPENMLA_KERNEL_SHAPE)
#undef OPENMLA_KERNEL_SHAPE
};

// Sparse decode and sparse prefill (one kernel family, sparse_decode/instantiations): bf16 q,
// d_qk 576 (fp8_v32 and bf16 caches) and 512 (fp8_model1, fp8_mx, fp4 and bf16 caches).
inline constexpr KernelShape kSparseKernels[] = {{DType::kBF16, 576}, {DType::kBF16, 512}};

// Dense MHA prefill forward (mha_prefill/instantiations): bf16 and fp16, d_qk 192 and 128
// (d_v 128).
inline constexpr KernelShape kMhaPrefillKernels[] = {
    {DType::kBF16, 192}, {DType::kBF16, 128}, {DType::kFP16, 192}, {DType::kFP16, 128}};

struct FamilySupport {
  const char* op;
  const KernelShape* kernels;  // null: one kernel for whatever core validation accepts
  size_t num_kernels;
};

// Every operation the CUDA backend runs on SM90, in the order its messages list them.
inline constexpr FamilySupport kSupported[] = {
    {"dense_decode", kDenseDecodeKernels, std::size(kDenseDecodeKernels)},
    {"sparse_decode", kSparseKernels, std::size(kSparseKernels)},
    {"sparse_prefill", kSparseKernels, std::size(kSparseKernels)},
    {"mha_prefill", kMhaPrefillKernels, std::size(kMhaPrefillKernels)},
    {"merge_attention_states", nullptr, 0},
    {"kv_cache_write", nullptr, 0},
    {"kv_cache_gather", nullptr, 0},
    {"kv_cache_convert", nullptr, 0},
    {"plan_decode_schedule", nullptr, 0},
};

// The row of `op`, or null where the backend has no kernel for it.
const FamilySupport* family_support(std::string_view op);

// Whether `op` has a kernel for (dtype, d_qk); false for an op with no row.
bool supports(std::string_view op, DType dtype, int d_qk);

// "dense_decode (bf16 d_qk 576/512, fp16 d_qk 576/512)"; the bare name for an op without kernels
// per shape.
std::string describe(const FamilySupport& family);

// Every row described, comma-separated: what a NotImplemented message quotes.
std::string supported_ops();

}  // namespace openmla::cuda::sm90::attention
