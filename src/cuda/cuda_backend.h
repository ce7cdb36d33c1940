// The GPU backend's entry points, called by src/api once arguments are validated. Each dispatches
// on the device's arch and on the shapes to a kernel family under sm90/, or returns
// NotImplemented naming what was asked and what exists. Built only with OPENMLA_ENABLE_CUDA.
#pragma once

#include "core/validate.h"
#include "core/validate_mha.h"
#include "core/validate_convert.h"
#include "core/validate_fused.h"
#include "openmla/kv_convert.h"
#include "openmla/ops.h"

namespace openmla::cuda {

Status dense_decode(const DenseDecodeArgs& args, const core::DenseDecodeShape& shape, Stream stream);
size_t dense_decode_workspace_size(int device_index, int batch, int s_q, int h_q, int h_kv, int d_v);
size_t sparse_decode_workspace_size(int device_index, int batch, int s_q, int h_q, int d_v);
Status sparse_decode(const SparseDecodeArgs& args, const core::SparseDecodeShape& shape,
                     Stream stream);
size_t sparse_prefill_workspace_size(int device_index, int s_q, int h_q, int d_v);
Status sparse_prefill(const SparsePrefillArgs& args, const core::SparsePrefillShape& shape,
                      Stream stream);
// Sparse prefill from a quantised cache with each named slot dequantised once: its workspace,
// whether a call takes it (else src/api runs the direct path, sparse decode), and the call.
size_t sparse_prefill_cache_workspace_size(int device_index, int s_q, int h_q, int d_v,
                                           int64_t topk, const KVCache& kv_cache);
bool sparse_prefill_dequantizes_once(const SparsePrefillArgs& args,
                                     const core::SparsePrefillShape& shape);
Status sparse_prefill_dequant_once(const SparsePrefillArgs& args,
                                   const core::SparsePrefillShape& shape, Stream stream);
// Sparse prefill from a quantised cache on FP8 tensor cores (args.fp8_tensor_cores).
Status sparse_prefill_fp8(const SparsePrefillArgs& args, const core::SparsePrefillShape& shape,
                          Stream stream);
// The fused V4 attention (include/openmla/fused_attention.h).
size_t fused_workspace_size(int device_index, int64_t s_q, int64_t h_q);
Status fused_prefill(const FusedPrefillArgs& args, const core::FusedShape& shape, Stream stream);
Status fused_decode(const FusedDecodeArgs& args, const core::FusedShape& shape, Stream stream);
Status merge_attention_states(const MergeStatesArgs& args, const core::MergeStatesShape& shape,
                              Stream stream);
Status kv_cache_write(const KVCacheWriteArgs& args, const core::KVCacheWriteShape& shape,
                      Stream stream);
Status kv_cache_gather(const KVCacheGatherArgs& args, const core::KVCacheWriteShape& shape,
                       Stream stream);
Status kv_cache_convert(const KVCacheConvertArgs& args, const core::KVCacheConvertShape& shape,
                        Stream stream);
Status plan_decode_schedule(const DecodeScheduleArgs& args, const core::DecodeScheduleShape& shape,
                            Stream stream);
Status decode_num_sm_parts(int device_index, int s_q, int h_q, int h_kv, int* num_sm_parts);
Status device_arch(int device_index, int* sm_arch);
// Dense MHA prefill forward (mha_backend.cc: the SM90 kernel of sm90/mha_prefill/).
Status mha_prefill(const MhaPrefillArgs& args, const core::MhaPrefillShape& shape, Stream stream);

}  // namespace openmla::cuda
