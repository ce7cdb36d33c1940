// Host side of the SM90 dense decode family (launch.h): checks what the kernel needs beyond
// core validation, lays out the workspace, plans the schedule when none is given, encodes the
// paged cache's TMA map and launches decode + combine.
#include "cuda/sm90/dense_decode/launch.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cmath>
#include <string>

#include <cute/numeric/numeric_types.hpp>

#include "core/schedule.h"
#include "core/str_cat.h"
#include "cuda/common/combine.h"
#include "cuda/common/decode_schedule.h"
#include "cuda/common/sm_parts.h"
#include "cuda/sm90/attention/launch.h"
#include "cuda/sm90/attention/supported.h"
#include "cuda/sm90/dense_decode/params.h"
#include "cuda/sm90/dense_decode/tuning.h"

namespace openmla::cuda::sm90 {
namespace {

using attention::cuda_error;
using attention::strides_aligned;
using attention::strides_string;
using attention::tensor_map_dtype;
using attention::tensor_map_encoder;
using attention::tensor_map_strides;

constexpr const char* kOp = "dense_decode";
constexpr int kBlockTokens = 64;  // split boundaries fall on key tiles

struct WorkspaceLayout {
  size_t metadata = 0, num_splits = 0, lse_accum = 0, o_accum = 0, total = 0;
};

WorkspaceLayout workspace_layout(int64_t batch, int64_t s_q, int64_t h_q, int64_t h_kv,
                                 int64_t d_v, int64_t parts) {
  const int64_t splits = core::max_schedule_splits(batch, parts);
  attention::WorkspaceCarver carver;
  WorkspaceLayout w;
  w.metadata = carver.take(sizeof(int32_t) * parts * kScheduleMetadataInts);
  w.num_splits = carver.take(sizeof(int32_t) * (batch + 1));
  w.lse_accum = carver.take(sizeof(float) * splits * s_q * h_q);
  // A block per (partial slot, kv head, m-block) of the 16-row groups that hold a query row:
  // the decode kernel stores a CTA's accumulator as it lies in registers (combine.h).
  const int64_t rows_kv = s_q * (h_q / h_kv);
  const int64_t m_blocks = (rows_kv + 63) / 64;
  w.o_accum = carver.take(sizeof(float) * core::max_partial_slots(parts) * h_kv * m_blocks *
                          core::partial_block_floats(static_cast<int>(rows_kv), d_v));
  w.total = carver.total;
  return w;
}

template <typename... Parts>
Status invalid(const Parts&... parts) {
  return Status::InvalidArgument(core::str_cat("dense_decode: ", parts...));
}

template <typename... Parts>
Status not_implemented(const Parts&... parts) {
  return Status::NotImplemented(core::str_cat("dense_decode: ", parts...));
}

// The cache as (dim, token-in-page, kv head, block).
Status encode_cache_map(const TensorView& k, const core::DenseDecodeShape& shape, void* fallback,
                        int promotion_bytes, CUtensorMap* map) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) {
    return Status::CudaError("dense_decode: cuTensorMapEncodeTiled is not available from the driver");
  }
  cuuint64_t dims[4] = {static_cast<cuuint64_t>(shape.d_qk), static_cast<cuuint64_t>(shape.page_size),
                        static_cast<cuuint64_t>(shape.h_kv),
                        static_cast<cuuint64_t>(shape.num_blocks > 0 ? shape.num_blocks : 1)};
  cuuint64_t strides[3];
  tensor_map_strides(dims, {k.strides[1], k.strides[2], k.strides[0]}, strides);
  void* base = shape.num_blocks > 0 && k.data != nullptr ? k.data : fallback;
  // Boxes of 64 dims x 64 keys (one tile piece), or x page_size keys for smaller pages.
  cuuint32_t box[4] = {64, static_cast<cuuint32_t>(shape.page_size < 64 ? shape.page_size : 64), 1, 1};
  cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUtensorMapL2promotion promotion =
      promotion_bytes >= 256   ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B
      : promotion_bytes >= 128 ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B
      : promotion_bytes >= 64  ? CU_TENSOR_MAP_L2_PROMOTION_L2_64B
                               : CU_TENSOR_MAP_L2_PROMOTION_NONE;
  const CUresult res = encode(map, tensor_map_dtype(k.dtype), 4, base, dims, strides, box, element_strides,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, promotion,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (res != CUDA_SUCCESS) {
    return invalid("k_cache: the TMA tensor map could not be encoded (CUresult ", static_cast<int>(res),
                   ") for shape ", k.shape_string(), " and strides ", strides_string(k));
  }
  return Status::Ok();
}

// q as (dim, head in group, kv head, token, request) for TMA (params.h tma_q): only when one box
// is a whole Q piece (the group divides 64 or 64 divides it). Returns false to keep the
// compute threads' loads.
// q [b, s_q, h_q, dims] (or out, dims 512) as a 5-D map whose box is one 64-row x 64-dim piece
// of a CTA's rows (params.h tma_q); false where the group or the strides do not allow one.
bool encode_rows_map(const TensorView& q, int64_t dims_last, const core::DenseDecodeShape& shape,
                     int64_t group, CUtensorMap* map) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr || q.data == nullptr || !(group % 64 == 0 || 64 % group == 0)) return false;
  if (q.strides[3] != 1) return false;
  cuuint64_t dims[5] = {static_cast<cuuint64_t>(dims_last), static_cast<cuuint64_t>(group),
                        static_cast<cuuint64_t>(shape.h_kv), static_cast<cuuint64_t>(shape.s_q),
                        static_cast<cuuint64_t>(shape.batch)};
  cuuint64_t strides[4];
  tensor_map_strides(dims, {q.strides[2], q.strides[2] * group, q.strides[1], q.strides[0]},
                     strides);
  const cuuint32_t heads = static_cast<cuuint32_t>(group < 64 ? group : 64);
  cuuint32_t box[5] = {64, heads, 1, 64 / heads, 1};
  cuuint32_t element_strides[5] = {1, 1, 1, 1, 1};
  return encode(map, tensor_map_dtype(q.dtype), 5, q.data, dims, strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The kernel of (dtype, d_qk), from the one list of what the family serves (supported.h).
cudaError_t launch_kernel(DType dtype, int64_t d_qk, const DenseDecodeParams& params,
                          int m_blocks, int h_kv, int parts, cudaStream_t stream) {
#define OPENMLA_LAUNCH_IF(dtype_, element, d_qk_)                                              \
  if (dtype == DType::dtype_ && d_qk == d_qk_) {                                             \
    return launch_dense_decode_kernel<element, d_qk_>(params, m_blocks, h_kv, parts, stream); \
  }
  OPENMLA_SM90_DENSE_DECODE_KERNELS(OPENMLA_LAUNCH_IF)
#undef OPENMLA_LAUNCH_IF
  return cudaErrorInvalidValue;  // the backend's dispatch let through a shape with no kernel
}

}  // namespace

