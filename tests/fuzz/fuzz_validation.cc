// libFuzzer target: every validator (the fused operations' too) and the host schedule planner on arbitrary argument structs
// (ranks, sizes, strides, dtypes, KV layouts, scalars). Views live on a CUDA device, so the
// validators read no host memory through them; what is checked is that no input makes a
// validator or the planner misbehave (out-of-bounds, overflow; ASan + UBSan), whatever it returns.
#include <cstdint>
#include <vector>

#include "core/schedule.h"
#include "core/validate.h"
#include "core/validate_fused.h"
#include "core/validate_mha.h"
#include "fuzz/fuzz_input.h"
#include "openmla/openmla.h"

namespace openmla::fuzz {
namespace {

char g_dummy[64];

int64_t any_size(Input& in) {
  const uint8_t k = in.take<uint8_t>();
  return (k & 0x80) ? in.take<int64_t>() : (k & 0x7f);
}

TensorView any_view(Input& in) {
  TensorView t;
  const uint8_t mode = in.take<uint8_t>();
  if (mode % 7 == 0) return t;  // absent
  t.data = (mode & 8) ? nullptr : g_dummy;
  t.dtype = static_cast<DType>(in.below(7));  // one past the last dtype too
  t.rank = static_cast<int8_t>(in.take<uint8_t>()) % 9;
  for (int d = 0; d < kMaxTensorRank; ++d) {
    t.shape[d] = any_size(in);
    t.strides[d] = int64_t{in.take<int8_t>()};  // negative and zero strides too
  }
  t.device = Device::cuda(0);
  return t;
}

KVCache any_cache(Input& in) {
  KVCache c;
  if (in.below(5) == 0) return c;
  const auto format = static_cast<KVFormat>(in.below(7));
  c.layout = in.flag() ? default_kv_layout(format, 1 + in.below(300), in.flag() ? 576 : 512)
                       : interleaved_kv_layout(format, 1 + in.below(300));
  int64_t* fields[] = {&c.layout.block_stride, &c.layout.data_offset, &c.layout.data_stride,
                       &c.layout.scale_offset, &c.layout.scale_stride, &c.layout.rope_offset,
                       &c.layout.rope_stride};
  for (int i = in.below(3); i > 0; --i) *fields[in.below(7)] = any_size(in);
  if (in.flag()) c.layout.page_size = static_cast<int>(any_size(in));
  c.data = g_dummy;
  c.num_blocks = any_size(in);
  c.device = Device::cuda(0);
  return c;
}

void dense_decode_args(Input& in) {
  DenseDecodeArgs a;
  a.q = any_view(in);
  a.k_cache = any_view(in);
  a.block_table = any_view(in);
  a.cache_seqlens = any_view(in);
  a.out = any_view(in);
  a.lse = any_view(in);
  a.schedule.metadata = any_view(in);
  a.schedule.num_splits = any_view(in);
  a.d_v = in.take<int>();
  core::DenseDecodeShape shape;
  (void)core::validate_dense_decode(a, &shape);
}

void sparse_decode_args(Input& in) {
  SparseDecodeArgs a;
  a.q = any_view(in);
  a.k_cache = any_cache(in);
  a.indices = any_view(in);
  a.topk_length = any_view(in);
  a.extra_k_cache = any_cache(in);
  a.extra_indices = any_view(in);
  a.extra_topk_length = any_view(in);
  a.attn_sink = any_view(in);
  a.out = any_view(in);
  a.lse = any_view(in);
  a.d_v = in.take<int>();
  core::SparseDecodeShape shape;
  (void)core::validate_sparse_decode(a, &shape);
}

void sparse_prefill_args(Input& in) {
  SparsePrefillArgs a;
  a.q = any_view(in);
  a.kv = any_view(in);
  a.indices = any_view(in);
  a.topk_length = any_view(in);
  a.attn_sink = any_view(in);
  a.out = any_view(in);
  a.max_logits = any_view(in);
  a.lse = any_view(in);
  a.d_v = in.take<int>();
  a.fp8_tensor_cores = in.flag();
  core::SparsePrefillShape shape;
  (void)core::validate_sparse_prefill(a, &shape);
}

void mha_prefill_args(Input& in) {
  MhaPrefillArgs a;
  a.q = any_view(in);
  a.k = any_view(in);
  a.v = any_view(in);
  a.cu_seqlens_q = any_view(in);
  a.cu_seqlens_kv = any_view(in);
  a.max_seqlen_q = any_size(in);
  a.max_seqlen_kv = any_size(in);
  a.softmax_scale = static_cast<float>(in.take<int8_t>()) / 8.f;
  a.out = any_view(in);
  a.lse = any_view(in);
  core::MhaPrefillShape shape;
  (void)core::validate_mha_prefill(a, &shape);
  MhaPrefillBackwardArgs g;
  g.dout = any_view(in);
  g.q = a.q;
  g.k = a.k;
  g.v = a.v;
  g.out = any_view(in);
  g.lse = a.lse;
  g.cu_seqlens_q = a.cu_seqlens_q;
  g.cu_seqlens_kv = a.cu_seqlens_kv;
  g.max_seqlen_q = a.max_seqlen_q;
  g.max_seqlen_kv = a.max_seqlen_kv;
  g.dq = any_view(in);
  g.dk = any_view(in);
  g.dv = any_view(in);
  (void)core::validate_mha_prefill_backward(g, &shape);
}

void merge_and_cache_args(Input& in) {
  MergeStatesArgs m;
  m.part_out = any_view(in);
  m.part_lse = any_view(in);
  m.out = any_view(in);
  m.lse = any_view(in);
  core::MergeStatesShape merge_shape;
  (void)core::validate_merge_states(m, &merge_shape);
  KVCacheWriteArgs w;
  w.kv = any_view(in);
  w.slot_mapping = any_view(in);
  w.cache = any_cache(in);
  core::KVCacheWriteShape write_shape;
  (void)core::validate_kv_cache_write(w, &write_shape);
  (void)kv_block_footprint_bytes(w.cache.layout);
}

void schedule_args(Input& in) {
  DecodeScheduleArgs a;
  a.seqlens = any_view(in);
  a.s_q = in.take<int>();
  a.h_q = in.take<int>();
  a.h_kv = in.take<int>();
  a.num_sm_parts = in.take<int>();
  a.block_tokens = in.take<int>();
  a.metadata = any_view(in);
  a.num_splits = any_view(in);
  core::DecodeScheduleShape shape;
  (void)core::validate_decode_schedule(a, &shape);
}

void fused_args(Input& in) {
  FusedNormRopeCast f;
  f.enable_q_norm = in.flag();
  f.rms_norm_eps = static_cast<float>(in.take<int16_t>()) / 64.f;
  f.token_positions = any_view(in);
  f.is_rope_neox_style = in.below(8) == 0;
  f.rope_dim = in.flag() ? 64 : in.take<int>();
  f.cos_sin_cache = any_view(in);
  f.n_wv_group = in.flag() ? 1 + in.below(16) : in.take<int>();
  f.num_per_channels = in.below(8) == 0 ? in.take<int>() : 32;
  core::FusedShape shape;
  if (in.flag()) {
    FusedPrefillArgs a;
    a.fused = f;
    a.q = any_view(in);
    a.kv = any_view(in);
    a.indices = any_view(in);
    a.topk_length = any_view(in);
    a.attn_sink = any_view(in);
    a.d_v = in.flag() ? 32 * in.below(20) : in.take<int>();
    a.out_fp8 = any_view(in);
    a.out_sf = any_view(in);
    a.max_logits = any_view(in);
    a.lse = any_view(in);
    (void)core::validate_fused_prefill(a, &shape);
  } else {
    FusedDecodeArgs a;
    a.fused = f;
    a.q = any_view(in);
    a.k_cache = any_cache(in);
    a.indices = any_view(in);
    a.topk_length = any_view(in);
    a.extra_k_cache = any_cache(in);
    a.extra_indices = any_view(in);
    a.extra_topk_length = any_view(in);
    a.attn_sink = any_view(in);
    a.d_v = in.flag() ? 32 * in.below(20) : in.take<int>();
    a.out_fp8 = any_view(in);
    a.out_sf = any_view(in);
    a.lse = any_view(in);
    (void)core::validate_fused_decode(a, &shape);
  }
  const int64_t s_q = any_size(in), groups = any_size(in), group_size = any_size(in);
  const int64_t d_v = any_size(in);
  FusedOutSfLayout layout;
  (void)fused_out_sf_layout(s_q, groups, group_size, d_v, &layout);
}

// The host planner on lengths anywhere in [0, 2^31), small and huge batches of workers.
void host_plan(Input& in) {
  const int batch = in.below(64);
  const int parts = 1 + in.take<uint8_t>() % 160;
  const int block_tokens = 1 + in.take<uint8_t>() % 130;
  std::vector<int32_t> seqlens(batch);
  for (int32_t& len : seqlens) {
    const uint8_t k = in.take<uint8_t>();
    len = (k & 0x80) ? (in.take<int32_t>() & 0x7fffffff) : k;
  }
  std::vector<int32_t> metadata(static_cast<size_t>(parts) * kScheduleMetadataInts);
  std::vector<int32_t> num_splits(batch + 1);
  core::plan_decode_schedule_host(seqlens.data(), batch, parts, block_tokens,
                                  core::kScheduleSplitOverheadBlocks, core::kScheduleCombineBlocks,
                                  metadata.data(), num_splits.data());
}

}  // namespace
}  // namespace openmla::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace openmla::fuzz;
  Input in(data, size);
  switch (in.below(8)) {
    case 0: dense_decode_args(in); break;
    case 1: sparse_decode_args(in); break;
    case 2: sparse_prefill_args(in); break;
    case 3: merge_and_cache_args(in); break;
    case 4: schedule_args(in); break;
    case 5: mha_prefill_args(in); break;
    case 6: fused_args(in); break;
    default: host_plan(in); break;
  }
  return 0;
}
