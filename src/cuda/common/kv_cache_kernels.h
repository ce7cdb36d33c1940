// GPU KV-cache kernels (docs/semantics.md, KV-cache write; docs/formats.md): append tokens into a paged cache of any format and
// layout, gather/dequantise tokens out of one, and convert a cache (or a list of blocks) between
// formats/layouts. Every byte is the host codec's (src/core/codec.h): the device codec
// (kv_codec.cuh) mirrors it exactly, NaN payloads included.
//
// The launchers take validated arguments (core::validate_*), assume the tensors' device is the
// current one, enqueue one kernel on `stream` and return the launch's error. Invalid slots and
// block ids are skipped in the kernels (never read or written); an invalid gather slot gives a
// row of zeros.
#pragma once

#include <cuda_runtime.h>

#include "core/validate.h"
#include "core/validate_convert.h"
#include "openmla/kv_convert.h"
#include "openmla/ops.h"

namespace openmla::cuda {

Status kv_cache_write_launch(const KVCacheWriteArgs& args, const core::KVCacheWriteShape& shape,
                             cudaStream_t stream);
Status kv_cache_gather_launch(const KVCacheGatherArgs& args, const core::KVCacheWriteShape& shape,
                              cudaStream_t stream);
// Dequantises `cache`'s slots `slots[0 .. *live_count)` (d_qk dims, as validated) into bf16
// `rows` [capacity, d_qk] (dense), where `live_count` (device memory) is at most `capacity`: the gather of a list whose
// length is known only on the device (sparse prefill's compacting gather). Rows past the count
// are not written.
Status kv_cache_gather_listed_launch(const KVCache& cache, int64_t d_qk, const int32_t* slots,
                                     const int32_t* live_count, int64_t capacity, uint16_t* rows,
                                     cudaStream_t stream);
// The same list into sparse prefill's e4m3 rows (640 B: 512 codes of dims 0-511 and the 64
// RoPE dims as bf16, all divided by the row's power-of-two scale) and `scales` (2^e a row): the
// FP8 tensor-core path's keys (docs/semantics.md).
Status kv_cache_gather_listed_fp8_launch(const KVCache& cache, int64_t d_qk, const int32_t* slots,
                                         const int32_t* live_count, int64_t capacity,
                                         uint8_t* rows, float* scales, cudaStream_t stream);
Status kv_cache_convert_launch(const KVCacheConvertArgs& args,
                               const core::KVCacheConvertShape& shape, cudaStream_t stream);

// Self-check of the device codec's fast paths against its portable versions (which the CPU tests
// hold to src/core/codec.cc), on this GPU: all 2^32 floats through the hardware e4m3 (both bytes
// of a pair) and fp16 encoders, all 256 / 65536 codes through the e4m3 and fp16 decoders, and
// fp4's division-free element encoder against e2m1(x / scale) for all 2^32 floats and all 126
// scale codes (with the bf16 path's f16x2 encoder, group amax and scale code). Writes
// kKVCodecChecks pairs {mismatch count, smallest mismatching input} into `device_results`
// (2 * kKVCodecChecks uint64 in device memory, set by the launch); ~1 s.
// Checks: e4m3 encode lo, e4m3 encode hi, fp16 encode, e4m3 decode, fp16 decode, fp4 encode.
constexpr int kKVCodecChecks = 6;
cudaError_t launch_kv_codec_self_check(unsigned long long* device_results, cudaStream_t stream);

}  // namespace openmla::cuda
