// A decode step the way a C++ serving engine drives OpenMLA, with no PyTorch: each step appends
// every request's new token to every layer's paged cache (kv_cache_write), plans the split-KV
// schedule once from the new lengths (plan_decode_schedule), then runs every layer's attention
// with that one schedule (dense_decode). On a GPU the step is captured into a CUDA graph once
// and replayed each step (only the lengths and slots change, copied in from pinned memory by
// the graph itself); on the CPU the same calls run directly.
//
//   openmla_decode_step [--device cpu|cuda] [--layers 4] [--batch 8] [--seqlen 2048]
//                       [--heads 128] [--steps 4]
#include <openmla/openmla.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#ifdef OPENMLA_EXAMPLE_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include "bf16.h"

namespace {

using namespace openmla;
using example::from_bf16;
using example::to_bf16;

constexpr int64_t kDimQK = 576, kDimV = 512, kPage = 64;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "decode_step: %s\n", what.c_str());
  std::exit(1);
}
void check(const Status& st) {
  if (!st.ok()) fail(st.message());
}
#ifdef OPENMLA_EXAMPLE_WITH_CUDA
void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) fail(std::string(what) + ": " + cudaGetErrorString(err));
}
#endif

// A buffer on the step's device (host memory for the CPU; device memory for CUDA), filled from
// the host once.
class Buffer {
 public:
  Buffer(Device device, size_t bytes) : device_(device), bytes_(bytes) {
#ifdef OPENMLA_EXAMPLE_WITH_CUDA
    if (device.type == DeviceType::kCUDA) {
      check(cudaMalloc(&data_, bytes ? bytes : 1), "cudaMalloc");
      return;
    }
#endif
    host_.resize(bytes);
    data_ = host_.data();
  }
  ~Buffer() {
#ifdef OPENMLA_EXAMPLE_WITH_CUDA
    if (device_.type == DeviceType::kCUDA) (void)cudaFree(data_);
#endif
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void upload(const void* src) { copy(data_, src, true); }
  void download(void* dst) const { copy(dst, data_, false); }
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  // The whole buffer between the host and this buffer's device.
  void copy(void* dst, const void* src, bool to_device) const {
#ifdef OPENMLA_EXAMPLE_WITH_CUDA
    if (device_.type == DeviceType::kCUDA) {
      check(cudaMemcpy(dst, src, bytes_, to_device ? cudaMemcpyHostToDevice
                                                   : cudaMemcpyDeviceToHost),
            "cudaMemcpy");
      return;
    }
#endif
    (void)to_device;
    std::memcpy(dst, src, bytes_);
  }

  Device device_;
  size_t bytes_;
  void* data_ = nullptr;
  std::vector<uint8_t> host_;
};

std::vector<uint16_t> random_bf16(size_t n, uint32_t seed) {
  std::vector<uint16_t> v(n);
  for (auto& x : v) {  // an LCG: values in [-1, 1)
    seed = seed * 1664525u + 1013904223u;
    x = to_bf16(static_cast<float>(seed >> 8) / 8388608.f - 1.f);
  }
  return v;
}

struct Options {
  std::string device;
  int layers = 4, batch = 8, seqlen = 2048, heads = 128, steps = 4;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    const char* value = argv[i + 1];
    if (key == "--device") o.device = value;
    else if (key == "--layers") o.layers = std::atoi(value);
    else if (key == "--batch") o.batch = std::atoi(value);
    else if (key == "--seqlen") o.seqlen = std::atoi(value);
    else if (key == "--heads") o.heads = std::atoi(value);
    else if (key == "--steps") o.steps = std::atoi(value);
    else fail("unknown option " + key);
  }
  if (o.device.empty()) {  // the GPU when this build has a backend for it and one is there
    int arch = 0;
    o.device = cuda_backend_available() && cuda_device_arch(0, &arch).ok() && arch == 90 ? "cuda"
                                                                                          : "cpu";
  }
  if (o.layers < 1 || o.batch < 1 || o.seqlen < 0 || o.heads < 1 || o.steps < 1) {
    fail("every size must be positive");
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const Device dev = o.device == "cuda" ? Device::cuda(0) : Device::cpu();
#ifndef OPENMLA_EXAMPLE_WITH_CUDA
  if (dev.type == DeviceType::kCUDA) fail("this build of the example has no CUDA");
#endif
  const int64_t b = o.batch, h = o.heads;
  // Each request's pages: room for its prompt and every step's token, blocks dealt in order.
  const int64_t max_blocks = (o.seqlen + o.steps + kPage - 1) / kPage;
  const int64_t num_blocks = b * max_blocks;
  std::vector<int32_t> table(b * max_blocks);
  for (int64_t i = 0; i < b * max_blocks; ++i) table[i] = static_cast<int32_t>(i);

  // Per layer: a bf16 cache holding every request's prompt (random), and this step's q and new
  // tokens (random; an engine's projections would write them).
  const size_t cache_bytes = static_cast<size_t>(num_blocks) * kPage * kDimQK * 2;
  std::vector<std::unique_ptr<Buffer>> caches, qs, outs, new_tokens;
  for (int l = 0; l < o.layers; ++l) {
    caches.push_back(std::make_unique<Buffer>(dev, cache_bytes));
    caches.back()->upload(random_bf16(cache_bytes / 2, 7 * l + 1).data());
    qs.push_back(std::make_unique<Buffer>(dev, b * h * kDimQK * 2));
    qs.back()->upload(random_bf16(b * h * kDimQK, 7 * l + 2).data());
    new_tokens.push_back(std::make_unique<Buffer>(dev, b * kDimQK * 2));
    new_tokens.back()->upload(random_bf16(b * kDimQK, 7 * l + 3).data());
    outs.push_back(std::make_unique<Buffer>(dev, b * h * kDimV * 2));
  }
  Buffer lse(dev, b * h * 4), table_d(dev, table.size() * 4);
  table_d.upload(table.data());
  int parts = 0;
  check(decode_num_sm_parts(dev, 1, static_cast<int>(h), 1, &parts));
  Buffer metadata(dev, static_cast<size_t>(parts) * kScheduleMetadataInts * 4);
  Buffer num_splits(dev, (b + 1) * 4);
  Buffer workspace(dev, dense_decode_workspace_size(dev, static_cast<int>(b), 1,
                                                    static_cast<int>(h), 1, kDimV));
  // What changes every step: the lengths and each new token's slot. Host copies (pinned on the
  // GPU path, where the graph's copy nodes read them at each replay) and device copies.
  Buffer seqlens_d(dev, b * 4), slots_d(dev, b * 8);
  std::vector<int32_t> seqlens_store(b);
  std::vector<int64_t> slots_store(b);
  int32_t* seqlens_h = seqlens_store.data();
  int64_t* slots_h = slots_store.data();
#ifdef OPENMLA_EXAMPLE_WITH_CUDA
  if (dev.type == DeviceType::kCUDA) {
    check(cudaMallocHost(&seqlens_h, b * 4), "cudaMallocHost");
    check(cudaMallocHost(&slots_h, b * 8), "cudaMallocHost");
  }
#endif

  const auto view = [&](const Buffer& buf, DType dtype, std::initializer_list<int64_t> shape) {
    return TensorView::contiguous(buf.data(), dtype, shape, dev);
  };
  DecodeSchedule schedule;
  schedule.metadata = view(metadata, DType::kInt32, {parts, kScheduleMetadataInts});
  schedule.num_splits = view(num_splits, DType::kInt32, {b + 1});
  const TensorView seqlens = view(seqlens_d, DType::kInt32, {b});

  // One step of the model's attention, on `stream`: the calls an engine makes.
  const auto step = [&](Stream stream) {
#ifdef OPENMLA_EXAMPLE_WITH_CUDA
    if (dev.type == DeviceType::kCUDA) {
      const auto s = static_cast<cudaStream_t>(stream);
      check(cudaMemcpyAsync(seqlens_d.data(), seqlens_h, b * 4, cudaMemcpyHostToDevice, s),
            "copy lengths");
      check(cudaMemcpyAsync(slots_d.data(), slots_h, b * 8, cudaMemcpyHostToDevice, s),
            "copy slots");
    }
#endif
    if (dev.type == DeviceType::kCPU) {
      std::memcpy(seqlens_d.data(), seqlens_h, b * 4);
      std::memcpy(slots_d.data(), slots_h, b * 8);
    }
    DecodeScheduleArgs plan;
    plan.seqlens = seqlens;
    plan.s_q = 1, plan.h_q = static_cast<int>(h), plan.h_kv = 1;
    plan.metadata = schedule.metadata;
    plan.num_splits = schedule.num_splits;
    check(plan_decode_schedule(plan, stream));
    for (int l = 0; l < o.layers; ++l) {
      KVCacheWriteArgs write;
      write.kv = view(*new_tokens[l], DType::kBF16, {b, kDimQK});
      write.slot_mapping = view(slots_d, DType::kInt64, {b});
      write.cache = KVCache{caches[l]->data(), default_kv_layout(KVFormat::kBF16, kPage),
                            num_blocks, dev};
      check(kv_cache_write(write, stream));
      DenseDecodeArgs attn;
      attn.q = view(*qs[l], DType::kBF16, {b, 1, h, kDimQK});
      attn.k_cache = view(*caches[l], DType::kBF16, {num_blocks, kPage, 1, kDimQK});
      attn.block_table = view(table_d, DType::kInt32, {b, max_blocks});
      attn.cache_seqlens = seqlens;
      attn.schedule = schedule;
      attn.out = view(*outs[l], DType::kBF16, {b, 1, h, kDimV});
      attn.lse = view(lse, DType::kFP32, {b, h, 1});
      attn.workspace = {workspace.data(), workspace.bytes()};
      check(dense_decode(attn, stream));
    }
  };
  // Step t's lengths (request i holds seqlen + i % 7 * 64 prompt tokens, capped by its pages)
  // and the slot of the token it appends.
  const auto set_lengths = [&](int t) {
    for (int64_t i = 0; i < b; ++i) {
      const int64_t prompt = std::min<int64_t>(o.seqlen + i % 7 * 64, max_blocks * kPage - o.steps);
      const int64_t pos = prompt + t;
      seqlens_h[i] = static_cast<int32_t>(pos + 1);
      slots_h[i] = static_cast<int64_t>(table[i * max_blocks + pos / kPage]) * kPage + pos % kPage;
    }
  };

  std::vector<double> ms;
#ifdef OPENMLA_EXAMPLE_WITH_CUDA
  if (dev.type == DeviceType::kCUDA) {
    cudaStream_t stream;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    // One step outside the capture first, as engines warm up before capturing: first calls
    // load modules and set kernel attributes, which need not happen inside a capture. (It
    // writes step 0's tokens, which the first replay writes again, the same bytes.)
    set_lengths(0);
    step(stream);
    check(cudaStreamSynchronize(stream), "warm-up");
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
    step(stream);
    check(cudaStreamEndCapture(stream, &graph), "end capture");
    check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    cudaEvent_t start, stop;
    check(cudaEventCreate(&start), "event");
    check(cudaEventCreate(&stop), "event");
    for (int t = 0; t < o.steps; ++t) {
      set_lengths(t);  // read by the graph's copy nodes at this replay
      check(cudaEventRecord(start, stream), "record");
      check(cudaGraphLaunch(exec, stream), "graph launch");
      check(cudaEventRecord(stop, stream), "record");
      check(cudaEventSynchronize(stop), "sync");
      float step_ms = 0;
      check(cudaEventElapsedTime(&step_ms, start, stop), "elapsed");
      ms.push_back(step_ms);
    }
    check(cudaGraphExecDestroy(exec), "destroy");
    check(cudaGraphDestroy(graph), "destroy");
    check(cudaStreamDestroy(stream), "destroy");
  }
#endif
  if (dev.type == DeviceType::kCPU) {
    for (int t = 0; t < o.steps; ++t) {
      set_lengths(t);
      const auto t0 = std::chrono::steady_clock::now();
      step(nullptr);
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                       .count());
    }
  }

