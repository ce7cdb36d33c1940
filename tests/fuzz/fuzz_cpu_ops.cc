// libFuzzer target: the CPU backend's operations end to end on small random problems, every
// buffer allocated to exactly the bytes its view spans, so ASan reports any read or write past
// it. Caches take any format with the default or token-interleaved layout, one field nudged
// (the operations validate it and must reject whatever would reach outside a block); indices,
// slots, lengths, block tables and lse values are drawn from ranges that include the invalid
// ones (negative, past the end, int32 extremes, inf/NaN), which are semantics, not errors.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "fuzz/fuzz_input.h"
#include "openmla/kv_convert.h"
#include "openmla/openmla.h"

namespace openmla::fuzz {
namespace {

// Owns a byte buffer of exactly the requested size (no slack for an overrun to hide in).
struct Buffer {
  std::vector<uint8_t> bytes;
  void* fill(size_t n, Bulk& bulk) {
    bytes.assign(n, 0);
    bytes.shrink_to_fit();
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(bulk.next());
    return n ? bytes.data() : nullptr;
  }
};

// Finite bf16 values of moderate size (exponents below 2^16), random sign.
void fill_bf16(std::vector<uint16_t>& v, Bulk& bulk) {
  for (uint16_t& x : v) x = static_cast<uint16_t>(bulk.next()) & 0xbfff;
}

// Ints in [-2, range + 2), or (mode 0) anything an int32 holds.
std::vector<int32_t> any_ints(Input& in, Bulk& bulk, size_t n, int64_t range) {
  std::vector<int32_t> v(n);
  const bool wild = in.below(4) == 0;
  for (int32_t& x : v) {
    const uint64_t z = bulk.next();
    x = wild ? static_cast<int32_t>(z) : static_cast<int32_t>(z % (range + 4)) - 2;
  }
  return v;
}

struct Cache {
  Buffer buffer;
  KVCache cache;
  // A cache of d_qk-dim tokens (formats of other dims are rejected by the operation).
  void make(Input& in, Bulk& bulk, int d_qk) {
    const auto format = static_cast<KVFormat>(in.below(6));
    const int page_size = 1 + in.below(70);
    KVLayout layout = in.flag() ? default_kv_layout(format, page_size, d_qk)
                                : interleaved_kv_layout(format, page_size, d_qk);
    int64_t* fields[] = {&layout.block_stride, &layout.data_offset, &layout.data_stride,
                         &layout.scale_offset, &layout.scale_stride, &layout.rope_offset,
                         &layout.rope_stride};
    if (in.flag()) *fields[in.below(7)] += in.take<int8_t>();
    const int64_t num_blocks = in.below(4);
    const int64_t bytes = layout.block_stride > 0 && layout.block_stride < (1 << 20)
                              ? num_blocks * layout.block_stride
                              : 0;
    cache = KVCache{buffer.fill(static_cast<size_t>(bytes), bulk), layout, bytes ? num_blocks : 0,
                    Device::cpu()};
  }
};

int fuzz_d_qk(Input& in) { return in.flag() ? 576 : 512; }

void write_and_gather(Input& in, Bulk& bulk) {
  const int d_qk = fuzz_d_qk(in);
  Cache c;
  c.make(in, bulk, d_qk);
  const int64_t n = in.below(9);
  std::vector<uint16_t> rows(n * d_qk);
  fill_bf16(rows, bulk);
  std::vector<int32_t> slots = any_ints(in, bulk, n, c.cache.num_tokens());
  KVCacheWriteArgs w;
  w.kv = TensorView::contiguous(rows.data(), DType::kBF16, {n, d_qk});
  w.slot_mapping = TensorView::contiguous(slots.data(), DType::kInt32, {n});
  w.cache = c.cache;
  (void)kv_cache_write(w);
  std::vector<float> out(n * d_qk);
  KVCacheGatherArgs g;
  g.cache = c.cache;
  g.slots = w.slot_mapping;
  g.out = TensorView::contiguous(out.data(), DType::kFP32, {n, d_qk});
  (void)kv_cache_gather(g);
  // ... and into a second cache of another format.
  Cache dst;
  dst.make(in, bulk, d_qk);
  KVCacheConvertArgs convert;
  convert.src = c.cache;
  convert.dst = dst.cache;
  std::vector<int32_t> src_blocks, dst_blocks;
  if (in.flag()) {
    const int64_t pairs = in.below(5);
    src_blocks = any_ints(in, bulk, pairs, c.cache.num_blocks);
    dst_blocks = any_ints(in, bulk, pairs, dst.cache.num_blocks);
    convert.src_blocks = TensorView::contiguous(src_blocks.data(), DType::kInt32, {pairs});
    convert.dst_blocks = TensorView::contiguous(dst_blocks.data(), DType::kInt32, {pairs});
  }
  (void)kv_cache_convert(convert);
}

void sparse_decode_case(Input& in, Bulk& bulk) {
  const int d_qk = fuzz_d_qk(in);
  Cache main, extra;
  main.make(in, bulk, d_qk);
  const int64_t b = 1 + in.below(2), s_q = 1 + in.below(2), h_q = 1 + in.below(4);
  const int64_t topk = in.below(9);
  std::vector<uint16_t> q(b * s_q * h_q * d_qk), out(b * s_q * h_q * 512);
  fill_bf16(q, bulk);
  std::vector<int32_t> indices = any_ints(in, bulk, b * s_q * topk, main.cache.num_tokens());
  std::vector<int32_t> topk_length = any_ints(in, bulk, b, topk);
  std::vector<float> sink(h_q), lse(b * h_q * s_q);
  const float specials[] = {std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), std::nanf(""), 0.f};
  for (float& x : sink) x = in.below(3) == 0 ? specials[in.below(4)] : in.take<int8_t>() / 8.f;
  SparseDecodeArgs a;
  a.q = TensorView::contiguous(q.data(), DType::kBF16, {b, s_q, h_q, d_qk});
  a.k_cache = main.cache;
  a.indices = TensorView::contiguous(indices.data(), DType::kInt32, {b, s_q, topk});
  if (in.flag()) a.topk_length = TensorView::contiguous(topk_length.data(), DType::kInt32, {b});
  if (in.flag()) a.attn_sink = TensorView::contiguous(sink.data(), DType::kFP32, {h_q});
  std::vector<int32_t> extra_indices, extra_length;
  if (in.flag()) {
    extra.make(in, bulk, d_qk);
    const int64_t extra_topk = in.below(9);
    extra_indices = any_ints(in, bulk, b * s_q * extra_topk, extra.cache.num_tokens());
    extra_length = any_ints(in, bulk, b, extra_topk);
    a.extra_k_cache = extra.cache;
    a.extra_indices =
        TensorView::contiguous(extra_indices.data(), DType::kInt32, {b, s_q, extra_topk});
    if (in.flag()) {
      a.extra_topk_length = TensorView::contiguous(extra_length.data(), DType::kInt32, {b});
    }
  }
  a.out = TensorView::contiguous(out.data(), DType::kBF16, {b, s_q, h_q, 512});
  a.lse = TensorView::contiguous(lse.data(), DType::kFP32, {b, h_q, s_q});
  (void)sparse_decode(a);
}

// Dense decode with every view strided (padding between rows, blocks and requests).
void dense_decode_case(Input& in, Bulk& bulk) {
  const int64_t d_qk = fuzz_d_qk(in), d_v = 512;
  const int64_t b = 1 + in.below(3), s_q = 1 + in.below(3), h_kv = 1 + in.below(2);
  const int64_t h_q = h_kv * (1 + in.below(3));
  const int64_t page = 1 + in.below(40), num_blocks = in.below(6), max_blocks = 1 + in.below(3);
  const int64_t pad = in.below(3);  // extra elements after each row of every view
  Buffer q_buf, k_buf, out_buf, lse_buf;
  const int64_t q_row = d_qk + pad, out_row = d_v + pad, k_row = d_qk + pad;
  auto* q = q_buf.fill(2 * (b * s_q * h_q * q_row), bulk);
  auto* k = k_buf.fill(2 * (num_blocks * page * h_kv * k_row), bulk);
  for (size_t i = 1; i < k_buf.bytes.size(); i += 2) k_buf.bytes[i] &= 0xbf;  // finite bf16
  for (size_t i = 1; i < q_buf.bytes.size(); i += 2) q_buf.bytes[i] &= 0xbf;
  auto* out = out_buf.fill(2 * (b * s_q * h_q * out_row), bulk);
  auto* lse = lse_buf.fill(4 * (b * h_q * s_q), bulk);
  std::vector<int32_t> table = any_ints(in, bulk, b * max_blocks, num_blocks);
  std::vector<int32_t> seqlens = any_ints(in, bulk, b, max_blocks * page);
  DenseDecodeArgs a;
  const DType dtype = in.flag() ? DType::kBF16 : DType::kFP16;
  a.q = TensorView::strided(q, dtype, {b, s_q, h_q, d_qk},
                            {s_q * h_q * q_row, h_q * q_row, q_row, 1});
  a.k_cache = TensorView::strided(k, dtype, {num_blocks, page, h_kv, d_qk},
                                  {page * h_kv * k_row, h_kv * k_row, k_row, 1});
  a.block_table = TensorView::contiguous(table.data(), DType::kInt32, {b, max_blocks});
  a.cache_seqlens = TensorView::contiguous(seqlens.data(), DType::kInt32, {b});
  a.causal = in.flag();
  a.out = TensorView::strided(out, dtype, {b, s_q, h_q, d_v},
                              {s_q * h_q * out_row, h_q * out_row, out_row, 1});
  a.lse = TensorView::contiguous(lse, DType::kFP32, {b, h_q, s_q});
  (void)dense_decode(a);
}

void merge_and_prefill(Input& in, Bulk& bulk) {
  const int64_t parts = 1 + in.below(4), tokens = in.below(3), heads = 1 + in.below(3), d_v = 512;
  std::vector<float> part_out(parts * tokens * heads * d_v), part_lse(parts * tokens * heads);
  std::vector<float> out(tokens * heads * d_v), lse(tokens * heads);
  for (float& x : part_out) x = static_cast<float>(static_cast<int16_t>(bulk.next())) / 1024.f;
  const float specials[] = {std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), std::nanf(""), 80.f, -80.f};
  for (float& x : part_lse) x = in.below(3) == 0 ? specials[in.below(5)] : in.take<int8_t>() / 4.f;
  MergeStatesArgs m;
  m.part_out = TensorView::contiguous(part_out.data(), DType::kFP32, {parts, tokens, heads, d_v});
  m.part_lse = TensorView::contiguous(part_lse.data(), DType::kFP32, {parts, tokens, heads});
  m.out = TensorView::contiguous(out.data(), DType::kFP32, {tokens, heads, d_v});
  m.lse = TensorView::contiguous(lse.data(), DType::kFP32, {tokens, heads});
  (void)merge_attention_states(m);

