// Host side of the SM90 sparse attention family (launch.h): what the kernel needs beyond core
// validation, the split count, the workspace, the form, and the launches of kernel and combine.
#include "cuda/sm90/sparse_attention/launch.h"

#include <cstdint>
#include <string>

#include "core/sparse_kernel_plan.h"
#include "core/sparse_split_plan.h"
#include "core/str_cat.h"
#include "cuda/common/kv_codec.cuh"
#include "cuda/sm90/attention/launch.h"
#include "cuda/sm90/sparse_attention/forms.h"
#include "cuda/sm90/sparse_attention/params.h"

namespace openmla::cuda::sm90 {
namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// SMs of a device (read once per device by the shared device facts; 132 if that fails).
int num_sms(int device_index) {
  attention::DeviceFacts facts;
  if (!attention::device_facts("sparse_attention", device_index, &facts).ok()) return 132;
  return facts.num_sms;
}

// o_partial, lse_partial, max_partial (params.h).
size_t partial_bytes(int64_t splits, int64_t tokens, int64_t h_q, int64_t d_v) {
  if (splits <= 1) return 0;
  return align_up(sizeof(float) * splits * tokens * h_q * d_v) +
         2 * align_up(sizeof(float) * splits * tokens * h_q);
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

bool is_quantised(const SparseCacheParams& c) {
  using kvcodec::Codec;
  return c.codec == static_cast<int>(Codec::kFP8_V32) ||
         c.codec == static_cast<int>(Codec::kFP8_Model1) ||
         c.codec == static_cast<int>(Codec::kFP8_MX) || c.codec == static_cast<int>(Codec::kFP4);
}

cudaError_t launch_form(const SparseAttentionParams& p, int d_qk, bool dense, int cluster,
                        bool seesaw, cudaStream_t stream) {
#define OPENMLA_SPARSE_FORM_CASE(d, dn, cl, ss, mode, order)            \
  if (d_qk == d && dense == dn && cluster == cl && seesaw == ss) {      \
    return launch_sparse_form<d, dn, cl, ss>(p, stream);                \
  }
  OPENMLA_SM90_SPARSE_FORMS(OPENMLA_SPARSE_FORM_CASE)
#undef OPENMLA_SPARSE_FORM_CASE
  return cudaErrorNotSupported;  // (never: the form table picks listed forms only)
}

}  // namespace

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
                   SparseAttentionParams* p) {
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

Status sparse_cache_params(const char* op, const KVCache& cache, const char* arg,
                           SparseCacheParams* c) {
  const KVLayout& l = cache.layout;
  if (l.format == KVFormat::kFP16) {
    return Status::NotImplemented(core::str_cat(
        op, ": ", arg, ": fp16 caches have no CUDA sparse kernel (q is bf16; the kernel reads "
        "bf16, fp8_v32, fp8_model1, fp8_mx and fp4 caches)"));
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
  // A part (offset, stride) of every token in every block starts on a `to`-byte boundary.
  auto aligned_to = [&](int64_t offset, int64_t stride, int to) {
    return reinterpret_cast<uintptr_t>(cache.data) % to == 0 && l.block_stride % to == 0 &&
           offset % to == 0 && stride % to == 0;
  };
  const KVFormatInfo info = kv_format_info(l.format, l.d_qk);
  const bool data16 = aligned_to(l.data_offset, l.data_stride, 16);
  // The fill's wide loads: data and RoPE by 16 B, scales by 16 B (fp8_model1's by 8 B).
  const int scale_align = l.format == KVFormat::kFP8_Model1 ? 8 : 16;
  c->aligned = data16 &&
               (info.scale_bytes == 0 || aligned_to(l.scale_offset, l.scale_stride, scale_align)) &&
               (info.rope_bytes == 0 || aligned_to(l.rope_offset, l.rope_stride, 16));
  // A token's bytes into L2 one tile ahead: its data part and the parts stored right behind it
  // at the same stride (the default fp8_v32 token is one 656 B run); 16 B aligned runs only.
  int64_t end = l.data_offset + info.data_bytes;
  if (info.scale_bytes > 0 && l.scale_stride == l.data_stride && l.scale_offset == end) {
    end += info.scale_bytes;
  }
  if (info.rope_bytes > 0 && l.rope_stride == l.data_stride && l.rope_offset == end) {
    end += info.rope_bytes;
  }
  c->prefetch_bytes = data16 ? static_cast<int>((end - l.data_offset + 15) / 16 * 16) : 0;
  return Status::Ok();
}

size_t sparse_workspace_bytes(int device_index, int64_t tokens, int64_t ctas, int h_q) {
  if (tokens <= 0 || h_q <= 0) return 0;
  return partial_bytes(core::sparse_max_splits(num_sms(device_index), ctas), tokens, h_q, 512);
}

Status launch_sparse_attention(SparseAttentionParams& p, int d_qk, int64_t max_tiles,
                               const Workspace& workspace, int device_index, cudaStream_t stream,
                               const char* op, bool batch_invariant, bool prefill,
                               const SparseTuning& tuning) {
  if (p.s_pack == 0) p.s_pack = 1;  // sparse mode: one query token a problem
  p.problems = p.tokens / p.s_pack;
  p.m_blocks = (p.s_pack * p.h_q + 63) / 64;
  p.l2_prefetch = tuning.l2_prefetch;
  if (p.tokens == 0) return Status::Ok();
  const int sms = num_sms(device_index);
  const int64_t ctas = static_cast<int64_t>(p.problems) * p.m_blocks;
  core::SparseSplitPlan plan =
      core::plan_sparse_splits(sms, ctas, max_tiles, tuning.split_overhead_tiles);
  if (batch_invariant) {  // one CTA walks a token's whole key list, in the list's order
    plan = {1, static_cast<int>(max_tiles)};
  } else if (tuning.tiles_per_split > 0 && p.block_table == nullptr && max_tiles > 0) {
    // Never more splits than the workspace holds (sparse_workspace_bytes' bound).
    plan = core::forced_sparse_splits(sms, ctas, max_tiles, tuning.tiles_per_split);
  }
  p.num_splits = plan.num_splits;
  p.tiles_per_split = plan.tiles_per_split;
  if (p.num_splits > 1) {
    const size_t need = partial_bytes(p.num_splits, p.tokens, p.h_q, 512);
    if (workspace.bytes < need || workspace.data == nullptr) {
      return Status::InvalidArgument(core::str_cat(
          op, ": workspace: expected at least ", need, " bytes (", op,
          "_workspace_size), got ", workspace.bytes));
    }
    char* ws = static_cast<char*>(workspace.data);
    const size_t o_bytes = align_up(sizeof(float) * p.num_splits * p.tokens * p.h_q * 512);
    const size_t l_bytes = align_up(sizeof(float) * p.num_splits * p.tokens * p.h_q);
    p.o_partial = reinterpret_cast<float*>(ws);
    p.lse_partial = reinterpret_cast<float*>(ws + o_bytes);
    p.max_partial = reinterpret_cast<float*>(ws + o_bytes + l_bytes);
  }
  // The form (core/sparse_kernel_plan.h), then the tuning's overrides.
  const bool two_caches = p.topk[1] > 0;
  core::SparseKernelShape shape;
  shape.prefill = prefill;
  shape.dense_mode = p.block_table != nullptr;
  shape.d_qk = d_qk;
  shape.m_blocks = p.m_blocks;
  shape.quantised = is_quantised(p.cache[0]) && (!two_caches || is_quantised(p.cache[1]));
  auto bf16_aligned = [](const SparseCacheParams& c) {
    return c.codec == static_cast<int>(kvcodec::Codec::kBF16) && c.aligned;
  };
  shape.bf16_aligned = bf16_aligned(p.cache[0]) && (!two_caches || bf16_aligned(p.cache[1]));
  core::SparseKernelForm form = core::plan_sparse_kernel(shape);
  if (tuning.seesaw == 0) form.seesaw = false;
  if (tuning.cluster == 0) form.cluster = 1;
  if (tuning.cluster == 1 && !form.seesaw && shape.quantised && p.m_blocks % 2 == 0) {
    form.cluster = 2;
  }
  auto failed = [&](cudaError_t err) {
    return Status::CudaError(core::str_cat(op, ": launch failed: ", cudaGetErrorName(err), " (",
                                           cudaGetErrorString(err), ")"));
  };
  for (p.problem0 = 0; p.problem0 < p.problems; p.problem0 += 65535) {
    const cudaError_t err =
        launch_form(p, d_qk, shape.dense_mode, form.cluster, form.seesaw, stream);
    if (err != cudaSuccess) return failed(err);
  }
  if (p.num_splits > 1) {
    for (p.token0 = 0; p.token0 < p.tokens; p.token0 += 65535) {
      if (const cudaError_t err = launch_sparse_combine(p, stream); err != cudaSuccess) {
        return failed(err);
      }
    }
  }
  return Status::Ok();
}

}  // namespace openmla::cuda::sm90
