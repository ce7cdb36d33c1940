// What the CUDA backend does with requests it has no kernel for: NotImplemented naming the
// operation, what was asked and what exists (never a silent CPU fallback, never fake output);
// and what the public API does with CPU tensors mixed into a CUDA call: InvalidArgument naming
// the argument. When a kernel family lands, its operation's NotImplemented case here goes and
// its numerical test joins tests/gpu.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cuda/common/sm_parts.h"
#include "gpu/gpu_test_util.h"
#include "openmla/kv_format.h"
#include "openmla/ops.h"

namespace openmla::testing {
namespace {

const Device kGpu = Device::cuda(0);

// A zero-filled device tensor of `shape`, contiguous.
struct Gpu {
  DeviceBuffer buffer;
  TensorView view;
  Gpu(DType dtype, std::initializer_list<int64_t> shape) {
    TensorView shaped = TensorView::contiguous(nullptr, dtype, shape, kGpu);
    buffer = DeviceBuffer(shaped.numel() * dtype_size_bytes(dtype));
    buffer.fill_bytes(0);
    view = shaped;
    view.data = buffer.data();
  }
};

// A zero-filled device KV cache of `format` (page 64), `num_blocks` blocks.
struct GpuCache {
  DeviceBuffer buffer;
  KVCache cache;
  GpuCache(KVFormat format, int d_qk, int64_t num_blocks) {
    cache.layout = default_kv_layout(format, /*page_size=*/64, d_qk);
    buffer = DeviceBuffer(num_blocks * cache.layout.block_stride);
    buffer.fill_bytes(0);
    cache.data = buffer.data();
    cache.num_blocks = num_blocks;
    cache.device = kGpu;
  }
};

// A CPU view with the same dtype/shape as `t` over host memory (for the mixed-device cases).
struct Cpu {
  std::vector<uint8_t> bytes;
  TensorView view;
  explicit Cpu(const TensorView& like) : bytes(like.numel() * dtype_size_bytes(like.dtype)) {
    view = like;
    view.data = bytes.data();
    view.device = Device::cpu();
  }
};

void expect_contains(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos) << "\"" << part << "\" not in: " << message;
}

void expect_invalid_argument(const Status& st, const std::string& arg) {
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument)
      << status_code_name(st.code()) << ": " << st.message();
  expect_contains(st.message(), arg + ":");
  expect_contains(st.message(), "cpu");
}

// --- dense decode (kernel: src/cuda/sm90/dense_decode; tested in test_dense_decode.cu) ----------
struct DenseDecodeTensors {
  Gpu q{DType::kBF16, {2, 1, 128, 576}};
  Gpu k_cache{DType::kBF16, {4, 64, 1, 576}};
  Gpu block_table{DType::kInt32, {2, 2}};
  Gpu seqlens{DType::kInt32, {2}};
  Gpu out{DType::kBF16, {2, 1, 128, 512}};
  Gpu lse{DType::kFP32, {2, 128, 1}};
  DenseDecodeArgs args() const {
    DenseDecodeArgs a;
    a.q = q.view, a.k_cache = k_cache.view, a.block_table = block_table.view;
    a.cache_seqlens = seqlens.view, a.out = out.view, a.lse = lse.view;
    return a;
  }
};

TEST(CudaBackendMixedDevices, DenseDecodeBlockTableOnCpu) {
  DenseDecodeTensors t;
  Cpu block_table(t.block_table.view);
  DenseDecodeArgs a = t.args();
  a.block_table = block_table.view;
  expect_invalid_argument(dense_decode(a), "block_table");
}

// Dense decode over a KVCache runs on the GPU with bf16 q (bf16, fp8 and fp4 caches); an fp16
// cache has no kernel there, and the message names q.
TEST(CudaBackendNotImplemented, DenseDecodeOverFp16KVCache) {
  Gpu q{DType::kFP16, {2, 1, 16, 576}};
  GpuCache cache{KVFormat::kFP16, 576, 4};
  Gpu table{DType::kInt32, {2, 2}}, lens{DType::kInt32, {2}};
  Gpu out{DType::kFP16, {2, 1, 16, 512}}, lse{DType::kFP32, {2, 16, 1}};
  DenseDecodeArgs a;
  a.q = q.view, a.kv_cache = cache.cache, a.block_table = table.view, a.cache_seqlens = lens.view;
  a.out = out.view, a.lse = lse.view;
  const Status st = dense_decode(a);
  EXPECT_EQ(st.code(), StatusCode::kNotImplemented) << st.message();
  expect_contains(st.message(), "q");
}

// --- sparse decode ---------------------------------------------------------------------------
struct SparseDecodeTensors {
  Gpu q{DType::kBF16, {2, 1, 64, 576}};
  GpuCache cache{KVFormat::kFP8_V32, 576, 4};
  Gpu indices{DType::kInt32, {2, 1, 128}};
  Gpu out{DType::kBF16, {2, 1, 64, 512}};
  Gpu lse{DType::kFP32, {2, 64, 1}};
  SparseDecodeArgs args() const {
    SparseDecodeArgs a;
    a.q = q.view, a.k_cache = cache.cache, a.indices = indices.view;
    a.out = out.view, a.lse = lse.view;
    return a;
  }
};

