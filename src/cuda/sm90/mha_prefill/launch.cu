// Host side of the SM90 dense MHA prefill forward (launch.h): the checks the kernel's loads need,
// the TMA maps of q, k and v, the parameter block, and the instantiation for (dtype, d_qk).
#include "cuda/sm90/mha_prefill/launch.h"

#include <cuda.h>

#include <cmath>
#include <cstdint>

#include <cute/numeric/numeric_types.hpp>

#include "core/str_cat.h"
#include "cuda/sm90/attention/launch.h"
#include "cuda/sm90/mha_prefill/params.h"

namespace openmla::cuda::sm90 {
namespace {

using attention::cuda_error;
using attention::strides_aligned;
using attention::strides_string;
using attention::tensor_map_dtype;
using attention::tensor_map_encoder;
using attention::tensor_map_strides;

constexpr const char* kOp = "mha_prefill";
constexpr int kBlockM = 128;  // query rows per CTA (traits.h)
constexpr int kPieceDims = 64;

template <typename... Parts>
Status invalid(const Parts&... parts) {
  return Status::InvalidArgument(core::str_cat(kOp, ": ", parts...));
}

// TMA reads rows of 16-byte aligned strides from a 16-byte aligned base (and the epilogue
// writes `out` with 16-byte stores): every stride but the last dim's a multiple of 8 elements.
Status check_aligned(const TensorView& t, const char* name) {
  if (strides_aligned(t, 8)) return Status::Ok();
  return invalid(name, ": the SM90 kernel needs a 16-byte aligned base address and strides that "
                 "are multiples of 8 elements (16 bytes) in every dim but the last; got strides ",
                 strides_string(t), " and base address ", reinterpret_cast<uintptr_t>(t.data),
                 " (make the tensor contiguous)");
}

// A [total, heads, dims] tensor as a 3-D map (dims, heads, total), boxes of 64 dims x 1 head x
// `rows` rows, 128 B swizzle (the GMMA K-major / MN-major SW128 layouts), zero fill past `total`.
Status encode_rows_map(const TensorView& t, const char* name, int rows, CUtensorMap* map) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) {
    return Status::CudaError(core::str_cat(kOp, ": ", name, ": cuTensorMapEncodeTiled is not "
                                           "available from the driver"));
  }
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(t.shape[2]),
                              static_cast<cuuint64_t>(t.shape[1]),
                              static_cast<cuuint64_t>(t.shape[0])};
  const int64_t given[2] = {t.strides[1], t.strides[0]};
  cuuint64_t strides[2];
  tensor_map_strides(dims, given, strides);
  const cuuint32_t box[3] = {kPieceDims, 1, static_cast<cuuint32_t>(rows)};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult res =
      encode(map, tensor_map_dtype(t.dtype), 3, t.data, dims, strides, box, element_strides,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (res != CUDA_SUCCESS) {
    return invalid(name, ": the TMA tensor map could not be encoded (CUresult ",
                   static_cast<int>(res), "; shape [", t.shape[0], ", ", t.shape[1], ", ",
                   t.shape[2], "], strides ", strides_string(t), ")");
  }
  return Status::Ok();
}

template <typename Element>
cudaError_t launch_for_dims(int d_qk, const MhaFwdParams& params, int m_blocks, int h_q,
                            int batch, cudaStream_t stream) {
  return d_qk == 192 ? launch_mha_fwd_kernel<Element, 192>(params, m_blocks, h_q, batch, stream)
                     : launch_mha_fwd_kernel<Element, 128>(params, m_blocks, h_q, batch, stream);
}

}  // namespace

