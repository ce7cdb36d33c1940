// The fused norm-rope-attention-rope-cast operations on the GPU against the CPU backend (the
// definition, docs/semantics.md), on fresh random data: V4 (fp8_model1) and V4.1 (fp8_mx, fp4
// extra) paged caches for decode, bf16 kv for prefill; h_q 16 / 64 / 128; the norm on and off;
// sinks with ±inf; topk_length with zeros (lonely queries); invalid indices; NaN in every cache
// slot no index names; outputs poisoned before the call. Both the kernel's epilogue (one split)
// and the combine (split key lists) write the e4m3 output, so both are covered.
//
// What may differ from the CPU: the kernel rounds P (and q after its norm) to bf16 where the
// definition keeps fp32, so an output value may sit on the other side of an e4m3 rounding step,
// and a chunk whose amax / 448 is within that noise of a power of two may take the next scale.
// Checked: each dequantised value within two e4m3 steps of the reference plus a tenth of its
// chunk's largest value (the attention's error is relative to the row, seen 1e-2), the relative
// L2 error of each token's output below 3e-2, at least 99% of the scale
// bytes equal and none more than one binade off, lse / max_logits within 1e-2 · max(1, |x|),
// infinities exactly where the reference has them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <vector>

#include "common/test_data.h"
#include "gpu/gpu_kv_cache.h"
#include "gpu/gpu_test_util.h"
#include "openmla/openmla.h"