  const int64_t d_qk = fuzz_d_qk(in), s_q = 1 + in.below(3), s_kv = in.below(20);
  const int64_t h_kv = 1, h_q = 1 + in.below(4), topk = in.below(9);
  std::vector<uint16_t> q(s_q * h_q * d_qk), kv(s_kv * h_kv * d_qk), o(s_q * h_q * d_v);
  fill_bf16(q, bulk);
  fill_bf16(kv, bulk);
  std::vector<int32_t> indices = any_ints(in, bulk, s_q * h_kv * topk, s_kv);
  std::vector<int32_t> topk_length = any_ints(in, bulk, s_q, topk);
  std::vector<float> max_logits(s_q * h_q), prefill_lse(s_q * h_q);
  SparsePrefillArgs p;
  p.q = TensorView::contiguous(q.data(), DType::kBF16, {s_q, h_q, d_qk});
  p.kv = TensorView::contiguous(kv.data(), DType::kBF16, {s_kv, h_kv, d_qk});
  p.indices = TensorView::contiguous(indices.data(), DType::kInt32, {s_q, h_kv, topk});
  if (in.flag()) p.topk_length = TensorView::contiguous(topk_length.data(), DType::kInt32, {s_q});
  p.out = TensorView::contiguous(o.data(), DType::kBF16, {s_q, h_q, d_v});
  p.max_logits = TensorView::contiguous(max_logits.data(), DType::kFP32, {s_q, h_q});
  p.lse = TensorView::contiguous(prefill_lse.data(), DType::kFP32, {s_q, h_q});
  (void)sparse_prefill(p);
}