Status mha_prefill_forward(const MhaPrefillArgs& args, const core::MhaPrefillShape& shape,
                           cudaStream_t stream) {
  if ((shape.d_qk != 192 && shape.d_qk != 128) || shape.d_v != 128) {
    return Status::NotImplemented(core::str_cat(
        kOp, ": the SM90 kernel runs d_qk 192 or 128 with d_v 128; got d_qk ", shape.d_qk,
        ", d_v ", shape.d_v));
  }
  if (args.q.dtype != DType::kBF16 && args.q.dtype != DType::kFP16) {
    return invalid("q: expected dtype bf16 or fp16");
  }
  // Nothing to compute or write: no query token (every sequence empty), or no sequence.
  if (shape.batch == 0 || shape.total_q == 0 || shape.max_seqlen_q == 0) return Status::Ok();
  if (shape.batch > 65535 || shape.h_q > 65535) {
    return Status::NotImplemented(core::str_cat(
        kOp, ": the SM90 grid holds at most 65535 sequences and 65535 query heads; got batch ",
        shape.batch, ", h_q ", shape.h_q));
  }
  if (shape.total_q > INT32_MAX || shape.total_kv > INT32_MAX ||
      shape.max_seqlen_q > INT32_MAX - kBlockM) {
    return Status::NotImplemented(core::str_cat(
        kOp, ": the SM90 kernel indexes tokens with 32-bit integers; got total_q ", shape.total_q,
        ", total_kv ", shape.total_kv, ", max_seqlen_q ", shape.max_seqlen_q));
  }
  OPENMLA_RETURN_IF_ERROR(check_aligned(args.q, "q"));
  OPENMLA_RETURN_IF_ERROR(check_aligned(args.out, "out"));
  if (shape.total_kv > 0) {
    OPENMLA_RETURN_IF_ERROR(check_aligned(args.k, "k"));
    OPENMLA_RETURN_IF_ERROR(check_aligned(args.v, "v"));
  }

  MhaFwdParams params = {};
  OPENMLA_RETURN_IF_ERROR(encode_rows_map(args.q, "q", 64, &params.tma_q));
  // With no key at all (every sequence's s_kv 0) no block is loaded and k / v have no rows to
  // map: their maps stay zero, never used.
  if (shape.total_kv > 0) {
    OPENMLA_RETURN_IF_ERROR(encode_rows_map(args.k, "k", 128, &params.tma_k));
    OPENMLA_RETURN_IF_ERROR(encode_rows_map(args.v, "v", 128, &params.tma_v));
  }
  params.cu_seqlens_q = args.cu_seqlens_q.data_as<const int32_t>();
  params.cu_seqlens_kv = args.cu_seqlens_kv.data_as<const int32_t>();
  params.cu_q_stride = args.cu_seqlens_q.strides[0];
  params.cu_kv_stride = args.cu_seqlens_kv.strides[0];
  params.out = args.out.data;
  params.out_stride_token = args.out.strides[0];
  params.out_stride_head = args.out.strides[1];
  params.lse = args.lse.data_as<float>();
  params.lse_stride_token = args.lse.strides[0];
  params.lse_stride_head = args.lse.strides[1];
  params.h_q = static_cast<int>(shape.h_q);
  params.group = static_cast<int>(shape.h_q / shape.h_kv);
  params.causal = args.causal ? 1 : 0;
  params.softmax_scale = shape.softmax_scale;
  params.scale_log2 = static_cast<float>(shape.softmax_scale * M_LOG2E);

  const int m_blocks = static_cast<int>((shape.max_seqlen_q + kBlockM - 1) / kBlockM);
  const int h_q = static_cast<int>(shape.h_q), batch = static_cast<int>(shape.batch);
  const int d_qk = static_cast<int>(shape.d_qk);
  const cudaError_t err =
      args.q.dtype == DType::kBF16
          ? launch_for_dims<cute::bfloat16_t>(d_qk, params, m_blocks, h_q, batch, stream)
          : launch_for_dims<cute::half_t>(d_qk, params, m_blocks, h_q, batch, stream);
  return cuda_error(kOp, "cudaLaunchKernelEx", err);
}

}  // namespace openmla::cuda::sm90
