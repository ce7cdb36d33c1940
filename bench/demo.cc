// The main job: one DeepSeek-shaped step of each MLA operation on its default shapes, on the GPU
// when there is one and a kernel exists for it, else on the CPU backend. Prints shapes, time,
// throughput and the error against a double-precision reference computed here.
//
//   openmla_demo [--device auto|cpu|cuda] [--iters N] [--batch B] [--seqlen L] [--heads H]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/codec.h"
#include "openmla/openmla.h"
#ifdef OPENMLA_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace {

using namespace openmla;

struct Options {
  std::string device = "auto";
  int iters = 3;
  int batch = -1, seqlen = 4096, heads = 128;
};

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float stddev = 1.f) {
  std::normal_distribution<float> dist(0.f, stddev);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = codec::float_to_bf16(dist(rng));
  return v;
}

double rel_error(const std::vector<double>& ref, const std::vector<double>& got) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// Naive double-precision attention of one query row over `keys` (each d_qk floats); V = first d_v.
void reference_row(const float* q, const std::vector<const float*>& keys, int d_qk, int d_v,
                   double scale, double* out, double* lse) {
  std::vector<double> logits(keys.size());
  double max_logit = -INFINITY;
  for (size_t t = 0; t < keys.size(); ++t) {
    double dot = 0;
    for (int c = 0; c < d_qk; ++c) dot += double(q[c]) * keys[t][c];
    logits[t] = dot * scale;
    max_logit = std::max(max_logit, logits[t]);
  }
  double sum = 0;
  for (double& l : logits) sum += (l = std::exp(l - max_logit));
  for (int c = 0; c < d_v; ++c) {
    double acc = 0;
    for (size_t t = 0; t < keys.size(); ++t) acc += logits[t] * keys[t][c];
    out[c] = keys.empty() ? 0.0 : acc / sum;
  }
  *lse = keys.empty() ? INFINITY : max_logit + std::log(sum);
}