  // The last layer's output of the last step against the CPU backend on the same cache (read
  // back after the step's writes), q and lengths.
  std::vector<uint16_t> out(b * h * kDimV), cache(cache_bytes / 2), ref(out.size());
  outs.back()->download(out.data());
  caches.back()->download(cache.data());
  std::vector<uint16_t> q_last = random_bf16(b * h * kDimQK, 7 * (o.layers - 1) + 2);
  std::vector<float> ref_lse(b * h);
  DenseDecodeArgs cpu;
  cpu.q = TensorView::contiguous(q_last.data(), DType::kBF16, {b, 1, h, kDimQK});
  cpu.k_cache = TensorView::contiguous(cache.data(), DType::kBF16, {num_blocks, kPage, 1, kDimQK});
  cpu.block_table = TensorView::contiguous(table.data(), DType::kInt32, {b, max_blocks});
  cpu.cache_seqlens = TensorView::contiguous(seqlens_h, DType::kInt32, {b});
  cpu.out = TensorView::contiguous(ref.data(), DType::kBF16, {b, 1, h, kDimV});
  cpu.lse = TensorView::contiguous(ref_lse.data(), DType::kFP32, {b, h, 1});
  check(dense_decode(cpu));
  double err = 0, norm = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double x = from_bf16(out[i]), y = from_bf16(ref[i]);
    err += (x - y) * (x - y);
    norm += y * y;
  }
  const double rel = std::sqrt(err / norm);
  std::printf("OpenMLA %s decode step on %s: %d layers x (kv_cache_write + dense_decode), b %lld, "
              "h_q %lld, seqlen %d+, one schedule a step%s\n",
              OPENMLA_VERSION_STRING, device_name(dev).c_str(), o.layers,
              static_cast<long long>(b), static_cast<long long>(h), o.seqlen,
              dev.type == DeviceType::kCUDA ? ", replayed as one CUDA graph" : "");
  for (size_t t = 0; t < ms.size(); ++t) std::printf("  step %zu: %.3f ms\n", t, ms[t]);
  std::printf("  last layer's output vs the CPU backend: relative error %.2e\n", rel);
#ifdef OPENMLA_EXAMPLE_WITH_CUDA
  if (dev.type == DeviceType::kCUDA) {
    (void)cudaFreeHost(seqlens_h);
    (void)cudaFreeHost(slots_h);
  }
#endif
  if (!(rel < 1e-2)) fail("the step's output differs from the CPU backend's");
  return 0;
}
