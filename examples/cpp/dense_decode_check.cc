// One dense decode on the CPU backend through the installed public API, checked against the
// attention computed here in double precision; then one bad argument, which must come back as
// InvalidArgument naming it. Exit status 0 only if both hold.
#include <openmla/openmla.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "bf16.h"

int main() {
  using namespace openmla;
  using example::from_bf16;
  using example::to_bf16;
  constexpr int64_t kHeads = 4, kDimQK = 576, kDimV = 512, kPage = 16, kBlocks = 3, kLen = 37;
  std::vector<uint16_t> q(kHeads * kDimQK), cache(kBlocks * kPage * kDimQK), out(kHeads * kDimV);
  std::vector<float> lse(kHeads);
  uint32_t state = 12345;
  auto next = [&] {  // a small LCG: values in [-1, 1)
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) / 8388608.f - 1.f;
  };
  for (auto& x : q) x = to_bf16(next());
  for (auto& x : cache) x = to_bf16(next());
  std::vector<int32_t> table = {2, 0, 1};  // blocks of the one request, out of order
  std::vector<int32_t> seqlens = {kLen};

  DenseDecodeArgs a;
  a.q = TensorView::contiguous(q.data(), DType::kBF16, {1, 1, kHeads, kDimQK});
  a.k_cache = TensorView::contiguous(cache.data(), DType::kBF16, {kBlocks, kPage, 1, kDimQK});
  a.block_table = TensorView::contiguous(table.data(), DType::kInt32, {1, kBlocks});
  a.cache_seqlens = TensorView::contiguous(seqlens.data(), DType::kInt32, {1});
  a.out = TensorView::contiguous(out.data(), DType::kBF16, {1, 1, kHeads, kDimV});
  a.lse = TensorView::contiguous(lse.data(), DType::kFP32, {1, kHeads, 1});
  if (Status st = dense_decode(a); !st.ok()) {
    std::fprintf(stderr, "dense_decode failed: %s\n", st.message().c_str());
    return 1;
  }

  // Attention in double: key t is row t % 16 of block table[t / 16].
  const double scale = 1.0 / std::sqrt(static_cast<double>(kDimQK));
  double err = 0, norm = 0, lse_err = 0;
  for (int64_t h = 0; h < kHeads; ++h) {
    std::vector<double> s(kLen);
    double m = -INFINITY;
    for (int64_t t = 0; t < kLen; ++t) {
      const uint16_t* k = &cache[(table[t / kPage] * kPage + t % kPage) * kDimQK];
      double dot = 0;
      for (int64_t d = 0; d < kDimQK; ++d) dot += from_bf16(q[h * kDimQK + d]) * from_bf16(k[d]);
      s[t] = dot * scale;
      m = std::fmax(m, s[t]);
    }
    double sum = 0;
    for (double& x : s) sum += (x = std::exp(x - m));
    for (int64_t d = 0; d < kDimV; ++d) {
      double o = 0;
      for (int64_t t = 0; t < kLen; ++t) {
        o += s[t] * from_bf16(cache[(table[t / kPage] * kPage + t % kPage) * kDimQK + d]);
      }
      o /= sum;
      err += std::pow(from_bf16(out[h * kDimV + d]) - o, 2);
      norm += o * o;
    }
    lse_err = std::fmax(lse_err, std::fabs(lse[h] - (m + std::log(sum))));
  }
  const double rel = std::sqrt(err / norm);
  std::printf("OpenMLA %s: dense decode (CPU backend) relative error %.2e, lse error %.2e\n",
              OPENMLA_VERSION_STRING, rel, lse_err);
  if (!(rel < 1e-2 && lse_err < 1e-3)) return 1;

  a.block_table.dtype = DType::kInt64;
  const Status bad = dense_decode(a);
  std::printf("bad block_table dtype: %s\n", bad.message().c_str());
  return bad.code() == StatusCode::kInvalidArgument &&
                 bad.message().find("block_table") != std::string::npos
             ? 0
             : 1;
}