// Sparse prefill straight from a cache of any bytes (NaN and infinite keys included), on the
// default path or the FP8 tensor-core path's own arithmetic; q finite and moderate, or any bits.
void prefill_from_cache_case(Input& in, Bulk& bulk) {
  const int d_qk = fuzz_d_qk(in);
  Cache c;
  c.make(in, bulk, d_qk);
  const int64_t s_q = 1 + in.below(3), h_q = 1 + in.below(6), topk = in.below(9), d_v = 512;
  std::vector<uint16_t> q(s_q * h_q * d_qk), out(s_q * h_q * d_v);
  if (in.flag()) {
    fill_bf16(q, bulk);
  } else {
    for (uint16_t& x : q) x = static_cast<uint16_t>(bulk.next());
  }
  std::vector<int32_t> indices = any_ints(in, bulk, s_q * topk, c.cache.num_tokens());
  std::vector<int32_t> topk_length = any_ints(in, bulk, s_q, topk);
  std::vector<float> sink(h_q), max_logits(s_q * h_q), lse(s_q * h_q);
  const float specials[] = {std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), std::nanf(""), 0.f};
  for (float& x : sink) x = in.below(3) == 0 ? specials[in.below(4)] : in.take<int8_t>() / 8.f;
  SparsePrefillArgs p;
  p.q = TensorView::contiguous(q.data(), DType::kBF16, {s_q, h_q, d_qk});
  p.kv_cache = c.cache;
  p.indices = TensorView::contiguous(indices.data(), DType::kInt32, {s_q, 1, topk});
  if (in.flag()) p.topk_length = TensorView::contiguous(topk_length.data(), DType::kInt32, {s_q});
  if (in.flag()) p.attn_sink = TensorView::contiguous(sink.data(), DType::kFP32, {h_q});
  p.fp8_tensor_cores = in.flag();
  p.out = TensorView::contiguous(out.data(), DType::kBF16, {s_q, h_q, d_v});
  p.max_logits = TensorView::contiguous(max_logits.data(), DType::kFP32, {s_q, h_q});
  p.lse = TensorView::contiguous(lse.data(), DType::kFP32, {s_q, h_q});
  (void)sparse_prefill(p);
}

