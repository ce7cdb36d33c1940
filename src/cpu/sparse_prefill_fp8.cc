// Sparse prefill from a paged cache on the FP8 tensor-core path (SparsePrefillArgs::
// fp8_tensor_cores; docs/semantics.md, sparse prefill): the GPU kernel's roundings exactly as
// defined there (q, each key and P rounded to e4m3 under power-of-two scales, K's RoPE part to
// bf16), with fp32 dot products and accumulators and a double exp-sum. A work unit is (query
// token, chunk of heads), as in sparse_prefill.cc: its keys are dequantised and re-quantised
// once for all of its rows. A row keeps its logits until it has seen every key, so that P is
// rounded against the row's final exponent base M (the GPU's running M, which grows by exact
// powers of two, gives the same P except in e4m3's subnormal range).
#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "core/codec.h"
#include "core/fp8_row_scale.h"
#include "cpu/attention_row.h"
#include "cpu/cpu_backend.h"

namespace openmla::cpu {
namespace {

constexpr int kV = 512;       // V's dims: the first 512 of a key
constexpr int kRope = 64;     // K's RoPE part: the last 64 dims, kept in bf16
constexpr int kPShift = 8;    // P is rounded as 2^8 · p (<= 256), out divides by 2^8 again
constexpr double kLog2e = 1.4426950408889634;  // log2(e)
constexpr double kLn2 = 0.69314718055994531;   // ln(2)

// The largest |x[i]|, i < n, NaN skipped and ±inf kept (as the kernels' fmaxf reduction).
float amax(const float* x, int n) {
  float a = 0.f;
  for (int i = 0; i < n; ++i) a = std::fmax(a, std::fabs(x[i]));
  return a;
}

float round_e4m3(float x) { return codec::e4m3_to_float(codec::float_to_e4m3(x)); }
float round_bf16(float x) { return codec::bf16_to_float(codec::float_to_bf16(x)); }

// Entries [0, count) of the token's index row that name a slot of the cache, in order
// (a duplicate counts each time).
std::vector<int64_t> named_slots(const SparsePrefillArgs& args, int64_t s, int64_t topk) {
  const TensorView& idx = args.indices;
  int64_t count = topk;
  if (args.topk_length.defined()) {
    count = std::clamp<int64_t>(
        args.topk_length.data_as<const int32_t>()[s * args.topk_length.strides[0]], 0, topk);
  }
  const int64_t num_slots = args.kv_cache.num_tokens();
  const int32_t* row = idx.data_as<const int32_t>() + s * idx.strides[0];
  std::vector<int64_t> slots;
  slots.reserve(count);
  for (int64_t e = 0; e < count; ++e) {
    const int64_t slot = row[e * idx.strides[2]];
    if (slot >= 0 && slot < num_slots) slots.push_back(slot);
  }
  return slots;
}

}  // namespace

Status sparse_prefill_fp8(const SparsePrefillArgs& args, const core::SparsePrefillShape& shape) {
  const TensorView& q = args.q;
  const int64_t s_q = shape.s_q, h_q = shape.h_q;
  const int d_qk = static_cast<int>(shape.d_qk), d_nope = d_qk - kRope;
  const int chunk = row_chunk(h_q, s_q);
  const int64_t chunks = (h_q + chunk - 1) / chunk;
  const int64_t units = s_q * chunks;
  // e4m3 codes back to float in the tile loops without a call each.
  std::array<float, 256> e4m3{};
  for (int b = 0; b < 256; ++b) e4m3[b] = codec::e4m3_to_float(static_cast<uint8_t>(b));

#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t unit = 0; unit < units; ++unit) {
    const int64_t s = unit / chunks;
    const int64_t h0 = unit % chunks * chunk;
    const int rows = static_cast<int>(std::min<int64_t>(chunk, h_q - h0));
    const int padded_rows = (rows + kRowBlock - 1) / kRowBlock * kRowBlock;

    // Keys: the slot dequantised, then scaled by 2^-e_k (e_k from its first 512 dims) into e4m3
    // codes c_k (V, and K's first d_nope dims) and the bf16 RoPE part r_k (its last 64 dims).
    const std::vector<int64_t> slots = named_slots(args, s, shape.topk);
    const int64_t n = static_cast<int64_t>(slots.size());
    std::vector<uint8_t> codes(n * kV);
    std::vector<float> rope(n * kRope), key_scale(n);
    std::vector<int> key_exp(n);
    std::vector<float> x(d_qk);
    for (int64_t k = 0; k < n; ++k) {
      codec::decode_slot(args.kv_cache, slots[k], x.data());
      key_exp[k] = core::fp8_row_exponent(amax(x.data(), kV));
      key_scale[k] = std::ldexp(1.f, key_exp[k]);
      for (int d = 0; d < kV; ++d) codes[k * kV + d] = codec::float_to_e4m3(x[d] / key_scale[k]);
      for (int j = 0; j < kRope; ++j) {
        rope[k * kRope + j] = round_bf16(x[d_nope + j] / key_scale[k]);
      }
    }

    // Query rows: scaled by 2^-e_q (e_q from the first d_nope dims), e4m3 then bf16 RoPE.
    std::vector<float> qq(static_cast<size_t>(padded_rows) * d_qk, 0.f), row_scale(rows);
    for (int r = 0; r < rows; ++r) {
      float* qr = qq.data() + static_cast<int64_t>(r) * d_qk;
      bf16_to_float(q.data_as<const uint16_t>() + s * q.strides[0] + (h0 + r) * q.strides[1], 1,
                    d_qk, qr);
      const float sigma = std::ldexp(1.f, core::fp8_row_exponent(amax(qr, d_nope)));
      for (int d = 0; d < d_nope; ++d) qr[d] = round_e4m3(qr[d] / sigma);
      for (int d = d_nope; d < d_qk; ++d) qr[d] = round_bf16(qr[d] / sigma);
      row_scale[r] = shape.softmax_scale * sigma;
    }

    // Logits x = softmax_scale · σ · s_k · (qc · c_k + qr · r_k), a tile of keys at a time.
    std::vector<float> logits(static_cast<size_t>(rows) * n);
    std::vector<float> tile(static_cast<size_t>(kKeyTile) * std::max(d_qk, kV));
    std::vector<float> scores(static_cast<size_t>(padded_rows) * kKeyTile);
    for (int64_t t0 = 0; t0 < n; t0 += kKeyTile) {
      const int nt = static_cast<int>(std::min<int64_t>(kKeyTile, n - t0));
      for (int t = 0; t < nt; ++t) {
        float* key = tile.data() + static_cast<int64_t>(t) * d_qk;
        const uint8_t* c = codes.data() + (t0 + t) * kV;
        for (int d = 0; d < d_nope; ++d) key[d] = e4m3[c[d]];
        std::copy_n(rope.data() + (t0 + t) * kRope, kRope, key + d_nope);
      }
      tile_scores(qq.data(), padded_rows, tile.data(), nt, d_qk, scores.data());
      for (int r = 0; r < rows; ++r) {
        for (int t = 0; t < nt; ++t) {
          logits[r * n + t0 + t] = row_scale[r] * key_scale[t0 + t] * scores[r * kKeyTile + t];
        }
      }
    }

    // Softmax in base 2 with an integer base M = ceil(max_k y_k), y_k = x_k·log2(e) + e_k:
    // p_k = e4m3(2^(y_k - M + 8)) carries V's scale 2^e_k; l sums the unrounded 2^(x_k·log2 e - M).
    // (M stays a double: inf/NaN logits of absurd inputs must not become an integer.)
    std::vector<float> p(static_cast<size_t>(rows) * n), max_logit(rows, -kInf);
    std::vector<double> base(rows), sum(rows, 0.0);
    for (int r = 0; r < rows; ++r) {
      const float* xr = logits.data() + r * n;
      double y_max = -kInf;
      for (int64_t k = 0; k < n; ++k) {
        if (xr[k] > max_logit[r]) max_logit[r] = xr[k];  // NaN skipped, as in the bf16 path
        const double y = xr[k] * kLog2e + key_exp[k];
        if (y > y_max) y_max = y;
      }
      const double m = std::ceil(y_max);
      base[r] = m;
      for (int64_t k = 0; k < n; ++k) {
        const double y = xr[k] * kLog2e;
        sum[r] += std::exp2(y - m);
        p[r * n + k] = round_e4m3(static_cast<float>(std::exp2(y + key_exp[k] - m + kPShift)));
      }
    }

    // O = Σ_k p_k · c_k (fp32), a tile of values at a time.
    std::vector<float> acc(static_cast<size_t>(rows) * kV, 0.f);
    for (int64_t t0 = 0; t0 < n; t0 += kKeyTile) {
      const int nt = static_cast<int>(std::min<int64_t>(kKeyTile, n - t0));
      for (int t = 0; t < nt; ++t) {
        const uint8_t* c = codes.data() + (t0 + t) * kV;
        float* v = tile.data() + static_cast<int64_t>(t) * kV;
        for (int d = 0; d < kV; ++d) v[d] = e4m3[c[d]];
      }
      for (int r = 0; r < rows; ++r) {
        tile_accumulate(p.data() + r * n + t0, tile.data(), nt, kV, kV, acc.data() + r * kV);
      }
    }

    std::vector<float> o(kV);
    for (int r = 0; r < rows; ++r) {
      const int64_t h = h0 + r;
      float lse = kInf, ml = -kInf;  // a lonely row: out 0, lse +inf, max_logits -inf
      std::fill(o.begin(), o.end(), 0.f);
      if (n > 0) {
        const double denom = std::ldexp(sum[r], kPShift);
        for (int d = 0; d < kV; ++d) o[d] = static_cast<float>(acc[r * kV + d] / denom);
        lse = static_cast<float>(std::log(sum[r]) + base[r] * kLn2);
        ml = max_logit[r];
      }
      store_prefill_row(args, s, h, o.data(), kV, lse, ml);
    }
  }
  return Status::Ok();
}

}  // namespace openmla::cpu
