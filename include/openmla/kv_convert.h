// KV-cache conversion between formats and layouts (docs/formats.md): e.g. an fp8_v32 cache into bf16
// for a prefill, or bf16 into fp8_mx. Every converted token is decode(src) then encode(dst), the
// bytes exactly those of the host codecs (codec::decode_slot, then codec::encode_slot); every
// byte of a converted dst token's data, scale and rope parts is written, nothing else in dst.
#pragma once

#include "openmla/kv_format.h"
#include "openmla/ops.h"
#include "openmla/status.h"
#include "openmla/tensor.h"

namespace openmla {

// The two caches have the same page size and dims per token (d_qk), and live on one device.
//
// Without block lists every block is converted: src block b into dst block b (num_blocks must be
// equal, and the two caches' memory must not overlap).
// With block lists, dst block dst_blocks[i] receives src block src_blocks[i] for every i, so
// blocks can move (one cache may be both src and dst, e.g. to compact it, as long as no block is
// both read and written). A pair with an entry of -1 is skipped. Other ids outside
// [0, num_blocks) are an error on the CPU (which can read them while validating) and skipped on
// the GPU, never read or written. A dst block named twice: which source lands is unspecified.
struct KVCacheConvertArgs {
  KVCache src;
  KVCache dst;
  TensorView src_blocks;  // optional [n] int32|int64, on the caches' device
  TensorView dst_blocks;  // optional [n] int32|int64, given together with src_blocks
};

Status kv_cache_convert(const KVCacheConvertArgs& args, Stream stream = nullptr);

}  // namespace openmla