// The sparse kernel reads bf16 q against bf16 and quantised caches; an fp16 cache (which the CPU
// backend takes) is named as unsupported, and d_v other than 512 too.
TEST(CudaBackendNotImplemented, SparseDecodeFp16Cache) {
  Gpu q{DType::kBF16, {2, 1, 64, 576}};
  GpuCache cache{KVFormat::kFP16, 576, 2};
  Gpu indices{DType::kInt32, {2, 1, 64}};
  Gpu out{DType::kBF16, {2, 1, 64, 512}}, lse{DType::kFP32, {2, 64, 1}};
  SparseDecodeArgs a;
  a.q = q.view, a.k_cache = cache.cache, a.indices = indices.view;
  a.out = out.view, a.lse = lse.view;
  const Status st = sparse_decode(a);
  EXPECT_EQ(st.code(), StatusCode::kNotImplemented) << st.message();
  expect_contains(st.message(), "k_cache");
  expect_contains(st.message(), "fp16");
}

TEST(CudaBackendMixedDevices, SparseDecodeCacheOnCpu) {
  SparseDecodeTensors t;
  SparseDecodeArgs a = t.args();
  std::vector<uint8_t> host(4 * t.cache.cache.layout.block_stride);
  a.k_cache.data = host.data();
  a.k_cache.device = Device::cpu();
  expect_invalid_argument(sparse_decode(a), "k_cache");
}

// --- sparse prefill --------------------------------------------------------------------------
struct SparsePrefillTensors {
  Gpu q{DType::kBF16, {8, 64, 576}};
  Gpu kv{DType::kBF16, {256, 1, 576}};
  Gpu indices{DType::kInt32, {8, 1, 128}};
  Gpu out{DType::kBF16, {8, 64, 512}};
  Gpu max_logits{DType::kFP32, {8, 64}};
  Gpu lse{DType::kFP32, {8, 64}};
  SparsePrefillArgs args() const {
    SparsePrefillArgs a;
    a.q = q.view, a.kv = kv.view, a.indices = indices.view;
    a.out = out.view, a.max_logits = max_logits.view, a.lse = lse.view;
    return a;
  }
};

// kv rows that overlap (a token stride below d_qk, valid for the CPU backend) are named as
// unsupported by the GPU kernel, which reads whole rows apart.
TEST(CudaBackendNotImplemented, SparsePrefillOverlappingKvRows) {
  SparsePrefillTensors t;
  SparsePrefillArgs a = t.args();
  a.kv.shape[0] = 16;
  a.kv.strides[0] = 64;
  const Status st = sparse_prefill(a);
  EXPECT_EQ(st.code(), StatusCode::kNotImplemented) << st.message();
  expect_contains(st.message(), "kv");
}

TEST(CudaBackendMixedDevices, SparsePrefillIndicesOnCpu) {
  SparsePrefillTensors t;
  Cpu indices(t.indices.view);
  SparsePrefillArgs a = t.args();
  a.indices = indices.view;
  expect_invalid_argument(sparse_prefill(a), "indices");
}

// --- KV-cache write (kernels in src/cuda/common/kv_cache_kernels.cu; tested by their owners) ----
TEST(CudaBackendMixedDevices, KVCacheWriteSlotMappingOnCpu) {
  GpuCache cache(KVFormat::kFP8_V32, 576, 2);
  Gpu kv(DType::kBF16, {4, 576});
  Gpu slots(DType::kInt32, {4});
  Cpu host_slots(slots.view);
  KVCacheWriteArgs a;
  a.kv = kv.view, a.slot_mapping = host_slots.view, a.cache = cache.cache;
  expect_invalid_argument(kv_cache_write(a), "slot_mapping");
}

// --- device facts and the backend's own device checks --------------------------------------------
TEST(CudaBackendDevice, ArchAndSmParts) {
  int arch = 0;
  ASSERT_TRUE(cuda_device_arch(0, &arch).ok());
  EXPECT_EQ(arch, 90);
  int num_sms = 0;
  check_cuda(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0), "attribute");
  int parts = 0;
  ASSERT_TRUE(decode_num_sm_parts(kGpu, 1, 128, 1, &parts).ok());
  EXPECT_EQ(parts, cuda::decode_sm_parts_for(num_sms, 1, 128, 1));
  EXPECT_EQ(parts, num_sms / 2);  // 128 heads = two 64-row tiles per part
  ASSERT_TRUE(decode_num_sm_parts(kGpu, 1, 16, 1, &parts).ok());
  EXPECT_EQ(parts, num_sms);
}

TEST(CudaBackendDevice, NoSuchDeviceIsInvalidArgument) {
  int count = 0;
  check_cuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  Gpu part_out(DType::kFP32, {1, 1, 1, 8}), part_lse(DType::kFP32, {1, 1, 1}),
      out(DType::kFP32, {1, 1, 8});
  MergeStatesArgs a;
  a.part_out = part_out.view, a.part_lse = part_lse.view, a.out = out.view;
  a.part_out.device = a.part_lse.device = a.out.device = Device::cuda(count);
  const Status st = merge_attention_states(a);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
  expect_contains(st.message(), "cuda:" + std::to_string(count));
}

TEST(CudaBackendMixedDevices, MergeLseOnCpu) {
  Gpu part_out(DType::kFP32, {2, 1, 1, 8}), part_lse(DType::kFP32, {2, 1, 1}),
      out(DType::kFP32, {1, 1, 8});
  Cpu host_lse(part_lse.view);
  MergeStatesArgs a;
  a.part_out = part_out.view, a.part_lse = host_lse.view, a.out = out.view;
  expect_invalid_argument(merge_attention_states(a), "part_lse");
}

}  // namespace
}  // namespace openmla::testing