// Dense MHA prefill forward then backward on a small varlen batch: lengths 0-4 (zero-length
// sequences included), GQA, d_qk 192 or 128, rows padded; now and then one cu_seqlens entry or a
// max length broken, which the validator must reject before anything is read.
void mha_prefill_case(Input& in, Bulk& bulk) {
  const int64_t b = in.below(4), h_kv = 1 + in.below(2), h_q = h_kv * (1 + in.below(3));
  const int64_t d_qk = in.flag() ? 192 : 128, d_v = 128, pad = in.below(3);
  std::vector<int32_t> cu_q{0}, cu_kv{0};
  int64_t max_q = 0, max_kv = 0;
  for (int64_t i = 0; i < b; ++i) {
    cu_q.push_back(cu_q.back() + in.below(5));
    cu_kv.push_back(cu_kv.back() + in.below(5));
    max_q = std::max<int64_t>(max_q, cu_q.back() - cu_q[i]);
    max_kv = std::max<int64_t>(max_kv, cu_kv.back() - cu_kv[i]);
  }
  const int64_t total_q = cu_q.back(), total_kv = cu_kv.back();
  switch (in.below(8)) {
    case 0: cu_q[in.below(static_cast<int>(b + 1))] += in.take<int8_t>(); break;
    case 1: cu_kv[in.below(static_cast<int>(b + 1))] += in.take<int8_t>(); break;
    case 2: max_q -= 1; break;
    case 3: max_kv -= 1; break;
    default: break;
  }
  const DType dtype = in.flag() ? DType::kBF16 : DType::kFP16;
  auto rows = [&](int64_t tokens, int64_t heads, int64_t dim, std::vector<uint16_t>* v) {
    v->assign(static_cast<size_t>(tokens * heads * (dim + pad)), 0);
    v->shrink_to_fit();
    fill_bf16(*v, bulk);  // finite bits for fp16 too (exponent bit 14 cleared)
    return TensorView::strided(v->empty() ? nullptr : v->data(), dtype, {tokens, heads, dim},
                               {heads * (dim + pad), dim + pad, 1});
  };
  std::vector<uint16_t> q, k, v, out, dout, dq, dk, dv;
  std::vector<float> lse(static_cast<size_t>(total_q * h_q));
  MhaPrefillArgs a;
  a.q = rows(total_q, h_q, d_qk, &q);
  a.k = rows(total_kv, h_kv, d_qk, &k);
  a.v = rows(total_kv, h_kv, d_v, &v);
  a.cu_seqlens_q = TensorView::contiguous(cu_q.data(), DType::kInt32, {b + 1});
  a.cu_seqlens_kv = TensorView::contiguous(cu_kv.data(), DType::kInt32, {b + 1});
  a.max_seqlen_q = max_q;
  a.max_seqlen_kv = max_kv;
  a.causal = in.flag();
  a.out = rows(total_q, h_q, d_v, &out);
  a.lse = TensorView::strided(lse.empty() ? nullptr : lse.data(), DType::kFP32, {total_q, h_q},
                              {1, total_q});
  (void)mha_prefill(a);
  MhaPrefillBackwardArgs g;
  g.dout = rows(total_q, h_q, d_v, &dout);
  g.q = a.q;
  g.k = a.k;
  g.v = a.v;
  g.out = a.out;
  g.lse = a.lse;
  g.cu_seqlens_q = a.cu_seqlens_q;
  g.cu_seqlens_kv = a.cu_seqlens_kv;
  g.max_seqlen_q = max_q;
  g.max_seqlen_kv = max_kv;
  g.causal = a.causal;
  g.dq = rows(total_q, h_q, d_qk, &dq);
  g.dk = rows(total_kv, h_kv, d_qk, &dk);
  g.dv = rows(total_kv, h_kv, d_v, &dv);
  (void)mha_prefill_backward(g);
}

