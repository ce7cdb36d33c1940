// Host side of the SM90 sparse decode family (launch.h): what the kernel needs beyond core
// validation, the split count, the workspace, and the launches of decode and combine.
#include "cuda/sm90/sparse_decode/launch.h"

#include <cstdint>
#include <string>

#include "core/schedule.h"
#include "core/sparse_kernel_plan.h"
#include "core/str_cat.h"
#include "cuda/common/combine.h"
#include "cuda/common/kv_codec.cuh"
#include "cuda/sm90/attention/launch.h"
#include "cuda/sm90/sparse_decode/params.h"

namespace openmla::cuda::sm90 {
namespace {

constexpr int kKeysPerTile = 64;
constexpr size_t kAlign = 256;

core::SparseFillFormat fill_format(int codec) {
  using kvcodec::Codec;
  switch (static_cast<Codec>(codec)) {
    case Codec::kFP8_V32: return core::SparseFillFormat::kFP8_V32;
    case Codec::kFP8_Model1: return core::SparseFillFormat::kFP8_Model1;
    case Codec::kFP8_MX: return core::SparseFillFormat::kFP8_MX;
    case Codec::kFP4: return core::SparseFillFormat::kFP4;
    default: return core::SparseFillFormat::kNone;
  }
}

size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

template <typename... Parts>
Status invalid(const Parts&... parts) {
  return Status::InvalidArgument(core::str_cat("sparse_decode: ", parts...));
}

// SMs of a device (read once per device by the shared device facts; 132 if that fails).
int num_sms(int device_index) {
  attention::DeviceFacts facts;
  if (!attention::device_facts("sparse_decode", device_index, &facts).ok()) return 132;
  return facts.num_sms;
}

// o_partial's bytes: a block of core::partial_block_floats a (global split, m-block) of
// `problems` problems of s_pack query tokens x h_q heads (cuda/common/combine.h, "o_accum").
size_t o_partial_bytes(int64_t splits, int64_t problems, int64_t s_pack, int64_t h_q) {
  const int64_t rows = s_pack * h_q;
  return align_up(sizeof(float) * splits * problems * ((rows + 63) / 64) *
                  core::partial_block_floats(static_cast<int>(rows), 512));
}
// lse_partial's (and max_partial's) bytes: [global split, s_pack, h_q].
size_t lse_partial_bytes(int64_t splits, int64_t problems, int64_t s_pack, int64_t h_q) {
  return align_up(sizeof(float) * splits * problems * s_pack * h_q);
}
// o_partial, lse_partial, max_partial (params.h).
size_t partial_bytes(int64_t splits, int64_t problems, int64_t s_pack, int64_t h_q) {
  if (splits <= 1) return 0;
  return o_partial_bytes(splits, problems, s_pack, h_q) +
         2 * lse_partial_bytes(splits, problems, s_pack, h_q);
}

int codec_of(KVFormat format) {
  using kvcodec::Codec;
  switch (format) {
    case KVFormat::kBF16: return static_cast<int>(Codec::kBF16);
    case KVFormat::kFP16: return static_cast<int>(Codec::kFP16);
    case KVFormat::kFP8_V32: return static_cast<int>(Codec::kFP8_V32);
    case KVFormat::kFP8_Model1: return static_cast<int>(Codec::kFP8_Model1);
    case KVFormat::kFP8_MX: return static_cast<int>(Codec::kFP8_MX);
    case KVFormat::kFP4: return static_cast<int>(Codec::kFP4);
  }
  return -1;
}

Status cache_params(const KVCache& cache, const char* arg, const core::SparseTuning& tuning,
                    SparseCacheParams* c) {
  const KVLayout& l = cache.layout;
  if (l.format == KVFormat::kFP16) {
    return Status::NotImplemented(core::str_cat(
        "sparse_decode: ", arg, ": fp16 caches have no CUDA sparse decode kernel (q is bf16; "
        "the kernel reads bf16, fp8_v32, fp8_model1, fp8_mx and fp4 caches)"));
  }
  c->base = static_cast<const uint8_t*>(cache.data);
  c->block_stride = l.block_stride;
  c->data_offset = l.data_offset;
  c->data_stride = l.data_stride;
  c->scale_offset = l.scale_offset;
  c->scale_stride = l.scale_stride;
  c->rope_offset = l.rope_offset;
  c->rope_stride = l.rope_stride;
  c->num_slots = cache.num_tokens();
  c->page_size = l.page_size;
  c->page_shift = -1;
  for (int s = 0; s < 31; ++s) {
    if ((1 << s) == l.page_size) c->page_shift = s;
  }
  c->codec = codec_of(l.format);
  // A token's bytes into L2 one tile ahead: its data part, and the parts stored right behind it
  // at the same stride (the default fp8_v32 token is one 656 B run); 16 B aligned runs only.
  const KVFormatInfo info = kv_format_info(l.format, l.d_qk);
  int64_t end = l.data_offset + info.data_bytes;
  if (info.scale_bytes > 0 && l.scale_stride == l.data_stride && l.scale_offset == end) {
    end += info.scale_bytes;
  }
  if (info.rope_bytes > 0 && l.rope_stride == l.data_stride && l.rope_offset == end) {
    end += info.rope_bytes;
  }
  const int64_t bytes = (end - l.data_offset + 15) / 16 * 16;
  // A part (offset, stride) of every token in every block starts on a `to`-byte boundary.
  auto aligned_to = [&](int64_t offset, int64_t stride, int to) {
    return reinterpret_cast<uintptr_t>(cache.data) % to == 0 && l.block_stride % to == 0 &&
           offset % to == 0 && stride % to == 0;
  };
  const bool aligned = aligned_to(l.data_offset, l.data_stride, 16);
  c->prefetch_bytes = aligned && !tuning.no_prefetch ? static_cast<int>(bytes) : 0;
  // bf16 keys need no decoding: cp.async copies them into the stage (16 B pieces, so the rows
  // must be 16 B aligned; 1.7x the register path on sparse prefill, H100, NOTES.md).
  c->async_copy = l.format == KVFormat::kBF16 && aligned && !tuning.bf16_registers;
  // The token fill loads a key's data and RoPE parts in 16 B pieces and its scales in 8 B
  // (fp8_model1) or 16 B (fp8_v32, fp8_mx, fp4) pieces. (bf16 keys by cp.async take the
  // warp-per-key fill: a quarter-key a thread was slower for them, each lane's copies touching
  // lines of their own.)
  const int scale_align = l.format == KVFormat::kFP8_Model1 ? 8 : 16;
  c->by_token = info.quantized() && !tuning.key_fill && aligned &&
                aligned_to(l.scale_offset, l.scale_stride, scale_align) &&
                (info.rope_bytes == 0 || aligned_to(l.rope_offset, l.rope_stride, 16));
  return Status::Ok();
}

// The split partials' merge (cuda/common/combine.h): a problem is the combine's request, of
// s_pack query tokens (out's rows hold s_q) and num_splits splits.
DecodeCombineParams combine_params(const SparseDecodeParams& p) {
  DecodeCombineParams c;
  c.lse_accum = p.lse_partial;
  c.o_accum = p.o_partial;
  c.uniform_splits = p.num_splits;
  c.max_splits = c.max_slots = p.problems * p.num_splits;
  c.out = p.out;
  c.out_stride_b = p.out_stride_b;
  c.out_stride_s = p.out_stride_s;
  c.out_stride_h = p.out_stride_h;
  c.lse = p.lse;
  c.lse_stride_b = p.lse_stride_b;
  c.lse_stride_h = p.lse_stride_h;
  c.lse_stride_s = p.lse_stride_s;
  // 16-byte stores where out and its strides allow (bf16: multiples of 8 elements).
  c.out_16B = !p.fused.on && reinterpret_cast<uintptr_t>(p.out) % 16 == 0 &&
              p.out_stride_b % 8 == 0 && p.out_stride_s % 8 == 0 && p.out_stride_h % 8 == 0;
  c.batch = p.problems;
  c.s_q = p.s_pack;
  c.s_q_out = p.s_q;
  c.h_q = p.h_q;
  c.h_kv = 1;
  c.warps_per_row = p.num_splits <= 4 ? 1 : p.num_splits <= 8 ? 2 : 4;
  if (p.num_splits > 16 && !p.fused.on) c.warps_per_row = 8;
  c.sink = p.sink;
  c.sink_stride = p.sink_stride;
  if (p.max_logits != nullptr) {
    c.max_accum = p.max_partial;
    c.max_logits = p.max_logits;
    c.max_logits_stride_b = p.max_logits_stride_b;
    c.max_logits_stride_h = p.max_logits_stride_h;
    c.max_logits_stride_s = p.max_logits_stride_s;
  }
  c.fused = p.fused;
  return c;
}

}  // namespace

// What the kernel's loads and stores need of q and out beyond core validation (rank 3 or 4, the
// last dim contiguous): q 16-byte rows, out bf16 pairs.
Status check_q_out(const char* op, const TensorView& q, const TensorView& out) {
  for (int d = 0; d + 1 < q.rank; ++d) {
    if (q.shape[d] > 1 && q.strides[d] % 8 != 0) {
      return Status::NotImplemented(core::str_cat(
          op, ": q: the CUDA kernel loads 16-byte rows; expected strides that are multiples of 8 "
          "elements, got stride ", q.strides[d], " in dim ", d));
    }
  }
  if (reinterpret_cast<uintptr_t>(q.data) % 16 != 0) {
    return Status::NotImplemented(core::str_cat(op, ": q: expected a 16-byte aligned address"));
  }
  for (int d = 0; d + 1 < out.rank; ++d) {
    if (out.shape[d] > 1 && out.strides[d] % 2 != 0) {
      return Status::NotImplemented(core::str_cat(
          op, ": out: the CUDA kernel stores bf16 pairs; expected even strides, got stride ",
          out.strides[d], " in dim ", d));
    }
  }
  if (reinterpret_cast<uintptr_t>(out.data) % 4 != 0) {
    return Status::NotImplemented(core::str_cat(op, ": out: expected a 4-byte aligned address"));
  }
  return Status::Ok();
}

void set_q_out_lse(const TensorView& q, const TensorView& out, const TensorView& lse,
                   SparseDecodeParams* p) {
  p->q = q.data;
  p->q_stride_b = q.strides[0];
  p->q_stride_s = q.strides[1];
  p->q_stride_h = q.strides[2];
  p->out = out.data;
  p->out_stride_b = out.strides[0];
  p->out_stride_s = out.strides[1];
  p->out_stride_h = out.strides[2];
  p->lse = lse.data_as<float>();
  p->lse_stride_b = lse.strides[0];
  p->lse_stride_h = lse.strides[1];
  p->lse_stride_s = lse.strides[2];
}

Status sparse_cache_params(const KVCache& cache, const char* arg, SparseCacheParams* c,
                           const core::SparseTuning& tuning) {
  return cache_params(cache, arg, tuning, c);
}

void set_key_list(SparseDecodeParams* p, int c, const int32_t* indices, int64_t stride_b,
                  int64_t stride_s, int64_t stride_k, const TensorView& lengths, int64_t topk) {
  p->indices[c] = indices;
  p->indices_stride_b[c] = stride_b;
  p->indices_stride_s[c] = stride_s;
  p->indices_stride_k[c] = stride_k;
  p->lengths[c] = lengths.defined() ? lengths.data_as<const int32_t>() : nullptr;
  p->lengths_stride[c] = lengths.defined() ? lengths.strides[0] : 0;
  p->topk[c] = static_cast<int>(topk);
}

size_t sparse_workspace_bytes(int device_index, int64_t problems, int64_t s_pack, int64_t ctas,
                              int h_q) {
  if (problems <= 0 || s_pack <= 0 || h_q <= 0) return 0;
  return partial_bytes(core::sparse_max_splits(num_sms(device_index), ctas), problems, s_pack,
                       h_q);
}

size_t sparse_decode_workspace_size(int device_index, int batch, int s_q, int h_q, int d_v) {
  if (batch <= 0 || s_q <= 0 || h_q <= 0 || d_v <= 0) return 0;
  const int64_t tokens = static_cast<int64_t>(batch) * s_q;
  return sparse_workspace_bytes(device_index, tokens, 1, tokens * ((h_q + 63) / 64), h_q);
}

Status launch_sparse_attention(SparseDecodeParams& p, int d_qk, int64_t max_tiles,
                               const Workspace& workspace, int device_index, cudaStream_t stream,
                               const char* op, bool batch_invariant, bool prefill,
                               const core::SparseTuning& tuning) {
  if (p.s_pack == 0) p.s_pack = 1;  // sparse mode: one query token a problem
  p.problems = p.tokens / p.s_pack;
  p.m_blocks = (p.s_pack * p.h_q + 63) / 64;
  if (p.tokens == 0) return Status::Ok();
  const int sms = num_sms(device_index);
  const int64_t ctas = static_cast<int64_t>(p.problems) * p.m_blocks;
  const int overhead = tuning.split_overhead >= 0 && tuning.split_overhead <= 16
                           ? tuning.split_overhead
                           : 1;
  core::SparseSplitPlan plan = core::plan_sparse_splits(sms, ctas, max_tiles, overhead);
  if (batch_invariant) {  // one CTA walks a token's whole key list, in the list's order
    plan = {1, static_cast<int>(max_tiles)};
  } else if (tuning.tiles_per_split > 0 && tuning.tiles_per_split <= 256 &&
             p.block_table == nullptr && max_tiles > 0) {
    // Never more splits than the workspace holds (sparse_workspace_bytes' bound).
    plan = core::forced_sparse_splits(sms, ctas, max_tiles, tuning.tiles_per_split);
  }
  p.num_splits = plan.num_splits;
  p.tiles_per_split = plan.tiles_per_split;
  if (p.num_splits > 1) {
    const size_t need = partial_bytes(p.num_splits, p.problems, p.s_pack, p.h_q);
    if (workspace.bytes < need || workspace.data == nullptr) {
      return Status::InvalidArgument(core::str_cat(
          op, ": workspace: expected at least ", need, " bytes (", op,
          "_workspace_size), got ", workspace.bytes));
    }
    char* ws = static_cast<char*>(workspace.data);
    const size_t o_bytes = o_partial_bytes(p.num_splits, p.problems, p.s_pack, p.h_q);
    const size_t l_bytes = lse_partial_bytes(p.num_splits, p.problems, p.s_pack, p.h_q);
    p.o_partial = reinterpret_cast<float*>(ws);
    p.lse_partial = reinterpret_cast<float*>(ws + o_bytes);
    p.max_partial = reinterpret_cast<float*>(ws + o_bytes + l_bytes);
  }
  auto failed = [&](cudaError_t err) {
    return Status::CudaError(core::str_cat(op, ": launch failed: ", cudaGetErrorName(err), " (",
                                           cudaGetErrorString(err), ")"));
  };
  // The kernel's form (core/sparse_kernel_plan.h: the fill and the compute order, each default
  // measured faster on an H100).
  p.by_token = p.cache[0].by_token && (p.topk[1] == 0 || p.cache[1].by_token);
  core::SparseKernelShape kshape;
  kshape.prefill = prefill;
  kshape.dense_mode = p.block_table != nullptr;
  kshape.d_qk = d_qk;
  kshape.m_blocks = p.m_blocks;
  kshape.rows = p.s_pack * p.h_q;
  kshape.by_token = p.by_token;
  // The token fill is built once per quantised format; caches of two formats take the fill that
  // reads the format at run time.
  const bool one_codec = p.topk[1] == 0 || p.cache[1].codec == p.cache[0].codec;
  kshape.format = one_codec ? fill_format(p.cache[0].codec) : core::SparseFillFormat::kNone;
  kshape.bf16_async = p.cache[0].async_copy && (p.topk[1] == 0 || p.cache[1].async_copy);
  kshape.tiles_per_split = p.tiles_per_split;
  const core::SparseKernelPlan form = core::plan_sparse_kernel(kshape, tuning);
  p.fill_codec = form.fill_for_format ? p.cache[0].codec : -1;
  p.pair = form.pair;
  p.stream = form.stream;
  p.ring = form.ring;
  p.seesaw = form.seesaw;
  // The fused op's steps exist in the staggered seesaw only (traits.h kFused).
  p.stagger = form.stagger || (form.seesaw && p.fused.on);
  p.group_fill = form.group_fill;
  for (p.problem0 = 0; p.problem0 < p.problems; p.problem0 += 65535) {
    const bool dense = p.block_table != nullptr;
    const cudaError_t err =
        d_qk == 576 ? (dense ? launch_sparse_decode_kernel<576, true>(p, stream)
                             : launch_sparse_decode_kernel<576, false>(p, stream))
                    : (dense ? launch_sparse_decode_kernel<512, true>(p, stream)
                             : launch_sparse_decode_kernel<512, false>(p, stream));
    if (err != cudaSuccess) return failed(err);
  }
  if (p.num_splits > 1) {
    if (const cudaError_t err = launch_decode_combine(combine_params(p), DType::kBF16, stream);
        err != cudaSuccess) {
      return failed(err);
    }
  }
  return Status::Ok();
}

Status sparse_decode(const SparseDecodeArgs& args, const core::SparseDecodeShape& shape,
                     cudaStream_t stream, const core::SparseTuning& tuning) {
  if (shape.d_v != 512) {
    return Status::NotImplemented(
        core::str_cat("sparse_decode: d_v ", shape.d_v, " has no CUDA kernel (d_v 512 only)"));
  }
  if (shape.topk > (1 << 24) || shape.extra_topk > (1 << 24)) {
    return invalid("indices: topk ", shape.topk, " / extra_topk ", shape.extra_topk,
                   " above the kernel's 2^24");
  }
  OPENMLA_RETURN_IF_ERROR(check_q_out("sparse_decode", args.q, args.out));
  SparseDecodeParams p = {};
  set_q_out_lse(args.q, args.out, args.lse, &p);
  if (args.max_logits.defined()) {
    p.max_logits = args.max_logits.data_as<float>();
    p.max_logits_stride_b = args.max_logits.strides[0];
    p.max_logits_stride_h = args.max_logits.strides[1];
    p.max_logits_stride_s = args.max_logits.strides[2];
  }
  OPENMLA_RETURN_IF_ERROR(cache_params(args.k_cache, "k_cache", tuning, &p.cache[0]));
  const TensorView& idx = args.indices;
  set_key_list(&p, 0, idx.data_as<const int32_t>(), idx.strides[0], idx.strides[1], idx.strides[2],
               args.topk_length, shape.topk);
  p.cache[1] = p.cache[0];
  p.indices[1] = p.indices[0];
  if (args.extra_k_cache.defined()) {
    OPENMLA_RETURN_IF_ERROR(cache_params(args.extra_k_cache, "extra_k_cache", tuning, &p.cache[1]));
    const TensorView& extra = args.extra_indices;
    set_key_list(&p, 1, extra.data_as<const int32_t>(), extra.strides[0], extra.strides[1],
                 extra.strides[2], args.extra_topk_length, shape.extra_topk);
  }
  p.sink = args.attn_sink.defined() ? args.attn_sink.data_as<const float>() : nullptr;
  p.sink_stride = args.attn_sink.defined() ? args.attn_sink.strides[0] : 0;

  p.batch = static_cast<int>(shape.batch);
  p.s_q = static_cast<int>(shape.s_q);
  p.h_q = static_cast<int>(shape.h_q);
  p.tokens = p.batch * p.s_q;
  p.scale = shape.softmax_scale;
  p.scale_log2 = shape.softmax_scale * 1.4426950408889634f;
  const int64_t max_tiles = (shape.topk + kKeysPerTile - 1) / kKeysPerTile +
                            (shape.extra_topk + kKeysPerTile - 1) / kKeysPerTile;
  return launch_sparse_attention(p, static_cast<int>(shape.d_qk), max_tiles, args.workspace,
                                 shape.device.index, stream, "sparse_decode",
                                 args.batch_invariant, /*prefill=*/false, tuning);
}

}  // namespace openmla::cuda::sm90
