// What each SM90 kernel family serves (src/cuda/sm90/attention/supported.h): the one list behind
// the CUDA backend's dispatch and its NotImplemented messages. Host code only, so it runs in CI
// wherever the CUDA backend is built.
#include <gtest/gtest.h>

#ifdef OPENMLA_WITH_CUDA
#include <string>

#include "cuda/sm90/attention/supported.h"

namespace openmla::cuda::sm90::attention {
namespace {

TEST(Sm90Supported, DenseDecodeKernels) {
  EXPECT_TRUE(supports("dense_decode", DType::kBF16, 576));
  EXPECT_TRUE(supports("dense_decode", DType::kBF16, 512));
  EXPECT_TRUE(supports("dense_decode", DType::kFP16, 576));
  EXPECT_TRUE(supports("dense_decode", DType::kFP16, 512));
  EXPECT_FALSE(supports("dense_decode", DType::kFP32, 576));
  EXPECT_FALSE(supports("dense_decode", DType::kBF16, 128));
  EXPECT_TRUE(supports("sparse_decode", DType::kBF16, 576));
  EXPECT_FALSE(supports("sparse_decode", DType::kFP16, 576));
  EXPECT_FALSE(supports("dense_prefill", DType::kBF16, 576));  // no row: no kernel
  EXPECT_TRUE(supports("mha_prefill", DType::kFP16, 128));
  EXPECT_FALSE(supports("mha_prefill", DType::kBF16, 256));
  EXPECT_TRUE(supports("merge_attention_states", DType::kFP32, 0));  // any shape validation takes
}

TEST(Sm90Supported, Messages) {
  const FamilySupport* dense = family_support("dense_decode");
  ASSERT_NE(dense, nullptr);
  EXPECT_EQ(describe(*dense), "dense_decode (bf16 d_qk 576/512, fp16 d_qk 576/512)");
  EXPECT_EQ(family_support("dense_prefill"), nullptr);
  EXPECT_EQ(supported_ops(),
            "dense_decode (bf16 d_qk 576/512, fp16 d_qk 576/512), sparse_decode (bf16 d_qk "
            "576/512), sparse_prefill (bf16 d_qk 576/512), mha_prefill (bf16 d_qk 192/128, fp16 "
            "d_qk 192/128), merge_attention_states, "
            "kv_cache_write, kv_cache_gather, kv_cache_convert, plan_decode_schedule");
}

}  // namespace
}  // namespace openmla::cuda::sm90::attention
#endif  // OPENMLA_WITH_CUDA