size_t dense_decode_workspace_bytes(int batch, int s_q, int h_q, int h_kv, int d_v,
                                    int num_sm_parts) {
  return workspace_layout(batch, s_q, h_q, h_kv, d_v, num_sm_parts).total;
}

size_t dense_decode_workspace_size(int device_index, int batch, int s_q, int h_q, int h_kv,
                                   int d_v) {
  attention::DeviceFacts facts;
  if (!attention::device_facts(kOp, device_index, &facts).ok() || h_kv < 1) return 0;
  const int parts = decode_sm_parts_for(facts.num_sms, s_q, h_q, h_kv);
  return dense_decode_workspace_bytes(batch, s_q, h_q, h_kv, d_v, parts);
}

namespace {

// The launch proper, with `tuning`'s settings (the production entry passes the defaults).
Status launch_dense_decode(const DenseDecodeArgs& args, const core::DenseDecodeShape& shape,
                           const DenseDecodeTuning& tuning, cudaStream_t stream) {
  if (shape.batch == 0) return Status::Ok();
  // The device is an SM90 GPU (the backend checked, attention::require_sm90); its SM count is
  // read once per process.
  attention::DeviceFacts facts;
  OPENMLA_RETURN_IF_ERROR(attention::device_facts(kOp, shape.device.index, &facts));
  const int64_t page_size = shape.page_size;
  if (!(page_size == 8 || page_size == 16 || page_size == 32 ||
        (page_size % 64 == 0 && page_size <= (int64_t{1} << 30)))) {
    return not_implemented("k_cache: page_size ", page_size,
                           " is not supported by the SM90 kernel (supported: 8, 16, 32 and "
                           "multiples of 64)");
  }
  if (!strides_aligned(args.k_cache, 8)) {
    return invalid("k_cache: strides must be multiples of 16 bytes (8 elements) and the data "
                   "16-byte aligned for TMA; got strides ", strides_string(args.k_cache),
                   " (elements of 2 bytes)");
  }
  if (!strides_aligned(args.q, 8)) {
    return invalid("q: strides must be multiples of 8 elements and the data 16-byte aligned; got "
                   "strides ", strides_string(args.q));
  }
  if (!strides_aligned(args.out, 2)) {
    return invalid("out: strides must be multiples of 2 elements and the data 4-byte aligned; got "
                   "strides ", strides_string(args.out));
  }
  if (shape.batch > 65535) return not_implemented("batch ", shape.batch, " > 65535");
  if (shape.max_blocks * page_size > INT32_MAX) {
    return not_implemented("block_table: max_blocks * page_size above 2^31 keys");
  }
  const int sms = facts.num_sms;

  const bool plan_here = !args.schedule.metadata.defined();
  // A caller's schedule: one CTA a worker on the grid's z, which holds at most 65535.
  constexpr int64_t kMaxScheduleRows = 65535;
  if (!plan_here && args.schedule.metadata.shape[0] > kMaxScheduleRows) {
    return invalid("schedule.metadata: ", args.schedule.metadata.shape[0],
                   " rows (workers), at most ", kMaxScheduleRows);
  }
  const int parts = plan_here ? decode_sm_parts_for(sms, static_cast<int>(shape.s_q),
                                                    static_cast<int>(shape.h_q),
                                                    static_cast<int>(shape.h_kv))
                              : static_cast<int>(args.schedule.metadata.shape[0]);
  if (parts < 1) return invalid("schedule.metadata: expected at least one row");
  if (plan_here && parts > kMaxPlannerSmParts) {
    return not_implemented("num_sm_parts ", parts, " above the GPU planner's ", kMaxPlannerSmParts);
  }
  const WorkspaceLayout layout =
      workspace_layout(shape.batch, shape.s_q, shape.h_q, shape.h_kv, shape.d_v, parts);
  if (args.workspace.bytes < layout.total || args.workspace.data == nullptr ||
      reinterpret_cast<uintptr_t>(args.workspace.data) % 16 != 0) {
    return invalid("workspace: expected at least ", layout.total,
                   " bytes, 16-byte aligned (dense_decode_workspace_size, for ", parts,
                   " schedule workers), got ", args.workspace.bytes, " bytes at ",
                   args.workspace.data);
  }
  char* ws = static_cast<char*>(args.workspace.data);

  DenseDecodeParams params = {};
  if (plan_here) {
    DecodeSchedulePlan plan;
    plan.seqlens = args.cache_seqlens.data_as<const int32_t>();
    plan.seqlens_stride = args.cache_seqlens.strides[0];
    plan.batch = static_cast<int>(shape.batch);
    plan.num_sm_parts = parts;
    plan.block_tokens = kBlockTokens;
    plan.split_overhead_blocks = core::kScheduleSplitOverheadBlocks;
    plan.combine_blocks = core::kScheduleCombineBlocks;
    plan.metadata = reinterpret_cast<int32_t*>(ws + layout.metadata);
    plan.metadata_stride_part = kScheduleMetadataInts;
    plan.metadata_stride_field = 1;
    plan.num_splits = reinterpret_cast<int32_t*>(ws + layout.num_splits);
    plan.num_splits_stride = 1;
    OPENMLA_RETURN_IF_ERROR(
        cuda_error(kOp, "schedule launch", launch_plan_decode_schedule(plan, stream)));
    params.metadata = plan.metadata;
    params.metadata_stride_part = kScheduleMetadataInts;
    params.metadata_stride_field = 1;
    params.num_splits = plan.num_splits;
    params.num_splits_stride = 1;
  } else {
    params.metadata = args.schedule.metadata.data_as<const int32_t>();
    params.metadata_stride_part = args.schedule.metadata.strides[0];
    params.metadata_stride_field = args.schedule.metadata.strides[1];
    params.num_splits = args.schedule.num_splits.data_as<const int32_t>();
    params.num_splits_stride = args.schedule.num_splits.strides[0];
  }

  const int m_blocks = static_cast<int>((shape.s_q * (shape.h_q / shape.h_kv) + 63) / 64);
  const int promotion = tuning.l2_promotion >= 0 ? tuning.l2_promotion : (m_blocks == 1 ? 128 : 256);
  OPENMLA_RETURN_IF_ERROR(encode_cache_map(args.k_cache, shape, ws, promotion, &params.tma_k));
  params.q_tma = tuning.q_tma != 0 &&
                 encode_rows_map(args.q, shape.d_qk, shape, shape.h_q / shape.h_kv, &params.tma_q);
  params.q = args.q.data;
  params.q_stride_b = args.q.strides[0];
  params.q_stride_s = args.q.strides[1];
  params.q_stride_h = args.q.strides[2];
  params.out = args.out.data;
  params.out_stride_b = args.out.strides[0];
  params.out_stride_s = args.out.strides[1];
  params.out_stride_h = args.out.strides[2];
  params.output_stores = tuning.output_stores == 2 && !strides_aligned(args.out, 8)
                             ? 1
                             : tuning.output_stores;
  params.out_tma = tuning.out_tma != 0 && params.q_tma && params.output_stores == 2 &&
                   encode_rows_map(args.out, shape.d_v, shape, shape.h_q / shape.h_kv,
                                   &params.tma_out);
  params.q_prefetch = tuning.q_prefetch != 0 && params.q_tma;
  params.q_issuers = tuning.q_issuers < 1 ? 1 : (tuning.q_issuers > 8 ? 8 : tuning.q_issuers);
  params.lse = args.lse.data_as<float>();
  params.lse_stride_b = args.lse.strides[0];
  params.lse_stride_h = args.lse.strides[1];
  params.lse_stride_s = args.lse.strides[2];
  params.block_table = args.block_table.data_as<const int32_t>();
  params.block_table_stride_b = args.block_table.strides[0];
  params.block_table_stride_n = args.block_table.strides[1];
  params.seqlens = args.cache_seqlens.data_as<const int32_t>();
  params.seqlens_stride = args.cache_seqlens.strides[0];
  params.lse_accum = reinterpret_cast<float*>(ws + layout.lse_accum);
  params.o_accum = reinterpret_cast<float*>(ws + layout.o_accum);
  params.max_splits = static_cast<int>(core::max_schedule_splits(shape.batch, parts));
  params.max_slots = static_cast<int>(core::max_partial_slots(parts));
  params.batch = static_cast<int>(shape.batch);
  params.s_q = static_cast<int>(shape.s_q);
  params.h_q = static_cast<int>(shape.h_q);
  params.h_kv = static_cast<int>(shape.h_kv);
  params.group = static_cast<int>(shape.h_q / shape.h_kv);
  params.rows = params.s_q * params.group;
  params.m_blocks = m_blocks;
  params.row_groups = core::partial_row_groups(params.rows);
  params.page_size = static_cast<int>(page_size);
  params.page_shift = page_size == 8 ? 3 : page_size == 16 ? 4 : page_size == 32 ? 5 : 0;
  params.capacity = shape.num_blocks > 0 && args.k_cache.data != nullptr
                        ? shape.max_blocks * page_size : 0;
  params.scale = shape.softmax_scale;
  params.scale_log2 = shape.softmax_scale * static_cast<float>(M_LOG2E);
  params.causal = args.causal ? 1 : 0;
  // Several m-blocks share each tile: evict-first (since v20's order, measured faster than
  // normal at every length). One CTA per kv block read: evict-first for short requests, normal
  // for long ones (measured, launch.h).
  constexpr uint64_t kEvictFirst = 0x12F0000000000000ull, kEvictNormal = 0x1000000000000000ull;
  if (tuning.evict_first >= 0) {
    params.cache_hint = params.cache_hint_long = tuning.evict_first == 1 ? kEvictFirst : kEvictNormal;
  } else {
    params.cache_hint = kEvictFirst;
    params.cache_hint_long = m_blocks == 1 ? kEvictNormal : kEvictFirst;
  }
  if (tuning.kv_cache_hint != 0) params.cache_hint = params.cache_hint_long = tuning.kv_cache_hint;
  params.long_from = tuning.evict_normal_from;
  params.trace = tuning.trace;
  params.trace_pairs = tuning.trace != nullptr ? tuning.trace_pairs : 0;

  OPENMLA_RETURN_IF_ERROR(cuda_error(
      kOp, "kernel launch",
      launch_kernel(args.q.dtype, shape.d_qk, params, m_blocks, params.h_kv, parts, stream)));

  if (tuning.skip_combine != 0) return Status::Ok();
  DecodeCombineParams combine;
  combine.lse_accum = params.lse_accum;
  combine.o_accum = params.o_accum;
  combine.max_splits = params.max_splits;
  combine.max_slots = params.max_slots;
  combine.num_splits = params.num_splits;
  combine.num_splits_stride = params.num_splits_stride;
  combine.out = params.out;
  combine.out_stride_b = params.out_stride_b;
  combine.out_stride_s = params.out_stride_s;
  combine.out_stride_h = params.out_stride_h;
  combine.lse = params.lse;
  combine.lse_stride_b = params.lse_stride_b;
  combine.lse_stride_h = params.lse_stride_h;
  combine.lse_stride_s = params.lse_stride_s;
  combine.batch = params.batch;
  combine.s_q = params.s_q;
  combine.h_q = params.h_q;
  combine.h_kv = params.h_kv;
  combine.out_16B = strides_aligned(args.out, 8);
  combine.warps_per_row = decode_combine_warps_per_row(params.batch, parts);
  return cuda_error(kOp, "combine launch",
                    launch_decode_combine(combine, args.q.dtype, stream, tuning.combine_pdl != 0));
}

}  // namespace

Status dense_decode(const DenseDecodeArgs& args, const core::DenseDecodeShape& shape,
                    cudaStream_t stream) {
  static constexpr DenseDecodeTuning kMeasuredBest{};
  return launch_dense_decode(args, shape, kMeasuredBest, stream);
}

Status dense_decode_with_tuning(const DenseDecodeArgs& args, const DenseDecodeTuning& tuning,
                                cudaStream_t stream) {
  core::DenseDecodeShape shape;
  OPENMLA_RETURN_IF_ERROR(core::validate_dense_decode(args, &shape));
  attention::DeviceFacts facts;
  OPENMLA_RETURN_IF_ERROR(attention::require_sm90(kOp, shape.device, &facts));
  attention::DeviceGuard guard;
  OPENMLA_RETURN_IF_ERROR(guard.enter(kOp, shape.device.index));
  return launch_dense_decode(args, shape, tuning, stream);
}

}  // namespace openmla::cuda::sm90