// The fused norm-rope-attention-rope-cast operations (prefill from bf16 rows, decode from a cache
// of any format, which they reject unless V4/V4.1's), out_sf exactly its layout's storage; q,
// cos/sin and sinks of any bits, positions in or past the cos/sin cache.
void fused_case(Input& in, Bulk& bulk) {
  const bool decode = in.flag();
  const int d_qk = decode ? 512 : (in.flag() ? 512 : 128);
  const int d_v = decode ? 512 : (d_qk == 512 ? 512 : 64);
  const int64_t s_q = in.below(4) + (decode ? 1 : 0), groups = 1 + in.below(2);
  const int64_t h_q = groups * (2 << in.below(2)), topk = in.below(9), num_positions = 1 + in.below(6);
  std::vector<uint16_t> q(s_q * h_q * d_qk);
  if (in.flag()) {
    fill_bf16(q, bulk);
  } else {
    for (uint16_t& x : q) x = static_cast<uint16_t>(bulk.next());
  }
  std::vector<float> cos_sin(num_positions * 64), sink(h_q), lse(s_q * h_q), max_logits(s_q * h_q);
  for (float& x : cos_sin) x = in.below(8) == 0 ? std::nanf("") : static_cast<int8_t>(bulk.next()) / 64.f;
  const float specials[] = {std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), std::nanf(""), 0.f};
  for (float& x : sink) x = in.below(3) == 0 ? specials[in.below(4)] : in.take<int8_t>() / 8.f;
  std::vector<int32_t> positions = any_ints(in, bulk, s_q, num_positions);
  std::vector<int32_t> topk_length = any_ints(in, bulk, s_q, topk);
  FusedOutSfLayout layout;
  if (!fused_out_sf_layout(s_q, groups, h_q / groups, d_v, &layout).ok()) return;
  std::vector<uint8_t> out_fp8(s_q * h_q * d_v);
  std::vector<int32_t> out_sf(layout.storage_ints);
  out_sf.shrink_to_fit();
  FusedNormRopeCast f;
  f.enable_q_norm = in.flag();
  f.rms_norm_eps = 1e-6f;
  f.token_positions = TensorView::contiguous(positions.data(), DType::kInt32, {s_q});
  f.cos_sin_cache = TensorView::contiguous(cos_sin.data(), DType::kFP32, {num_positions, 64});
  f.n_wv_group = static_cast<int>(groups);
  const TensorView q_view = TensorView::contiguous(q.data(), DType::kBF16, {s_q, h_q, d_qk});
  const TensorView fp8_view =
      TensorView::contiguous(out_fp8.data(), DType::kUInt8, {s_q, groups, h_q / groups * d_v});
  const TensorView sf_view = TensorView::strided(
      out_sf.data(), DType::kInt32, {layout.shape[0], layout.shape[1], layout.shape[2]},
      {layout.strides[0], layout.strides[1], layout.strides[2]});
  const TensorView lse_view = TensorView::contiguous(lse.data(), DType::kFP32, {s_q, h_q});
  const TensorView sink_view = TensorView::contiguous(sink.data(), DType::kFP32, {h_q});
  const TensorView length_view = TensorView::contiguous(topk_length.data(), DType::kInt32, {s_q});
  if (decode) {
    Cache c, extra;
    c.make(in, bulk, d_qk);
    std::vector<int32_t> indices = any_ints(in, bulk, s_q * topk, c.cache.num_tokens());
    FusedDecodeArgs a;
    a.fused = f;
    a.q = q_view;
    a.k_cache = c.cache;
    a.indices = TensorView::contiguous(indices.data(), DType::kInt32, {s_q, topk});
    if (in.flag()) a.topk_length = length_view;
    std::vector<int32_t> extra_indices;
    if (in.flag()) {
      extra.make(in, bulk, d_qk);
      extra_indices = any_ints(in, bulk, s_q * 3, extra.cache.num_tokens());
      a.extra_k_cache = extra.cache;
      a.extra_indices = TensorView::contiguous(extra_indices.data(), DType::kInt32, {s_q, 3});
    }
    if (in.flag()) a.attn_sink = sink_view;
    a.d_v = d_v;
    a.out_fp8 = fp8_view;
    a.out_sf = sf_view;
    a.lse = lse_view;
    (void)fused_norm_rope_attn_rope_cast_decode(a);
  } else {
    const int64_t s_kv = in.below(7);
    std::vector<uint16_t> kv(s_kv * d_qk);
    fill_bf16(kv, bulk);
    std::vector<int32_t> indices = any_ints(in, bulk, s_q * topk, s_kv);
    FusedPrefillArgs a;
    a.fused = f;
    a.q = q_view;
    a.kv = TensorView::contiguous(kv.data(), DType::kBF16, {s_kv, 1, d_qk});
    a.indices = TensorView::contiguous(indices.data(), DType::kInt32, {s_q, 1, topk});
    if (in.flag()) a.topk_length = length_view;
    if (in.flag()) a.attn_sink = sink_view;
    a.d_v = d_v;
    a.out_fp8 = fp8_view;
    a.out_sf = sf_view;
    a.max_logits = TensorView::contiguous(max_logits.data(), DType::kFP32, {s_q, h_q});
    a.lse = lse_view;
    (void)fused_norm_rope_attn_rope_cast_prefill(a);
  }
}

}  // namespace
}  // namespace openmla::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace openmla::fuzz;
  Input in(data, size);
  Bulk bulk(in.take<uint64_t>());
  switch (in.below(7)) {
    case 0: write_and_gather(in, bulk); break;
    case 1: sparse_decode_case(in, bulk); break;
    case 2: dense_decode_case(in, bulk); break;
    case 3: prefill_from_cache_case(in, bulk); break;
    case 4: mha_prefill_case(in, bulk); break;
    case 5: fused_case(in, bulk); break;
    default: merge_and_prefill(in, bulk); break;
  }
  return 0;
}
