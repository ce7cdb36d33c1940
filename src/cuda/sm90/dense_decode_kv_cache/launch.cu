// Host side of SM90 dense decode over a KVCache (launch.h).
#include "cuda/sm90/dense_decode_kv_cache/launch.h"

#include <cstdint>

#include "core/str_cat.h"
#include "cuda/sm90/sparse_decode/launch.h"
#include "cuda/sm90/sparse_decode/params.h"

namespace openmla::cuda::sm90 {
namespace {

constexpr const char* kOp = "dense_decode";

int64_t m_blocks(int64_t s_q, int64_t h_q) { return (s_q * h_q + 63) / 64; }

}  // namespace

size_t dense_decode_kv_cache_workspace_size(int device_index, int batch, int s_q, int h_q) {
  if (batch <= 0 || s_q <= 0 || h_q <= 0) return 0;
  return sparse_workspace_bytes(device_index, batch, s_q, batch * m_blocks(s_q, h_q), h_q);
}

Status dense_decode_kv_cache(const DenseDecodeArgs& args, const core::DenseDecodeShape& shape,
                             cudaStream_t stream) {
  if (shape.d_v != 512) {
    return Status::NotImplemented(core::str_cat(
        kOp, ": kv_cache: d_v ", shape.d_v, " has no CUDA kernel over a KVCache (d_v 512 only)"));
  }
  if (args.q.dtype != DType::kBF16) {
    return Status::NotImplemented(core::str_cat(
        kOp, ": q: the CUDA kernel over a KVCache reads bf16 q (and bf16, fp8_v32, fp8_model1, "
        "fp8_mx or fp4 caches), got ", dtype_name(args.q.dtype)));
  }
  // The kernel's slots are int32 (block * page_size + offset).
  if (shape.num_blocks * shape.page_size > INT32_MAX) {
    return Status::NotImplemented(core::str_cat(
        kOp, ": kv_cache: ", shape.num_blocks, " blocks of ", shape.page_size,
        " tokens; the CUDA kernel addresses at most 2^31 cache slots"));
  }
  if (shape.max_blocks * shape.page_size > INT32_MAX) {
    return Status::InvalidArgument(core::str_cat(
        kOp, ": block_table: ", shape.max_blocks, " blocks of ", shape.page_size,
        " tokens a request exceed 2^31 positions"));
  }
  OPENMLA_RETURN_IF_ERROR(check_q_out(kOp, args.q, args.out));
  SparseDecodeParams p = {};
  set_q_out_lse(args.q, args.out, args.lse, &p);
  OPENMLA_RETURN_IF_ERROR(sparse_cache_params(args.kv_cache, "kv_cache", &p.cache[0]));
  p.cache[1] = p.cache[0];
  p.block_table = args.block_table.data_as<const int32_t>();
  p.block_table_stride_b = args.block_table.strides[0];
  p.seqlens = args.cache_seqlens.data_as<const int32_t>();
  p.seqlens_stride = args.cache_seqlens.strides[0];
  p.max_blocks = static_cast<int>(shape.max_blocks);
  p.num_blocks = static_cast<int>(shape.num_blocks);
  p.causal = args.causal;

  p.batch = static_cast<int>(shape.batch);
  p.s_q = static_cast<int>(shape.s_q);
  p.h_q = static_cast<int>(shape.h_q);
  p.tokens = p.batch * p.s_q;
  p.s_pack = p.s_q;
  p.scale = shape.softmax_scale;
  p.scale_log2 = shape.softmax_scale * 1.4426950408889634f;
  // The split count comes from the block table's capacity (the lengths live on the device); the
  // kernel spreads each request's own tiles over those splits.
  const int64_t max_tiles = (shape.max_blocks * shape.page_size + 63) / 64;
  return launch_sparse_attention(p, static_cast<int>(shape.d_qk), max_tiles, args.workspace,
                                 shape.device.index, stream, kOp);
}

}  // namespace openmla::cuda::sm90