// Device memory for the GPU path (host memory for the CPU path): mirrors a host vector.
struct Buffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  bool on_gpu = false;
  Buffer(const void* host, size_t n, bool gpu) : bytes(n), on_gpu(gpu) {
#ifdef OPENMLA_WITH_CUDA
    if (gpu) {
      if (cudaMalloc(&ptr, std::max<size_t>(n, 1)) != cudaSuccess) {
        std::fprintf(stderr, "cudaMalloc of %zu bytes failed\n", n);
        std::exit(2);
      }
      if (host) cudaMemcpy(ptr, host, n, cudaMemcpyHostToDevice);
      return;
    }
#endif
    ptr = std::malloc(std::max<size_t>(n, 1));
    if (host) std::memcpy(ptr, host, n);
  }
  ~Buffer() {
#ifdef OPENMLA_WITH_CUDA
    if (on_gpu) {
      cudaFree(ptr);
      return;
    }
#endif
    std::free(ptr);
  }
  void to_host(void* host) const {
#ifdef OPENMLA_WITH_CUDA
    if (on_gpu) {
      cudaMemcpy(host, ptr, bytes, cudaMemcpyDeviceToHost);
      return;
    }
#endif
    std::memcpy(host, ptr, bytes);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

bool gpu_present() {
#ifdef OPENMLA_WITH_CUDA
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
#else
  return false;
#endif
}

void sync_device(bool gpu) {
#ifdef OPENMLA_WITH_CUDA
  if (gpu) cudaDeviceSynchronize();
#else
  (void)gpu;
#endif
}

// Times `run` (median of iters) after one warm-up; returns milliseconds, or a negative value with
// the status filled when the first call fails.
double time_ms(bool gpu, int iters, const std::function<Status()>& run, Status* status) {
  *status = run();
  sync_device(gpu);
  if (!status->ok()) return -1;
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    Status st = run();
    sync_device(gpu);
    times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    if (!st.ok()) *status = st;
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

struct Report {
  std::string name, shape, where;
  double ms = 0, tflops = 0, gbps = 0, out_err = 0, lse_err = 0;
};

void print_report(const Report& r) {
  // CPU rates read better in GFLOP/s, GPU rates in TFLOP/s.
  const bool tera = r.tflops >= 1.0;
  std::printf("%-14s %-52s on %-4s %9.3f ms %8.2f %s %8.1f GB/s   rel err out %.2e, max |lse err| %.2e\n",
              r.name.c_str(), r.shape.c_str(), r.where.c_str(), r.ms, tera ? r.tflops : r.tflops * 1e3,
              tera ? "TFLOP/s" : "GFLOP/s", r.gbps, r.out_err, r.lse_err);
}

// Checks every 8th head of one query token against reference_row: q_rows / out_rows point at
// that token's [h_q, d] bf16 query and [h_q, d_v] bf16 output; lse(h) reads the op's lse.
void check_heads(const uint16_t* q_rows, const uint16_t* out_rows, const std::function<float(int)>& lse,
                 const std::vector<const float*>& keys, int h_q, int d, int dv, Report* r) {
  std::vector<double> ref_all, got_all;
  double lse_err = 0;
  for (int h = 0; h < h_q; h += 8) {
    std::vector<float> qrow(d);
    for (int c = 0; c < d; ++c) qrow[c] = codec::bf16_to_float(q_rows[size_t(h) * d + c]);
    std::vector<double> ref(dv);
    double ref_lse;
    reference_row(qrow.data(), keys, d, dv, 1.0 / std::sqrt(d), ref.data(), &ref_lse);
    for (int c = 0; c < dv; ++c) {
      ref_all.push_back(ref[c]);
      got_all.push_back(codec::bf16_to_float(out_rows[size_t(h) * dv + c]));
    }
    lse_err = std::max(lse_err, std::abs(double(lse(h)) - ref_lse));
  }
  r->out_err = rel_error(ref_all, got_all);
  r->lse_err = lse_err;
}

// Picks where to run: the GPU when asked for (or auto with a GPU present), else the CPU. When the
// GPU has no kernel for the op, reruns on the CPU and says so.
template <typename Setup>
Report run_on_best_device(const Options& opt, const char* name, Setup&& setup) {
  const bool want_gpu = opt.device == "cuda" || (opt.device == "auto" && gpu_present());
  Report r;
  if (want_gpu) {
    Status st = setup(true, &r);
    if (st.ok()) return r;
    if (st.code() != StatusCode::kNotImplemented || opt.device == "cuda") {
      std::printf("%-14s failed on the GPU: %s\n", name, st.message().c_str());
      if (opt.device == "cuda") std::exit(1);
    } else {
      std::printf("%-14s no GPU kernel yet (%s); running on the CPU backend\n", name,
                  st.message().c_str());
    }
  }
  Status st = setup(false, &r);
  if (!st.ok()) {
    std::printf("%-14s failed on the CPU: %s\n", name, st.message().c_str());
    std::exit(1);
  }
  return r;
}

// DeepSeek-V3 dense decode: bf16 paged cache, d_qk 576, d_v 512, page 64, one kv head.
Report dense_decode_demo(const Options& opt) {
  return run_on_best_device(opt, "dense_decode", [&](bool gpu, Report* r) -> Status {
    const int b = opt.batch > 0 ? opt.batch : (gpu ? 128 : 4);
    const int s_q = 1, h_q = opt.heads, d = 576, dv = 512, page = 64, L = opt.seqlen;
    const int blocks_per_req = (L + page - 1) / page, num_blocks = b * blocks_per_req;
    std::mt19937 rng(1234);
    auto q = random_bf16(size_t(b) * s_q * h_q * d, rng);
    auto k = random_bf16(size_t(num_blocks) * page * d, rng);
    std::vector<int32_t> table(size_t(b) * blocks_per_req), seqlens(b, L);
    for (size_t i = 0; i < table.size(); ++i) table[i] = int32_t(i);
    std::shuffle(table.begin(), table.end(), rng);  // pages scattered like a real pool
    Buffer bq(q.data(), q.size() * 2, gpu), bk(k.data(), k.size() * 2, gpu),
        bt(table.data(), table.size() * 4, gpu), bs(seqlens.data(), seqlens.size() * 4, gpu),
        bo(nullptr, size_t(b) * s_q * h_q * dv * 2, gpu), bl(nullptr, size_t(b) * h_q * s_q * 4, gpu);
    const Device dev = gpu ? Device::cuda(0) : Device::cpu();
    DenseDecodeArgs a;
    a.q = TensorView::contiguous(bq.ptr, DType::kBF16, {b, s_q, h_q, d}, dev);
    a.k_cache = TensorView::contiguous(bk.ptr, DType::kBF16, {num_blocks, page, 1, d}, dev);
    a.block_table = TensorView::contiguous(bt.ptr, DType::kInt32, {b, blocks_per_req}, dev);
    a.cache_seqlens = TensorView::contiguous(bs.ptr, DType::kInt32, {b}, dev);
    a.out = TensorView::contiguous(bo.ptr, DType::kBF16, {b, s_q, h_q, dv}, dev);
    a.lse = TensorView::contiguous(bl.ptr, DType::kFP32, {b, h_q, s_q}, dev);
    const size_t ws_bytes = dense_decode_workspace_size(dev, b, s_q, h_q, 1, dv);
    Buffer ws(nullptr, ws_bytes, gpu);
    a.workspace = {ws.ptr, ws_bytes};
    Status st;
    r->ms = time_ms(gpu, opt.iters, [&] { return dense_decode(a); }, &st);
    if (!st.ok()) return st;
    r->name = "dense_decode";
    r->where = gpu ? "GPU" : "CPU";
    char shape[128];
    std::snprintf(shape, sizeof shape, "b=%d s_q=%d h_q=%d seqlen=%d d=%d/%d bf16 page %d", b, s_q,
                  h_q, L, d, dv, page);
    r->shape = shape;
    r->tflops = 2.0 * b * s_q * h_q * L * (d + dv) / (r->ms * 1e-3) / 1e12;
    r->gbps = double(b) * L * d * 2 / (r->ms * 1e-3) / 1e9;

    // Reference: request 0, every 8th head, in double.
    std::vector<uint16_t> out(size_t(b) * s_q * h_q * dv);
    std::vector<float> lse(size_t(b) * h_q * s_q);
    bo.to_host(out.data());
    bl.to_host(lse.data());
    std::vector<std::vector<float>> keys(L, std::vector<float>(d));
    std::vector<const float*> key_ptrs;
    for (int t = 0; t < L; ++t) {
      const size_t base = (size_t(table[t / page]) * page + t % page) * d;
      for (int c = 0; c < d; ++c) keys[t][c] = codec::bf16_to_float(k[base + c]);
      key_ptrs.push_back(keys[t].data());
    }
    check_heads(q.data(), out.data(), [&](int h) { return lse[size_t(h) * s_q]; }, key_ptrs, h_q, d, dv, r);
    return Status::Ok();
  });
}

// DeepSeek-V3.2 sparse decode: fp8_v32 cache (656 B/token), topk 2048.
Report sparse_decode_demo(const Options& opt) {
  return run_on_best_device(opt, "sparse_decode", [&](bool gpu, Report* r) -> Status {
    const int b = opt.batch > 0 ? opt.batch : (gpu ? 128 : 2);
    const int s_q = 1, h_q = opt.heads, d = 576, dv = 512, page = 64, topk = 2048;
    const int L = std::max(opt.seqlen, topk), blocks_per_req = (L + page - 1) / page;
    const int num_blocks = b * blocks_per_req;
    std::mt19937 rng(99);
    auto q = random_bf16(size_t(b) * s_q * h_q * d, rng);
    const KVLayout layout = default_kv_layout(KVFormat::kFP8_V32, page);
    std::vector<uint8_t> cache(size_t(num_blocks) * layout.block_stride);
    {
      auto kv = random_bf16(size_t(num_blocks) * page * d, rng);
      std::vector<int64_t> slots(size_t(num_blocks) * page);
      for (size_t i = 0; i < slots.size(); ++i) slots[i] = int64_t(i);
      KVCacheWriteArgs w;
      w.kv = TensorView::contiguous(kv.data(), DType::kBF16, {int64_t(slots.size()), d});
      w.slot_mapping = TensorView::contiguous(slots.data(), DType::kInt64, {int64_t(slots.size())});
      w.cache = KVCache{cache.data(), layout, num_blocks, Device::cpu()};
      OPENMLA_RETURN_IF_ERROR(kv_cache_write(w));
    }
    std::vector<int32_t> indices(size_t(b) * s_q * topk);
    for (int i = 0; i < b; ++i) {
      std::vector<int32_t> pool(L);
      for (int t = 0; t < L; ++t) pool[t] = i * blocks_per_req * page + t;
      std::shuffle(pool.begin(), pool.end(), rng);
      std::copy(pool.begin(), pool.begin() + topk, indices.begin() + size_t(i) * topk);
    }
    Buffer bq(q.data(), q.size() * 2, gpu), bc(cache.data(), cache.size(), gpu),
        bi(indices.data(), indices.size() * 4, gpu), bo(nullptr, size_t(b) * s_q * h_q * dv * 2, gpu),
        bl(nullptr, size_t(b) * h_q * s_q * 4, gpu);
    const Device dev = gpu ? Device::cuda(0) : Device::cpu();
    SparseDecodeArgs a;
    a.q = TensorView::contiguous(bq.ptr, DType::kBF16, {b, s_q, h_q, d}, dev);
    a.k_cache = KVCache{bc.ptr, layout, num_blocks, dev};
    a.indices = TensorView::contiguous(bi.ptr, DType::kInt32, {b, s_q, topk}, dev);
    a.out = TensorView::contiguous(bo.ptr, DType::kBF16, {b, s_q, h_q, dv}, dev);
    a.lse = TensorView::contiguous(bl.ptr, DType::kFP32, {b, h_q, s_q}, dev);
    Status st;
    r->ms = time_ms(gpu, opt.iters, [&] { return sparse_decode(a); }, &st);
    if (!st.ok()) return st;
    r->name = "sparse_decode";
    r->where = gpu ? "GPU" : "CPU";
    char shape[128];
    std::snprintf(shape, sizeof shape, "b=%d s_q=%d h_q=%d topk=%d fp8_v32 (656 B) page %d", b, s_q,
                  h_q, topk, page);
    r->shape = shape;
    r->tflops = 2.0 * b * s_q * h_q * topk * (d + dv) / (r->ms * 1e-3) / 1e12;
    r->gbps = double(b) * s_q * topk * 656 / (r->ms * 1e-3) / 1e9;

    std::vector<uint16_t> out(size_t(b) * s_q * h_q * dv);
    std::vector<float> lse(size_t(b) * h_q * s_q);
    bo.to_host(out.data());
    bl.to_host(lse.data());
    KVCache host_cache{cache.data(), layout, num_blocks, Device::cpu()};
    std::vector<std::vector<float>> keys(topk, std::vector<float>(d));
    std::vector<const float*> key_ptrs;
    for (int t = 0; t < topk; ++t) {
      codec::decode_slot(host_cache, indices[t], keys[t].data());
      key_ptrs.push_back(keys[t].data());
    }
    check_heads(q.data(), out.data(), [&](int h) { return lse[h]; }, key_ptrs, h_q, d, dv, r);
    return Status::Ok();
  });
}

// DeepSeek-V3.2 sparse prefill: bf16 kv, d_qk 576, h_q 128, topk 2048 over 8192 keys.
Report sparse_prefill_demo(const Options& opt) {
  return run_on_best_device(opt, "sparse_prefill", [&](bool gpu, Report* r) -> Status {
    const int s_q = gpu ? 4096 : 8, s_kv = 8192, h_q = opt.heads, d = 576, dv = 512, topk = 2048;
    std::mt19937 rng(7);
    auto q = random_bf16(size_t(s_q) * h_q * d, rng);
    auto kv = random_bf16(size_t(s_kv) * d, rng);
    std::vector<int32_t> indices(size_t(s_q) * topk);
    std::vector<int32_t> pool(s_kv);
    for (int t = 0; t < s_kv; ++t) pool[t] = t;
    for (int i = 0; i < s_q; ++i) {
      std::shuffle(pool.begin(), pool.end(), rng);
      std::copy(pool.begin(), pool.begin() + topk, indices.begin() + size_t(i) * topk);
    }
    Buffer bq(q.data(), q.size() * 2, gpu), bkv(kv.data(), kv.size() * 2, gpu),
        bi(indices.data(), indices.size() * 4, gpu), bo(nullptr, size_t(s_q) * h_q * dv * 2, gpu),
        bm(nullptr, size_t(s_q) * h_q * 4, gpu), bl(nullptr, size_t(s_q) * h_q * 4, gpu);
    const Device dev = gpu ? Device::cuda(0) : Device::cpu();
    SparsePrefillArgs a;
    a.q = TensorView::contiguous(bq.ptr, DType::kBF16, {s_q, h_q, d}, dev);
    a.kv = TensorView::contiguous(bkv.ptr, DType::kBF16, {s_kv, 1, d}, dev);
    a.indices = TensorView::contiguous(bi.ptr, DType::kInt32, {s_q, 1, topk}, dev);
    a.out = TensorView::contiguous(bo.ptr, DType::kBF16, {s_q, h_q, dv}, dev);
    a.max_logits = TensorView::contiguous(bm.ptr, DType::kFP32, {s_q, h_q}, dev);
    a.lse = TensorView::contiguous(bl.ptr, DType::kFP32, {s_q, h_q}, dev);
    Status st;
    r->ms = time_ms(gpu, opt.iters, [&] { return sparse_prefill(a); }, &st);
    if (!st.ok()) return st;
    r->name = "sparse_prefill";
    r->where = gpu ? "GPU" : "CPU";
    char shape[128];
    std::snprintf(shape, sizeof shape, "s_q=%d s_kv=%d h_q=%d topk=%d d=%d/%d bf16", s_q, s_kv, h_q,
                  topk, d, dv);
    r->shape = shape;
    r->tflops = 2.0 * s_q * h_q * topk * (d + dv) / (r->ms * 1e-3) / 1e12;
    r->gbps = double(s_q) * topk * d * 2 / (r->ms * 1e-3) / 1e9;

    std::vector<uint16_t> out(size_t(s_q) * h_q * dv);
    std::vector<float> lse(size_t(s_q) * h_q);
    bo.to_host(out.data());
    bl.to_host(lse.data());
    const int token = s_q - 1;  // the last query token, every 8th head
    std::vector<std::vector<float>> keys(topk, std::vector<float>(d));
    std::vector<const float*> key_ptrs;
    for (int t = 0; t < topk; ++t) {
      const int32_t src = indices[size_t(token) * topk + t];
      for (int c = 0; c < d; ++c) keys[t][c] = codec::bf16_to_float(kv[size_t(src) * d + c]);
      key_ptrs.push_back(keys[t].data());
    }
    check_heads(q.data() + size_t(token) * h_q * d, out.data() + size_t(token) * h_q * dv,
                [&](int h) { return lse[size_t(token) * h_q + h]; }, key_ptrs, h_q, d, dv, r);
    return Status::Ok();
  });
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--device") o.device = next();
    else if (a == "--iters") o.iters = std::max(1, std::atoi(next().c_str()));
    else if (a == "--batch") o.batch = std::atoi(next().c_str());
    else if (a == "--seqlen") o.seqlen = std::max(1, std::atoi(next().c_str()));
    else if (a == "--heads") o.heads = std::max(1, std::atoi(next().c_str()));
    else {
      std::fprintf(stderr, "usage: %s [--device auto|cpu|cuda] [--iters N] [--batch B] [--seqlen L] [--heads H]\n", argv[0]);
      std::exit(a == "--help" || a == "-h" ? 0 : 2);
    }
  }
  if (o.device != "auto" && o.device != "cpu" && o.device != "cuda") {
    std::fprintf(stderr, "--device: expected auto, cpu or cuda, got %s\n", o.device.c_str());
    std::exit(2);
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  std::printf("OpenMLA %s demo: CUDA backend %s, GPU %s, CPU threads %s\n", OPENMLA_VERSION_STRING,
              cuda_backend_available() ? "built" : "not built", gpu_present() ? "present" : "absent",
              std::getenv("OMP_NUM_THREADS") ? std::getenv("OMP_NUM_THREADS") : "all");
  std::printf("time: median of %d runs after a warm-up (wall clock, synchronised)\n", opt.iters);
  const Report reports[] = {dense_decode_demo(opt), sparse_decode_demo(opt), sparse_prefill_demo(opt)};
  bool ok = true;
  for (const Report& r : reports) {
    print_report(r);
    ok = ok && r.out_err < 1e-2 && r.lse_err < 1e-3;
  }
  std::printf("%s\n", ok ? "all results within tolerance (rel err < 1e-2, |lse err| < 1e-3)"
                         : "RESULT OUT OF TOLERANCE");
  return ok ? 0 : 1;
}
