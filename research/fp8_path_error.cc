// The error an FP8 tensor-core path would add to sparse prefill from an FP8 cache, and keys staged
// as fp16 would add to sparse decode and prefill, measured before either is built
// (src/cuda/sm90/sparse_prefill/NOTES.md lever 3, sparse_decode/NOTES.md "keys staged as fp16"):
// the arithmetic of each path emulated on the CPU on the same data, each output against a
// double-precision reference over the same dequantised cache. No GPU is needed: the error is a
// property of the arithmetic.
//
//   openmla_fp8_path_error [--s_q 32] [--h_q 64] [--topk 2048] [--tokens 8192] [--seed 1]
//
// Paths (per query row; keys are the cache's dequantised values, exact in bf16):
//   bf16      what the kernels run today: S = q·K in fp32 from bf16 q, P = exp(S - max) rounded
//             to bf16, O = P·V in fp32, row sum of the unrounded P, out rounded to bf16
//   fp8       q's quantised dims rounded to e4m3 with one power-of-two scale a row (RoPE dims stay
//             bf16), S in fp32; P rounded to e4m3 after scaling by 2^8 (P <= 1: the row's exact
//             max), O = P·V in fp32; the V scales, powers of two, fold into P per group without
//             changing its relative rounding
//   fp8+acc   fp8 with Hopper's FP8 MMA accumulation modelled pessimistically: the running sum kept
//             to 13 mantissa bits (truncated) after every 32 products, then promoted to fp32 at
//             each quantisation group's end (the scale pass a group needs anyway)
//   fp8+v1s   fp8 with V re-quantised at fill time to one scale a key (the largest of its
//             groups), so P needs one quantisation instead of one a group
//   fp8q      only q in e4m3 (P in bf16): the share of the error that q's rounding causes
//   fp8 q2    fp8 with q as two e4m3 terms (q ~ hi + lo, each with its power-of-two scale): twice
//             the QK^T products (the bf16 path's tensor time for QK^T), P V still in e4m3
//   fp16      keys staged as fp16 instead of bf16 (sparse_decode/NOTES.md, "keys staged as fp16":
//             one cvt.f16x2.e4m3x2 a code pair where bf16 needs integer work), q and P in fp16 too,
//             fp16 MMAs with fp32 accumulation. fp16's range is kept by powers of two: q a row
//             scaled so its largest |value| is in [2^14, 2^15), each 64-key tile's keys (all of
//             their dims, RoPE included) likewise by the tile's own exponent, S and the tile's
//             P V contribution scaled back in fp32 (what O's online rescale would carry)
// The last column, for scale: exact attention over the dequantised cache against exact attention
// over the bf16 latents it was written from (the error the FP8 cache itself brings, either path),
// and the bf16 and fp8 paths' outputs against that latent reference (what a model sees in all).
//
// Data: kv latents N(0, 1) ("gaussian"), or with 8 channels 16x larger ("outliers", as real
// latents have); q N(0, q_std^2) with q_std in {0.25, 1, 4}: q_std is the standard deviation of
// the scaled scores, from flat (0.25, the benchmark's data) to sharp (4) attention.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/codec.h"
#include "openmla/kv_format.h"

namespace {

using namespace openmla;

struct Options {
  int s_q = 32, h_q = 64, topk = 2048, tokens = 8192;
  uint32_t seed = 1;
};

float bf16(float x) { return codec::bf16_to_float(codec::float_to_bf16(x)); }
float fp16(float x) { return codec::fp16_to_float(codec::float_to_fp16(x)); }

// The power of two that brings a largest |value| `amax` into [2^14, 2^15): fp16 then holds the
// values with its full precision and no overflow (1 for zero).
float fp16_range_scale(float amax) {
  if (!(amax > 0.f)) return 1.f;
  int e;
  std::frexp(amax, &e);  // amax in [2^(e-1), 2^e)
  return std::ldexp(1.f, 15 - e);
}
float e4m3(float x) { return codec::e4m3_to_float(codec::float_to_e4m3(x)); }

// x truncated to `bits` explicit mantissa bits (toward zero).
float truncate_mantissa(float x, int bits) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u &= ~((1u << (23 - bits)) - 1u);
  std::memcpy(&x, &u, 4);
  return x;
}