namespace openmla::testing {
namespace {

constexpr int kDims = 512;
constexpr int kRope = 64;
constexpr int64_t kPositions = 4096;

struct FusedCase {
  const char* name;
  bool decode = true;
  int64_t s_q = 4, h_q = 64, n_wv_group = 8, topk = 128, extra_topk = 64, s_kv = 3000;
  KVFormat cache = KVFormat::kFP8_Model1;
  std::optional<KVFormat> extra;
  int page = 64, extra_page = 16;
  int64_t blocks = 24, extra_blocks = 12;
  bool norm = true, sink = true, topk_length = true, extra_topk_length = true;
  bool batch_invariant = false;
  uint64_t seed = 1;
};

HostTensor int_vector(const std::vector<int32_t>& v) {
  HostTensor t(DType::kInt32, {static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i) t.set({static_cast<int64_t>(i)}, v[i]);
  return t;
}

HostTensor make_cos_sin() {  // FlashMLA's construction, base 1e5
  HostTensor t(DType::kFP32, {kPositions, kRope});
  for (int64_t p = 0; p < kPositions; ++p) {
    for (int i = 0; i < kRope / 2; ++i) {
      const float theta = static_cast<float>(p) * static_cast<float>(std::pow(1e5, -2.0 * i / kRope));
      t.set({p, i}, std::cos(theta));
      t.set({p, kRope / 2 + i}, std::sin(theta));
    }
  }
  return t;
}

// Rows of `topk` indices into `live` slots, with 15% invalid (-1 or past the cache).
HostTensor random_indices(int64_t rows, int64_t topk, const std::vector<int64_t>& live,
                          int64_t num_slots, bool three_dims, Rng& rng) {
  HostTensor t = three_dims ? HostTensor(DType::kInt32, {rows, 1, topk})
                            : HostTensor(DType::kInt32, {rows, topk});
  for (int64_t s = 0; s < rows; ++s) {
    const std::vector<int32_t> perm = random_permutation(static_cast<int64_t>(live.size()), rng);
    for (int64_t e = 0; e < topk; ++e) {
      int64_t v = live[perm[e % static_cast<int64_t>(live.size())]];
      if (rng.coin(0.15)) v = rng.coin() ? -1 : num_slots + rng.randint(0, 5);
      if (three_dims) t.set({s, 0, e}, static_cast<double>(v));
      else t.set({s, e}, static_cast<double>(v));
    }
  }
  return t;
}

HostTensor lengths(int64_t s_q, int64_t n, Rng& rng) {
  std::vector<int32_t> v(s_q);
  for (auto& x : v) x = static_cast<int32_t>(rng.randint(0, n));
  v[s_q - 1] = 0;
  return int_vector(v);
}

// A case's inputs on the host (the CPU's) and their device mirrors.
struct Problem {
  HostTensor q, positions, cos_sin, kv, indices, extra_indices, topk_length, extra_topk_length,
      sink, out_fp8, out_sf, lse, max_logits;
  std::optional<TestCache> cache, extra_cache;
  FusedOutSfLayout sf{};
  std::vector<DeviceTensor> device;  // the inputs' mirrors (kept alive)
  DeviceTensor d_out_fp8, d_out_sf, d_lse, d_max_logits;
  DeviceBuffer workspace;

  explicit Problem(const FusedCase& c) {
    Rng rng(c.seed);
    q = HostTensor(DType::kBF16, {c.s_q, c.h_q, kDims});
    q.fill_normal(rng, c.norm ? 4.0 : 0.5);
    cos_sin = make_cos_sin();
    std::vector<int32_t> pos(c.s_q);
    for (auto& p : pos) p = static_cast<int32_t>(rng.randint(0, kPositions - 1));
    pos[0] = kPositions - 1;
    positions = int_vector(pos);
    if (c.decode) {
      CacheSpec s;
      s.format = c.cache;
      s.d_qk = kDims;
      s.page = c.page;
      s.num_blocks = c.blocks;
      cache.emplace(s, rng);
      indices = random_indices(c.s_q, c.topk, cache->live, cache->num_slots(), false, rng);
      if (c.extra) {
        CacheSpec e;
        e.format = *c.extra;
        e.d_qk = kDims;
        e.page = c.extra_page;
        e.num_blocks = c.extra_blocks;
        extra_cache.emplace(e, rng);
        extra_indices = random_indices(c.s_q, c.extra_topk, extra_cache->live,
                                       extra_cache->num_slots(), false, rng);
        if (c.extra_topk_length) extra_topk_length = lengths(c.s_q, c.extra_topk, rng);
      }
    } else {
      kv = HostTensor(DType::kBF16, {c.s_kv, 1, kDims});
      kv.fill_normal(rng);
      std::vector<int64_t> all;
      for (int64_t i = 0; i < c.s_kv; ++i) all.push_back(i);
      indices = random_indices(c.s_q, c.topk, all, c.s_kv, true, rng);
    }
    if (c.topk_length) topk_length = lengths(c.s_q, c.topk, rng);
    if (c.sink) {
      sink = HostTensor(DType::kFP32, {c.h_q});
      for (int64_t h = 0; h < c.h_q; ++h) {
        sink.set({h}, h % 4 == 1 ? INFINITY : h % 4 == 2 ? -INFINITY : rng.uniform(-2, 2));
      }
    }
    const int64_t gsize = c.h_q / c.n_wv_group;
    EXPECT_TRUE(fused_out_sf_layout(c.s_q, c.n_wv_group, gsize, kDims, &sf).ok());
    out_fp8 = HostTensor(DType::kUInt8, {c.s_q, c.n_wv_group, gsize * kDims});
    out_sf = HostTensor(DType::kInt32, {sf.shape[0], sf.shape[1], sf.shape[2]},
                        {sf.strides[0], sf.strides[1], sf.strides[2]});
    lse = HostTensor(DType::kFP32, {c.s_q, c.h_q});
    max_logits = HostTensor(DType::kFP32, {c.s_q, c.h_q});
    d_out_fp8 = poisoned_like(out_fp8);
    d_out_sf = poisoned_like(out_sf);
    d_lse = poisoned_like(lse);
    d_max_logits = poisoned_like(max_logits);
    workspace = DeviceBuffer(fused_norm_rope_attn_rope_cast_workspace_size(Device::cuda(0), c.s_q,
                                                                           c.h_q));
    workspace.poison();
  }

  TensorView mirror(const HostTensor& t) {
    if (t.view().data == nullptr) return {};
    device.push_back(to_device(t));
    return device.back().view;
  }
  TensorView host(const HostTensor& t) { return t.view().data == nullptr ? TensorView{} : t.view(); }

  // The arguments on the CPU (gpu = false: host tensors) or the GPU (device mirrors).
  FusedNormRopeCast settings(const FusedCase& c, bool gpu) {
    FusedNormRopeCast f;
    f.enable_q_norm = c.norm;
    f.rms_norm_eps = 1e-4f;
    f.token_positions = gpu ? mirror(positions) : host(positions);
    f.cos_sin_cache = gpu ? mirror(cos_sin) : host(cos_sin);
    f.n_wv_group = static_cast<int>(c.n_wv_group);
    return f;
  }
  FusedDecodeArgs decode_args(const FusedCase& c, bool gpu) {
    auto v = [&](const HostTensor& t) { return gpu ? mirror(t) : host(t); };
    FusedDecodeArgs a;
    a.fused = settings(c, gpu);
    a.q = v(q);
    a.k_cache = gpu ? cache->gpu : cache->host.cache;
    a.indices = v(indices);
    a.topk_length = v(topk_length);
    if (extra_cache) {
      a.extra_k_cache = gpu ? extra_cache->gpu : extra_cache->host.cache;
      a.extra_indices = v(extra_indices);
      a.extra_topk_length = v(extra_topk_length);
    }
    a.attn_sink = v(sink);
    a.out_fp8 = gpu ? d_out_fp8.view : out_fp8.view();
    a.out_sf = gpu ? d_out_sf.view : out_sf.view();
    a.lse = gpu ? d_lse.view : lse.view();
    a.batch_invariant = c.batch_invariant;
    if (gpu) a.workspace = {workspace.data(), workspace.bytes()};
    return a;
  }
  FusedPrefillArgs prefill_args(const FusedCase& c, bool gpu) {
    auto v = [&](const HostTensor& t) { return gpu ? mirror(t) : host(t); };
    FusedPrefillArgs a;
    a.fused = settings(c, gpu);
    a.q = v(q);
    a.kv = v(kv);
    a.indices = v(indices);
    a.topk_length = v(topk_length);
    a.attn_sink = v(sink);
    a.out_fp8 = gpu ? d_out_fp8.view : out_fp8.view();
    a.out_sf = gpu ? d_out_sf.view : out_sf.view();
    a.max_logits = gpu ? d_max_logits.view : max_logits.view();
    a.lse = gpu ? d_lse.view : lse.view();
    if (gpu) a.workspace = {workspace.data(), workspace.bytes()};
    return a;
  }
};

// Output element (s, g, i) dequantised: e4m3 byte times its chunk's UE8M0 scale.
struct Dequant {
  const HostTensor& fp8;
  const HostTensor& sf;
  int scale_byte(int64_t s, int64_t g, int64_t chunk) const {
    const uint32_t word = static_cast<uint32_t>(static_cast<int32_t>(sf.get({s, g, chunk / 4})));
    return static_cast<int>((word >> (8 * (chunk % 4))) & 0xFF);
  }
  double value(int64_t s, int64_t g, int64_t i) const {
    const uint8_t b = static_cast<uint8_t>(fp8.get({s, g, i}));
    return codec::e4m3_to_float(b) * std::ldexp(1.0, scale_byte(s, g, i / 32) - 127);
  }
};

void compare(const FusedCase& c, const Problem& p, const HostTensor& got_fp8,
             const HostTensor& got_sf, const HostTensor& got_lse, const HostTensor* got_max) {
  const Dequant ref{p.out_fp8, p.out_sf}, got{got_fp8, got_sf};
  const int64_t gsize = c.h_q / c.n_wv_group, row = gsize * kDims, chunks = row / 32;
  int64_t scales = 0, scales_equal = 0, far_scales = 0, bad_values = 0;
  double worst_token = 0.0;
  for (int64_t s = 0; s < c.s_q; ++s) {
    double err2 = 0.0, ref2 = 0.0;
    for (int64_t g = 0; g < c.n_wv_group; ++g) {
      for (int64_t k = 0; k < chunks; ++k) {
        const int er = ref.scale_byte(s, g, k), eg = got.scale_byte(s, g, k);
        ++scales;
        scales_equal += er == eg;
        far_scales += std::abs(er - eg) > 1;
        const double quantum = std::ldexp(1.0, std::max(er, eg) - 127 - 6);
        double chunk_max = 0.0;
        for (int64_t j = 0; j < 32; ++j) {
          chunk_max = std::max(chunk_max, std::fabs(ref.value(s, g, 32 * k + j)));
        }
        for (int64_t j = 0; j < 32; ++j) {
          const double r = ref.value(s, g, 32 * k + j), v = got.value(s, g, 32 * k + j);
          err2 += (v - r) * (v - r);
          ref2 += r * r;
          // An e4m3 step of either value, plus the attention's own difference, which is relative
          // to the row (the chunk's largest value), not to a small element.
          const double bound =
              0.13 * std::max(std::fabs(r), std::fabs(v)) + 0.1 * chunk_max + quantum;
          if (!(std::fabs(v - r) <= bound)) {
            if (bad_values < 5) {
              ADD_FAILURE() << "token " << s << " group " << g << " byte " << 32 * k + j
                            << ": got " << v << ", CPU " << r;
            }
            ++bad_values;
          }
        }
      }
    }
    const double rel = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
    worst_token = std::max(worst_token, rel);
  }
  if (std::getenv("OPENMLA_TEST_VERBOSE") != nullptr) {
    std::printf("%s: worst token rel L2 %.2e, scales equal %lld / %lld\n", c.name, worst_token,
                static_cast<long long>(scales_equal), static_cast<long long>(scales));
  }
  EXPECT_EQ(bad_values, 0);
  EXPECT_LE(worst_token, 3e-2);
  EXPECT_EQ(far_scales, 0);
  EXPECT_GE(static_cast<double>(scales_equal), 0.99 * static_cast<double>(scales));
  auto stats = [&](const HostTensor& ref_t, const HostTensor& got_t, const char* what) {
    for (int64_t s = 0; s < c.s_q; ++s) {
      for (int64_t h = 0; h < c.h_q; ++h) {
        const double r = ref_t.get({s, h}), v = got_t.get({s, h});
        if (std::isinf(r)) {
          EXPECT_EQ(r, v) << what << " token " << s << " head " << h;
        } else {
          EXPECT_NEAR(v, r, 1e-2 * std::max(1.0, std::fabs(r))) << what << " token " << s
                                                                << " head " << h;
        }
      }
    }
  };
  stats(p.lse, got_lse, "lse");
  if (got_max != nullptr) stats(p.max_logits, *got_max, "max_logits");
}

void check(const FusedCase& c) {
  SCOPED_TRACE(c.name);
  Problem p(c);
  Status st;
  if (c.decode) {
    st = fused_norm_rope_attn_rope_cast_decode(p.decode_args(c, false));
  } else {
    st = fused_norm_rope_attn_rope_cast_prefill(p.prefill_args(c, false));
  }
  ASSERT_TRUE(st.ok()) << "CPU: " << st.message();
  if (c.decode) {
    st = fused_norm_rope_attn_rope_cast_decode(p.decode_args(c, true));
  } else {
    st = fused_norm_rope_attn_rope_cast_prefill(p.prefill_args(c, true));
  }
  ASSERT_TRUE(st.ok()) << "GPU: " << st.message();
  synchronize();
  HostTensor fp8 = same_layout(p.out_fp8), sf = same_layout(p.out_sf), lse = same_layout(p.lse),
             mx = same_layout(p.max_logits);
  copy_to_host(p.d_out_fp8, &fp8);
  copy_to_host(p.d_out_sf, &sf);
  copy_to_host(p.d_lse, &lse);
  if (!c.decode) copy_to_host(p.d_max_logits, &mx);
  compare(c, p, fp8, sf, lse, c.decode ? nullptr : &mx);
}

TEST(FusedAttention, DecodeV4) {
  // V4: fp8_model1 caches, main and extra, the norm on; split key lists (the combine writes).
  FusedCase c{"v4 h64"};
  c.extra = KVFormat::kFP8_Model1;
  check(c);
  c.name = "v4 h128 batch invariant (the epilogue writes)";
  c.h_q = 128;
  c.n_wv_group = 16;
  c.batch_invariant = true;
  c.seed = 2;
  check(c);
}

TEST(FusedAttention, DecodeV41) {
  // V4.1: fp8_mx main cache, fp4 or fp8_mx extra, no norm.
  FusedCase c{"v4.1 h64 fp4 extra"};
  c.cache = KVFormat::kFP8_MX;
  c.extra = KVFormat::kFP4;
  c.norm = false;
  c.topk = 512;
  c.extra_topk = 128;
  c.page = 256;
  c.blocks = 6;
  c.s_q = 3;
  check(c);
  c.name = "v4.1 h128 fp8_mx extra, no lengths";
  c.h_q = 128;
  c.extra = KVFormat::kFP8_MX;
  c.topk_length = c.extra_topk_length = false;
  c.seed = 3;
  check(c);
  c.name = "v4.1 h16 no extra, no sink, many tokens";
  c.h_q = 16;
  c.n_wv_group = 2;
  c.extra.reset();
  c.sink = false;
  c.s_q = 64;
  c.topk = 256;
  c.seed = 4;
  check(c);
}

TEST(FusedAttention, Prefill) {
  FusedCase c{"prefill h64 norm"};
  c.decode = false;
  c.s_q = 70;
  c.topk = 512;
  check(c);
  c.name = "prefill h128 no norm";
  c.h_q = 128;
  c.n_wv_group = 16;
  c.norm = false;
  c.topk = 1024;
  c.s_q = 37;
  c.seed = 5;
  check(c);
  c.name = "prefill h64 two tokens, long lists (split)";
  c.h_q = 64;
  c.n_wv_group = 8;
  c.s_q = 2;
  c.topk = 2048;
  c.s_kv = 5000;
  c.seed = 6;
  check(c);
}

TEST(FusedAttentionSmall, PositionOutsideTheCacheReadsNothing) {
  // CUDA tensors' positions are not read on the host: a position past the cos/sin cache must not
  // be read (compute-sanitizer's run of this test); that token's bytes are 0x7F and its scales
  // 0xFF, and the other tokens' results are intact.
  FusedCase c{"bad position"};
  c.extra = KVFormat::kFP8_Model1;
  c.s_q = 3;
  Problem p(c);
  const Status cpu = fused_norm_rope_attn_rope_cast_decode(p.decode_args(c, false));
  ASSERT_TRUE(cpu.ok()) << cpu.message();
  p.positions.set({1}, static_cast<double>(kPositions + 1000));
  const Status st = fused_norm_rope_attn_rope_cast_decode(p.decode_args(c, true));
  ASSERT_TRUE(st.ok()) << st.message();
  synchronize();
  HostTensor fp8 = same_layout(p.out_fp8), sf = same_layout(p.out_sf);
  copy_to_host(p.d_out_fp8, &fp8);
  copy_to_host(p.d_out_sf, &sf);
  const Dequant ref{p.out_fp8, p.out_sf}, got{fp8, sf};
  int64_t not_nan = 0;
  for (int64_t g = 0; g < c.n_wv_group; ++g) {
    for (int64_t i = 0; i < c.h_q / c.n_wv_group * kDims; ++i) not_nan += fp8.get({1, g, i}) != 0x7F;
    for (int64_t k = 0; k < c.h_q / c.n_wv_group * kDims / 32; ++k) {
      EXPECT_EQ(got.scale_byte(1, g, k), 0xFF) << "group " << g << " chunk " << k;
    }
  }
  EXPECT_EQ(not_nan, 0) << "token 1's bytes: 0x7F (e4m3 NaN) expected";
  for (int64_t s : {0, 2}) {
    for (int64_t i = 0; i < c.h_q / c.n_wv_group * kDims; i += 97) {
      const double r = ref.value(s, 0, i), v = got.value(s, 0, i);
      EXPECT_LE(std::fabs(v - r), 0.13 * std::fabs(r) + 1e-3) << "token " << s << " byte " << i;
    }
  }
}

// Small shapes of every path for compute-sanitizer (tools/device_check.sh runs *Small*): the
// combine (split lists), the epilogue (one split), the seesaw (prefill).
TEST(FusedAttentionSmall, EveryPath) {
  FusedCase c{"small split"};
  c.extra = KVFormat::kFP8_Model1;
  c.s_q = 2;
  c.blocks = 4;
  c.extra_blocks = 4;
  check(c);
  c.name = "small one split";
  c.batch_invariant = true;
  check(c);
  c.name = "small prefill";
  c.decode = false;
  c.s_q = 3;
  c.topk = 256;
  c.s_kv = 400;
  check(c);
}

TEST(FusedAttention, CudaGraphReplay) {
  FusedCase c{"graph"};
  c.extra = KVFormat::kFP8_Model1;
  Problem p(c);
  const FusedDecodeArgs a = p.decode_args(c, true);
  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  ASSERT_TRUE(fused_norm_rope_attn_rope_cast_decode(a, stream).ok());
  check_cuda(cudaStreamSynchronize(stream), "sync");
  HostTensor eager = same_layout(p.out_fp8);
  copy_to_host(p.d_out_fp8, &eager);
  p.d_out_fp8.buffer.poison();
  cudaGraph_t graph;
  check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
  const Status st = fused_norm_rope_attn_rope_cast_decode(a, stream);
  check_cuda(cudaStreamEndCapture(stream, &graph), "end capture");
  ASSERT_TRUE(st.ok()) << st.message();
  cudaGraphExec_t exec;
  check_cuda(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  check_cuda(cudaGraphLaunch(exec, stream), "launch");
  check_cuda(cudaStreamSynchronize(stream), "sync");
  HostTensor replay = same_layout(p.out_fp8);
  copy_to_host(p.d_out_fp8, &replay);
  EXPECT_EQ(eager.values(), replay.values());
  check_cuda(cudaGraphExecDestroy(exec), "destroy exec");
  check_cuda(cudaGraphDestroy(graph), "destroy graph");
  check_cuda(cudaStreamDestroy(stream), "destroy stream");
}

}  // namespace
}  // namespace openmla::testing
