// The fused norm-rope-attention-rope-cast operations on the CPU (docs/semantics.md, fused
// norm-rope-attention-rope-cast). The attention itself is the CPU sparse prefill / decode, fed
// fp32 queries and writing fp32 outputs; around it this file does what the fused operation adds:
// the q layout, the norm and both rotations, and the e4m3 cast with its packed UE8M0 scales.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/codec.h"
#include "cpu/attention_row.h"
#include "cpu/cpu_backend.h"
#include "cpu/fused_backend.h"

namespace openmla::cpu {
namespace {

constexpr int kQChunk = 16;    // permute_q_b_proj: 16-dim chunks interleaved across heads
constexpr int kOChunk = 32;    // permute_wv_proj: 32-dim chunks, one scale each
constexpr float kFp8Max = 448.f;
constexpr float kScaleAmaxMin = 1e-4f;
constexpr int kMaxRopeDim = 64;  // validation admits rope_dim 64 only

// Rotates the interleaved pairs of x[0 .. rope_dim) by cos_sin (cos in [0, rope_dim/2), sin
// after), or by its inverse. Each new value is one fused multiply-add over the other product
// rounded to float: x0' = fma(x0, c, -(x1 s)), x1' = fma(x0, s, x1 c), with s = -sin for the
// inverse.
void rotate_pairs(float* x, const float* cos_sin, int rope_dim, bool inverse) {
  const int half = rope_dim / 2;
  for (int i = 0; i < half; ++i) {
    const float c = cos_sin[i];
    const float s = inverse ? -cos_sin[half + i] : cos_sin[half + i];
    const float x0 = x[2 * i], x1 = x[2 * i + 1];
    x[2 * i] = std::fmaf(x0, c, -(x1 * s));
    x[2 * i + 1] = std::fmaf(x0, s, x1 * c);
  }
}

const float* cos_sin_row(const FusedNormRopeCast& f, int64_t s) {
  const int64_t pos = f.token_positions.data_as<const int32_t>()[s * f.token_positions.strides[0]];
  return f.cos_sin_cache.data_as<const float>() + pos * f.cos_sin_cache.strides[0];
}

// The attention's queries [s_q, h_q, d_qk] fp32, natural layout: q un-permuted, its last
// rope_dim dims rotated and rounded to bf16, all scaled by the head's norm factor r (1 without
// the norm). r multiplies the query rather than the logit: the same up to float rounding.
std::vector<float> prepare_queries(const FusedNormRopeCast& f, const TensorView& q,
                                   const core::FusedShape& shape) {
  const int64_t s_q = shape.s_q, h_q = shape.h_q;
  const int d_qk = static_cast<int>(shape.d_qk), rope = static_cast<int>(shape.rope_dim);
  const int chunks = d_qk / kQChunk;
  std::vector<float> out(static_cast<size_t>(s_q * h_q * d_qk));
#pragma omp parallel for schedule(static)
  for (int64_t s = 0; s < s_q; ++s) {
    std::vector<float> token(static_cast<size_t>(h_q * d_qk));
    load_floats(q, s * q.strides[0], static_cast<int>(h_q * d_qk), token.data());
    float cs[kMaxRopeDim];
    const float* row = cos_sin_row(f, s);
    for (int i = 0; i < rope; ++i) cs[i] = row[i * f.cos_sin_cache.strides[1]];
    for (int64_t h = 0; h < h_q; ++h) {
      float* x = out.data() + (s * h_q + h) * d_qk;
      // Permuted position of natural dim (h, c * 16 + j): c * (h_q * 16) + h * 16 + j.
      for (int c = 0; c < chunks; ++c) {
        std::memcpy(x + c * kQChunk, token.data() + (c * h_q + h) * kQChunk, kQChunk * sizeof(float));
      }
      float r = 1.f;
      if (f.enable_q_norm) {
        double sum = 0.0;
        for (int d = 0; d < d_qk; ++d) sum += static_cast<double>(x[d]) * x[d];
        r = 1.f / std::sqrt(static_cast<float>(sum) / static_cast<float>(d_qk) + f.rms_norm_eps);
      }
      rotate_pairs(x + d_qk - rope, cs, rope, /*inverse=*/false);
      for (int d = d_qk - rope; d < d_qk; ++d) x[d] = codec::bf16_to_float(codec::float_to_bf16(x[d]));
      if (f.enable_q_norm) {
        for (int d = 0; d < d_qk; ++d) x[d] *= r;
      }
    }
  }
  return out;
}

// The exponent e of the power-of-two scale 2^e of a chunk with largest |value| amax:
// e = ceil(log2(max(amax, 1e-4) / 448)), from the bits of the float quotient (exact).
int scale_exponent(float amax) {
  const float sf = std::max(amax, kScaleAmaxMin) / kFp8Max;
  uint32_t bits;
  std::memcpy(&bits, &sf, sizeof bits);
  return static_cast<int>((bits - 1) >> 23) + 1 - 127;
}

// Inverse RoPE of each output row, then the cast: out_fp8 and out_sf in the permute_wv_proj
// layout (docs/semantics.md).
void rope_and_cast(const FusedNormRopeCast& f, std::vector<float>& o, const core::FusedShape& shape,
                   const TensorView& out_fp8, const TensorView& out_sf) {
  const int64_t s_q = shape.s_q, h_q = shape.h_q, groups = shape.n_wv_group;
  const int64_t gsize = shape.wv_group_size;
  const int d_v = static_cast<int>(shape.d_v), rope = static_cast<int>(shape.rope_dim);
  const int chunks = d_v / kOChunk;
#pragma omp parallel for schedule(static)
  for (int64_t s = 0; s < s_q; ++s) {
    float cs[kMaxRopeDim];
    const float* row = cos_sin_row(f, s);
    for (int i = 0; i < rope; ++i) cs[i] = row[i * f.cos_sin_cache.strides[1]];
    for (int64_t h = 0; h < h_q; ++h) {
      rotate_pairs(o.data() + (s * h_q + h) * d_v + d_v - rope, cs, rope, /*inverse=*/true);
    }
    for (int64_t g = 0; g < groups; ++g) {
      uint8_t* dst = out_fp8.data_as<uint8_t>() + s * out_fp8.strides[0] + g * out_fp8.strides[1];
      for (int c = 0; c < chunks; ++c) {
        for (int64_t hg = 0; hg < gsize; ++hg) {
          const float* x = o.data() + (s * h_q + g * gsize + hg) * d_v + c * kOChunk;
          float amax = 0.f;
          for (int j = 0; j < kOChunk; ++j) amax = std::fmax(amax, std::fabs(x[j]));  // NaN skipped
          const int e = scale_exponent(amax);
          const float inv = std::ldexp(1.f, -e);
          const int64_t chunk = c * gsize + hg;  // position of (head hg, dims c*32..) in the group
          for (int j = 0; j < kOChunk; ++j) {
            // + 0: a zero is cast as +0 (the rotation can leave -0 in a lonely row).
            dst[(chunk * kOChunk + j) * out_fp8.strides[2]] = codec::float_to_e4m3(x[j] * inv + 0.f);
          }
          uint8_t* sf = reinterpret_cast<uint8_t*>(
              out_sf.data_as<int32_t>() + s * out_sf.strides[0] + g * out_sf.strides[1] +
              (chunk / 4) * out_sf.strides[2]);
          sf[chunk % 4] = static_cast<uint8_t>(e + 127);  // little-endian: chunk 4k in the low byte
        }
      }
    }
  }
}

TensorView fp32_view(std::vector<float>& v, std::initializer_list<int64_t> shape) {
  return TensorView::contiguous(v.data(), DType::kFP32, shape);
}

}  // namespace

Status fused_prefill(const FusedPrefillArgs& args, const core::FusedShape& shape) {
  if (shape.s_q == 0) return Status::Ok();
  std::vector<float> q = prepare_queries(args.fused, args.q, shape);
  std::vector<float> o(static_cast<size_t>(shape.s_q * shape.h_q * shape.d_v));
  SparsePrefillArgs a;
  a.q = fp32_view(q, {shape.s_q, shape.h_q, shape.d_qk});
  a.kv = args.kv;
  a.indices = args.indices;
  a.topk_length = args.topk_length;
  a.attn_sink = args.attn_sink;
  a.d_v = static_cast<int>(shape.d_v);
  a.softmax_scale = shape.softmax_scale;
  a.out = fp32_view(o, {shape.s_q, shape.h_q, shape.d_v});
  a.max_logits = args.max_logits;
  a.lse = args.lse;
  core::SparsePrefillShape ps{shape.s_q, shape.s_kv, shape.h_q, 1, shape.d_qk, shape.d_v,
                              shape.topk, shape.softmax_scale, shape.device};
  OPENMLA_RETURN_IF_ERROR(sparse_prefill(a, ps));
  rope_and_cast(args.fused, o, shape, args.out_fp8, args.out_sf);
  return Status::Ok();
}

Status fused_decode(const FusedDecodeArgs& args, const core::FusedShape& shape) {
  // FlashMLA's fused decode is batch 1 with per-token index rows and lengths: here each query
  // token is a request of one token (batch = s_q), so its lengths index by token.
  std::vector<float> q = prepare_queries(args.fused, args.q, shape);
  std::vector<float> o(static_cast<size_t>(shape.s_q * shape.h_q * shape.d_v));
  auto per_token = [](const TensorView& t) {  // [s_q, n] as [s_q, 1, n]
    TensorView v = t;
    v.rank = 3;
    v.shape[2] = t.shape[1];
    v.strides[2] = t.strides[1];
    v.shape[1] = 1;
    v.strides[1] = 0;
    return v;
  };
  SparseDecodeArgs a;
  a.q = fp32_view(q, {shape.s_q, 1, shape.h_q, shape.d_qk});
  a.k_cache = args.k_cache;
  a.indices = per_token(args.indices);
  a.topk_length = args.topk_length;
  if (args.extra_k_cache.defined()) {
    a.extra_k_cache = args.extra_k_cache;
    a.extra_indices = per_token(args.extra_indices);
    a.extra_topk_length = args.extra_topk_length;
  }
  a.attn_sink = args.attn_sink;
  a.d_v = static_cast<int>(shape.d_v);
  a.softmax_scale = shape.softmax_scale;
  a.out = fp32_view(o, {shape.s_q, 1, shape.h_q, shape.d_v});
  // lse [s_q, h_q] as decode's [batch, h_q, s_q = 1].
  a.lse = TensorView::strided(args.lse.data, DType::kFP32, {shape.s_q, shape.h_q, 1},
                              {args.lse.strides[0], args.lse.strides[1], 0});
  core::SparseDecodeShape ds{shape.s_q, 1, shape.h_q, shape.d_qk, shape.d_v,
                             shape.topk, shape.extra_topk, shape.softmax_scale, shape.device};
  OPENMLA_RETURN_IF_ERROR(sparse_decode(a, ds));
  rope_and_cast(args.fused, o, shape, args.out_fp8, args.out_sf);
  return Status::Ok();
}

}  // namespace openmla::cpu