struct Format {
  KVFormat format;
  int d_qk;
  int quant_dims;  // dims stored as e4m3 (the rest, RoPE, bf16)
};

// One format's cache, dequantised: `tokens` rows of d_qk floats, and each token's largest group
// scale (for the one-scale-a-key variant).
struct Cache {
  std::vector<float> kv;
  std::vector<float> original;  // the bf16 latents before quantisation
  std::vector<float> max_scale;
  std::vector<float> group_scale;  // [token][group]
  int groups = 0, group_size = 0;
};

Cache make_cache(const Format& f, int tokens, bool outliers, std::mt19937& rng) {
  const KVLayout layout = default_kv_layout(f.format, 64, f.d_qk);
  const KVFormatInfo info = kv_format_info(f.format, f.d_qk);
  std::vector<uint8_t> block(static_cast<size_t>(layout.block_stride));
  std::normal_distribution<float> n01(0.f, 1.f);
  Cache c;
  c.group_size = info.group_size;
  c.groups = f.quant_dims / info.group_size;
  c.kv.resize(static_cast<size_t>(tokens) * f.d_qk);
  c.original.resize(static_cast<size_t>(tokens) * f.d_qk);
  c.max_scale.resize(tokens);
  c.group_scale.resize(static_cast<size_t>(tokens) * c.groups);
  std::vector<float> x(f.d_qk);
  for (int t = 0; t < tokens; ++t) {
    for (int d = 0; d < f.d_qk; ++d) {
      x[d] = bf16(n01(rng) * (outliers && d % 64 == 7 ? 16.f : 1.f));
    }
    std::copy(x.begin(), x.end(), c.original.begin() + static_cast<size_t>(t) * f.d_qk);
    codec::encode_token(layout, x.data(), block.data(), 0);
    codec::decode_token(layout, block.data(), 0, &c.kv[static_cast<size_t>(t) * f.d_qk]);
    float smax = 0.f;
    for (int g = 0; g < c.groups; ++g) {
      const float s = std::ldexp(1.f, codec::pow2_scale_exponent(
                                          codec::finite_amax(&x[g * c.group_size], c.group_size)));
      c.group_scale[static_cast<size_t>(t) * c.groups + g] = s;
      smax = std::max(smax, s);
    }
    c.max_scale[t] = smax;
  }
  return c;
}

enum Path { kBF16, kFP8, kFP8Acc, kFP8OneScale, kFP8QOnly, kFP8QTwo, kFP16, kNumPaths };

struct Errors {
  double num[kNumPaths] = {}, den = 0;       // Frobenius: sum (out - ref)^2, sum ref^2
  double cache_num = 0, den0 = 0;            // the exact attention over the original latents
  double num0[kNumPaths] = {};               // each path against that
  double max_abs[kNumPaths] = {}, ref_max = 0;
};

// Returns false when the bf16 path's emulation is not within bf16 rounding of the reference (a
// broken emulation or reference) or an error is NaN.
bool run(const Format& f, bool outliers, float q_std, const Options& o) {
  std::mt19937 rng(o.seed + static_cast<uint32_t>(f.d_qk) + (outliers ? 100 : 0));
  const Cache cache = make_cache(f, o.tokens, outliers, rng);
  const int D = f.d_qk, DV = 512;
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  // The one-scale-a-key V: each token's values re-quantised to e4m3 against its largest scale.
  std::vector<float> v1s(static_cast<size_t>(o.tokens) * DV);
  for (int t = 0; t < o.tokens; ++t) {
    for (int d = 0; d < DV; ++d) {
      const float v = cache.kv[static_cast<size_t>(t) * D + d];
      v1s[static_cast<size_t>(t) * DV + d] =
          d < f.quant_dims ? e4m3(v / cache.max_scale[t]) * cache.max_scale[t] : v;
    }
  }
  std::normal_distribution<float> nq(0.f, q_std);
  const int rows = o.s_q * o.h_q;
  std::vector<float> q(static_cast<size_t>(rows) * D);
  for (float& v : q) v = bf16(nq(rng));  // q_std of q·k·scale over N(0, 1) keys
  std::vector<int> idx(static_cast<size_t>(o.s_q) * o.topk);
  for (int s = 0; s < o.s_q; ++s) {
    std::vector<int> perm(o.tokens);
    for (int t = 0; t < o.tokens; ++t) perm[t] = t;
    std::shuffle(perm.begin(), perm.end(), rng);
    std::copy(perm.begin(), perm.begin() + o.topk, idx.begin() + static_cast<size_t>(s) * o.topk);
  }
  Errors e;
#pragma omp parallel
  {
    Errors local;
    std::vector<double> s_ref(o.topk), p_ref(o.topk), o_ref(DV), o0(DV);
    std::vector<float> s_bf(o.topk), s_8(o.topk), s_8acc(o.topk), s_q2(o.topk), s_16(o.topk), qq(D),
        q2(D), q16(D), out(DV), tile_up((o.topk + 63) / 64), k16(static_cast<size_t>(64) * D);
#pragma omp for schedule(dynamic, 4)
    for (int r = 0; r < rows; ++r) {
      const int s = r / o.h_q;
      const float* qr = &q[static_cast<size_t>(r) * D];
      const int* keys = &idx[static_cast<size_t>(s) * o.topk];
      // q's quantised dims in e4m3, one power-of-two scale a row.
      const float qscale =
          std::ldexp(1.f, codec::pow2_scale_exponent(codec::finite_amax(qr, f.quant_dims)));
      for (int d = 0; d < D; ++d) qq[d] = d < f.quant_dims ? e4m3(qr[d] / qscale) * qscale : qr[d];
      {  // q as hi + lo: the residual in e4m3 with a scale of its own
        float res_amax = 0.f;
        for (int d = 0; d < f.quant_dims; ++d) res_amax = std::max(res_amax, std::fabs(qr[d] - qq[d]));
        const float rscale = std::ldexp(1.f, codec::pow2_scale_exponent(res_amax));
        for (int d = 0; d < D; ++d) {
          q2[d] = d < f.quant_dims ? qq[d] + e4m3((qr[d] - qq[d]) / rscale) * rscale : qr[d];
        }
      }
      // fp16: q scaled into fp16's range as a whole row.
      float q_amax = 0.f;
      for (int d = 0; d < D; ++d) q_amax = std::max(q_amax, std::fabs(qr[d]));
      const float q_up = fp16_range_scale(q_amax);
      for (int d = 0; d < D; ++d) q16[d] = fp16(qr[d] * q_up);
      for (int j0 = 0; j0 < o.topk; j0 += 64) {  // a tile's keys by the tile's own exponent
        const int n = std::min(64, o.topk - j0);
        float k_amax = 0.f;
        for (int j = j0; j < j0 + n; ++j) {
          const float* k = &cache.kv[static_cast<size_t>(keys[j]) * D];
          for (int d = 0; d < D; ++d) k_amax = std::max(k_amax, std::fabs(k[d]));
        }
        const float k_up = fp16_range_scale(k_amax);
        tile_up[j0 / 64] = k_up;
        for (int j = j0; j < j0 + n; ++j) {
          const float* k = &cache.kv[static_cast<size_t>(keys[j]) * D];
          float* k16j = &k16[static_cast<size_t>(j - j0) * D];
          for (int d = 0; d < D; ++d) k16j[d] = fp16(k[d] * k_up);
          float acc = 0.f;
          for (int d = 0; d < D; ++d) acc += q16[d] * k16j[d];
          s_16[j] = acc / (q_up * k_up) * scale;  // (powers of two: exact)
        }
      }
      for (int j = 0; j < o.topk; ++j) {
        const float* k = &cache.kv[static_cast<size_t>(keys[j]) * D];
        double ref = 0;
        float acc_bf = 0.f, acc_8 = 0.f, acc_8acc = 0.f, acc_q2 = 0.f;
        for (int d = 0; d < D; ++d) {
          ref += static_cast<double>(qr[d]) * k[d];
          acc_bf += qr[d] * k[d];
          acc_8 += qq[d] * k[d];
          acc_q2 += q2[d] * k[d];
        }
        // The limited accumulator: chunks of 32 products, each group's sum promoted at its end.
        for (int g0 = 0; g0 < f.quant_dims; g0 += cache.group_size) {
          float group = 0.f;
          for (int c0 = g0; c0 < g0 + cache.group_size; c0 += 32) {
            for (int d = c0; d < std::min(c0 + 32, g0 + cache.group_size); ++d) group += qq[d] * k[d];
            group = truncate_mantissa(group, 13);
          }
          acc_8acc += group;
        }
        for (int d = f.quant_dims; d < D; ++d) acc_8acc += qq[d] * k[d];  // RoPE: bf16 MMA
        s_ref[j] = ref * scale;
        s_bf[j] = acc_bf * scale;
        s_8[j] = acc_8 * scale;
        s_8acc[j] = acc_8acc * scale;
        s_q2[j] = acc_q2 * scale;
      }
      double m = -INFINITY, l = 0;
      for (int j = 0; j < o.topk; ++j) m = std::max(m, s_ref[j]);
      for (int j = 0; j < o.topk; ++j) l += (p_ref[j] = std::exp(s_ref[j] - m));
      std::fill(o_ref.begin(), o_ref.end(), 0.0);
      for (int j = 0; j < o.topk; ++j) {
        const float* v = &cache.kv[static_cast<size_t>(keys[j]) * D];
        for (int d = 0; d < DV; ++d) o_ref[d] += p_ref[j] * v[d];
      }
      for (int d = 0; d < DV; ++d) {
        o_ref[d] /= l;
        local.den += o_ref[d] * o_ref[d];
        local.ref_max = std::max(local.ref_max, std::fabs(o_ref[d]));
      }
      {  // The same exact attention over the latents before quantisation: the cache's own error.
        double m0 = -INFINITY, l0 = 0;
        for (int j = 0; j < o.topk; ++j) {
          const float* k = &cache.original[static_cast<size_t>(keys[j]) * D];
          double acc = 0;
          for (int d = 0; d < D; ++d) acc += static_cast<double>(qr[d]) * k[d];
          p_ref[j] = acc * scale;
          m0 = std::max(m0, p_ref[j]);
        }
        std::fill(o0.begin(), o0.end(), 0.0);
        for (int j = 0; j < o.topk; ++j) {
          const double p = std::exp(p_ref[j] - m0);
          l0 += p;
          const float* v = &cache.original[static_cast<size_t>(keys[j]) * D];
          for (int d = 0; d < DV; ++d) o0[d] += p * v[d];
        }
        for (int d = 0; d < DV; ++d) {
          o0[d] /= l0;
          const double diff = o0[d] - o_ref[d];
          local.cache_num += diff * diff;
          local.den0 += o0[d] * o0[d];
        }
      }
      for (int path = 0; path < kNumPaths; ++path) {
        const std::vector<float>& sc = path == kBF16     ? s_bf
                                       : path == kFP8Acc  ? s_8acc
                                       : path == kFP8QTwo ? s_q2
                                       : path == kFP16    ? s_16
                                                          : s_8;
        float mx = -INFINITY;
        for (int j = 0; j < o.topk; ++j) mx = std::max(mx, sc[j]);
        std::fill(out.begin(), out.end(), 0.f);
        float sum = 0.f;
        if (path == kFP16) {
          // Each tile's P V in fp16 over its staged keys, fp32 accumulation, scaled back by the
          // tile's exponent into O.
          for (int j0 = 0; j0 < o.topk; j0 += 64) {
            const int n = std::min(64, o.topk - j0);
            const float k_up = tile_up[j0 / 64];
            std::vector<float> part(DV, 0.f);
            for (int j = j0; j < j0 + n; ++j) {
              const float p = std::exp(sc[j] - mx);
              sum += p;
              const float pq = fp16(p);
              const float* k = &cache.kv[static_cast<size_t>(keys[j]) * D];
              for (int d = 0; d < DV; ++d) part[d] += pq * fp16(k[d] * k_up);
            }
            for (int d = 0; d < DV; ++d) out[d] += part[d] / k_up;
          }
        }
        for (int j = 0; j < o.topk && path != kFP16; ++j) {
          const float p = std::exp(sc[j] - mx);
          sum += p;
          const bool p8 = path != kBF16 && path != kFP8QOnly;
          const float pq = p8 ? e4m3(p * 256.f) / 256.f : bf16(p);
          const float* v = path == kFP8OneScale ? &v1s[static_cast<size_t>(keys[j]) * DV]
                                                : &cache.kv[static_cast<size_t>(keys[j]) * D];
          for (int d = 0; d < DV; ++d) out[d] += pq * v[d];
        }
        for (int d = 0; d < DV; ++d) {
          const double result = bf16(out[d] / sum);
          const double diff = result - o_ref[d];
          local.num[path] += diff * diff;
          local.num0[path] += (result - o0[d]) * (result - o0[d]);
          local.max_abs[path] = std::max(local.max_abs[path], std::fabs(diff));
        }
      }
    }
#pragma omp critical
    {
      for (int p = 0; p < kNumPaths; ++p) {
        e.num[p] += local.num[p];
        e.max_abs[p] = std::max(e.max_abs[p], local.max_abs[p]);
        e.num0[p] += local.num0[p];
      }
      e.cache_num += local.cache_num;
      e.den0 += local.den0;
      e.den += local.den;
      e.ref_max = std::max(e.ref_max, local.ref_max);
    }
  }
  std::printf("| %s | %s | %.2f |", kv_format_name(f.format), outliers ? "outliers" : "gaussian",
              q_std);
  const double base = std::sqrt(e.num[kBF16] / e.den);
  for (int p = 0; p < kNumPaths; ++p) {
    const double rel = std::sqrt(e.num[p] / e.den);
    if (p == kBF16) {
      std::printf(" %.2e |", rel);
    } else {
      std::printf(" %.2e (%.1fx) |", rel, rel / base);
    }
  }
  const double bf0 = std::sqrt(e.num0[kBF16] / e.den0), f80 = std::sqrt(e.num0[kFP8] / e.den0);
  std::printf(" %.2e / %.2e | %.2e | %.2e / %.2e (%.2fx) |\n", e.max_abs[kBF16] / e.ref_max,
              e.max_abs[kFP8] / e.ref_max, std::sqrt(e.cache_num / e.den), bf0, f80, f80 / bf0);
  std::fflush(stdout);
  return base < 1e-2 && std::isfinite(std::sqrt(e.num[kFP8] / e.den)) &&
         std::isfinite(std::sqrt(e.num[kFP16] / e.den));
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (a == "--s_q") o.s_q = v;
    else if (a == "--h_q") o.h_q = v;
    else if (a == "--topk") o.topk = v;
    else if (a == "--tokens") o.tokens = v;
    else if (a == "--seed") o.seed = static_cast<uint32_t>(v);
    else {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (o.s_q < 1 || o.h_q < 1 || o.topk < 1 || o.tokens < o.topk) {
    std::fprintf(stderr, "need s_q, h_q, topk >= 1 and tokens >= topk\n");
    return 2;
  }
  std::printf("The FP8 tensor-core path and the fp16-staged path vs the bf16 path, sparse attention "
              "over an FP8 cache: relative "
              "Frobenius error of out against a double-precision reference on the same dequantised "
              "cache (s_q %d, h_q %d, topk %d of %d tokens, seed %u); (Nx) = that path's error / "
              "the bf16 path's\n\n",
              o.s_q, o.h_q, o.topk, o.tokens, o.seed);
  std::printf("| cache | kv | q_std | bf16 | fp8 | fp8+acc | fp8+v1s | fp8q | fp8 q2 | fp16 | max abs err / max |ref| "
              "(bf16 / fp8) | the cache's own error | against the latents: bf16 / fp8 |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  const Format formats[] = {{KVFormat::kFP8_V32, 576, 512},
                            {KVFormat::kFP8_Model1, 512, 448},
                            {KVFormat::kFP8_MX, 512, 512}};
  bool ok = true;
  for (const Format& f : formats) {
    for (bool outliers : {false, true}) {
      for (float q_std : {0.25f, 1.f, 4.f}) ok = run(f, outliers, q_std, o) && ok;
    }
  }
  if (!ok) std::fprintf(stderr, "a bf16 path's error was not within bf16 rounding, or NaN\n");
  return ok ? 0 : 1;
}
