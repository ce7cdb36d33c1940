// KV-cache append, gather and convert: one kernel shape for all three. A warp owns one token at a
// time (grid-stride over tokens): it decodes the source token into registers (lane l holds dims
// 16l..16l+15, plus 512+2l and 513+2l for 576-dim tokens; see kv_codec.cuh), reduces each scale
// group's finite amax with warp shuffles (groups fall on lane boundaries: 8, 4, 2 or 1 lanes),
// and encodes the destination token. Sources and destinations are "codecs": a cache format, or a
// dense bf16/fp32 row (the write's input, the gather's output).
//
// The work is memory-bound (0.3–1.8 KB and ~150–350 warp instructions per token; NOTES.md has
// the budget): each lane issues its token's loads back to back (one contiguous run per warp and
// part, 16 B per lane where the layout's alignment allows), and enough warps are resident (32–40
// per SM) to keep the ~30 KB per SM in flight that HBM3e needs. Layouts are runtime descriptors
// (offsets, strides, block stride); alignment is checked per access, uniformly across a warp.
#include <cuda_bf16.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>

#include "core/fp8_row_scale.h"
#include "cuda/common/kv_cache_kernels.h"
#include "cuda/common/kv_codec.cuh"
#include "cuda/common/kv_codec_dispatch.cuh"
#include "cuda/sm90/attention/launch.h"

namespace openmla::cuda {
namespace {

using kvcodec::Codec;
using kvcodec::CodecTag;
using sm90::attention::cuda_error;
using sm90::attention::device_facts;
using sm90::attention::DeviceFacts;
using kvcodec::ConstTokenPtr;
using kvcodec::LaneVals;
using kvcodec::TokenPtr;

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;
// 4 resident blocks (32 warps) per SM at least: a register cap of 64, which every instantiation
// fits without spilling. The grid is exactly what is resident (the occupancy API's count per
// kernel: 4 or 5 blocks per SM), so the grid-stride loop runs one balanced wave.
constexpr int kMinBlocksPerSm = 4;

// A paged cache as the kernels see it (all in bytes).
struct CacheView {
  uint8_t* base;
  int64_t block_stride;
  int64_t data_offset, data_stride, scale_offset, scale_stride, rope_offset, rope_stride;
  int64_t num_blocks, num_slots;
  int32_t page_size;
};

CacheView make_view(const KVCache& cache) {
  const KVLayout& l = cache.layout;
  return {static_cast<uint8_t*>(cache.data),
          l.block_stride,
          l.data_offset,
          l.data_stride,
          l.scale_offset,
          l.scale_stride,
          l.rope_offset,
          l.rope_stride,
          cache.num_blocks,
          cache.num_tokens(),
          l.page_size};
}

// An int32/int64 vector (slots or block ids) with its element stride.
struct IndexList {
  const void* data;
  int64_t stride;
  bool is_int64;
};

IndexList make_index_list(const TensorView& t) {
  return {t.data, t.rank > 0 ? t.strides[0] : 1, t.dtype == DType::kInt64};
}

__device__ __forceinline__ int64_t index_at(const IndexList& list, int64_t i) {
  const int64_t offset = i * list.stride;
  return list.is_int64
             ? static_cast<int64_t>(__ldg(static_cast<const long long*>(list.data) + offset))
             : static_cast<int64_t>(__ldg(static_cast<const int*>(list.data) + offset));
}

template <typename Byte>
__device__ __forceinline__ kvcodec::TokenPtrT<Byte> token_at(const CacheView& c, int64_t block,
                                                             int64_t token) {
  Byte* b = c.base + block * c.block_stride;
  return {b + c.data_offset + token * c.data_stride, b + c.scale_offset + token * c.scale_stride,
          b + c.rope_offset + token * c.rope_stride};
}

// q = x / d, r = x - q * d for 0 <= x; 32-bit when the caller knows x and d fit (the common case:
// 64-bit division is ~5x the instructions).
__device__ __forceinline__ void div_mod(int64_t x, int64_t d, bool fits_32, int64_t* q,
                                        int64_t* r) {
  if (fits_32) {
    const uint32_t q32 = static_cast<uint32_t>(x) / static_cast<uint32_t>(d);
    *q = q32;
    *r = x - static_cast<int64_t>(q32) * d;
  } else {
    *q = x / d;
    *r = x - *q * d;
  }
}

// Tokens a warp converts at a time, 32 / that many lanes each. Two for bf16 512 -> fp4, the one
// issue-bound conversion: its lanes hold whole fp4 groups (no shuffles), so a half-warp per token
// shares the loop's index and address math between two tokens and puts both tokens' loads in
// flight at once (NOTES.md, tuning log, Change 3). One for every other pair.
template <Codec Src, Codec Dst, int D>
constexpr int convert_tokens_per_warp() {
  return Src == Codec::kBF16 && Dst == Codec::kFP4 ? 2 : 1;
}

// One token: decode `src` (zeros when !have_src), reduce the scale groups' amax, encode `dst`.
// kLanes lanes share the token (`lane` < kLanes); all 32 unless the codec pair needs no shuffles
// (convert_tokens_per_warp). Every lane of the warp must call it (the shuffles use the full mask).
template <Codec Src, Codec Dst, int D, int kLanes = 32>
__device__ __forceinline__ void transcode(bool have_src, const ConstTokenPtr& src,
                                          const TokenPtr& dst, int lane) {
  constexpr bool kBf16ToFp4 = Src == Codec::kBF16 && Dst == Codec::kFP4;
  static_assert(kLanes == 32 || kBf16ToFp4, "only bf16 -> fp4 shares a warp between tokens");
  if constexpr (kBf16ToFp4) {
    // bf16 -> fp4 encodes from the source bits, two elements per f16x2 instruction (the float
    // path was ALU/issue-bound; NOTES.md, tuning log). Appends and conversions only, which always
    // have a source (gathers write dense rows).
    kvcodec::transcode_lane_fp4_from_bf16<kLanes>(src.data, dst, lane);
    return;
  }
  LaneVals v;
  if (have_src) {
    kvcodec::decode_lane<Src, D>(src, lane, v);
  } else {
#pragma unroll
    for (int i = 0; i < 16; ++i) v.main[i] = 0.0f;
    v.tail[0] = v.tail[1] = 0.0f;
  }
  float amax = 0.0f;
  if constexpr (kvcodec::group_lanes<Dst>() > 0) {
    amax = kvcodec::lane_amax<Dst>(v, lane);
#pragma unroll
    for (int m = 1; m < kvcodec::group_lanes<Dst>(); m <<= 1) {
      amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, m));  // exact: no NaN reaches it
    }
  }
  kvcodec::encode_lane<Dst, D>(dst, lane, v, amax);
}

// The lane's index among the kLanes lanes that share its token (the warp's lane for 32).
template <int kLanes = 32>
__device__ __forceinline__ int lane_id() {
  return static_cast<int>(threadIdx.x & (kLanes - 1));
}
__device__ __forceinline__ int64_t first_warp() {
  return static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
}
__device__ __forceinline__ int64_t warp_step() {
  return static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
}

// --- append ------------------------------------------------------------------------------------
struct WriteParams {
  const uint8_t* kv;  // [n, d_qk] bf16|fp32 rows
  int64_t kv_row_bytes;
  IndexList slots;
  int64_t num_tokens;
  CacheView cache;
  bool slots_fit_32;  // num_slots <= 2^32: slot / page_size in 32 bits
};

template <Codec Src, Codec Dst, int D>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm) kv_write_kernel(const WriteParams p) {
  const int lane = lane_id();
  for (int64_t i = first_warp(); i < p.num_tokens; i += warp_step()) {
    const int64_t slot = index_at(p.slots, i);
    if (slot < 0 || slot >= p.cache.num_slots) continue;  // -1 and out of range: skipped
    int64_t block, token;
    div_mod(slot, p.cache.page_size, p.slots_fit_32, &block, &token);
    const ConstTokenPtr src{p.kv + i * p.kv_row_bytes, nullptr, nullptr};
    transcode<Src, Dst, D>(true, src, token_at<uint8_t>(p.cache, block, token), lane);
  }
}

// --- gather ------------------------------------------------------------------------------------
struct GatherParams {
  CacheView cache;
  IndexList slots;
  uint8_t* out;  // [n, d_qk] fp32|bf16 rows
  int64_t out_row_bytes;
  int64_t num_tokens;
  bool slots_fit_32;
  const int32_t* live_count;  // optional: on the device, the rows to write (at most num_tokens)
};

template <Codec Src, Codec Dst, int D>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    kv_gather_kernel(const GatherParams p) {
  const int lane = lane_id();
  const int64_t n =
      p.live_count ? min(p.num_tokens, static_cast<int64_t>(*p.live_count)) : p.num_tokens;
  for (int64_t i = first_warp(); i < n; i += warp_step()) {
    const int64_t slot = index_at(p.slots, i);
    const bool valid = slot >= 0 && slot < p.cache.num_slots;  // invalid: a row of zeros
    ConstTokenPtr src{nullptr, nullptr, nullptr};
    if (valid) {
      int64_t block, token;
      div_mod(slot, p.cache.page_size, p.slots_fit_32, &block, &token);
      src = token_at<const uint8_t>(p.cache, block, token);
    }
    const TokenPtr dst{p.out + i * p.out_row_bytes, nullptr, nullptr};
    transcode<Src, Dst, D>(valid, src, dst, lane);
  }
}

// --- gather into e4m3 rows (sparse prefill's FP8 tensor-core path) ------------------------------
// Row i: the listed slot's dims, rounded to bf16 (what every GPU path computes with), divided by
// 2^e_i (core::fp8_row_exponent of the amax of dims 0-511) as 512 e4m3 codes, then the 64 RoPE
// dims (d_qk - 64 ..) / 2^e_i as bf16, 640 B a row; scales[i] = 2^e_i. Exact divisions: powers
// of two. (docs/semantics.md, the FP8 tensor-core path.)
struct Fp8RowsParams {
  CacheView cache;
  IndexList slots;
  uint8_t* rows;
  float* scales;
  int64_t num_tokens;
  bool slots_fit_32;
  const int32_t* live_count;  // on the device: the rows to write (at most num_tokens)
};

template <Codec Src, Codec Dst, int D>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    kv_gather_fp8_rows_kernel(const Fp8RowsParams p) {
  const int lane = lane_id();
  const int64_t n = min(p.num_tokens, static_cast<int64_t>(*p.live_count));
  for (int64_t i = first_warp(); i < n; i += warp_step()) {
    const int64_t slot = index_at(p.slots, i);
    const bool valid = slot >= 0 && slot < p.cache.num_slots;  // (listed slots always are)
    LaneVals v;
    if (valid) {
      int64_t block, token;
      div_mod(slot, p.cache.page_size, p.slots_fit_32, &block, &token);
      kvcodec::decode_lane<Src, D>(token_at<const uint8_t>(p.cache, block, token), lane, v);
    } else {
#pragma unroll
      for (int k = 0; k < 16; ++k) v.main[k] = 0.0f;
      v.tail[0] = v.tail[1] = 0.0f;
    }
    float amax = 0.0f;
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      v.main[k] = __bfloat162float(__float2bfloat16_rn(v.main[k]));
      amax = fmaxf(amax, fabsf(v.main[k]));  // (fmaxf drops a NaN)
    }
#pragma unroll
    for (int m = 1; m < 32; m <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, m));
    const int e = core::fp8_row_exponent(amax);
    const float inv = core::fp8_pow2(-e);
    uint8_t* row = p.rows + i * 640;
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      w[k] = kvcodec::float2_to_e4m3x2(v.main[4 * k] * inv, v.main[4 * k + 1] * inv) |
             kvcodec::float2_to_e4m3x2(v.main[4 * k + 2] * inv, v.main[4 * k + 3] * inv) << 16;
    }
    *reinterpret_cast<uint4*>(row + 16 * lane) = make_uint4(w[0], w[1], w[2], w[3]);
    if constexpr (D == 576) {  // this lane's RoPE dims: 512 + 2 lane, 513 + 2 lane
      const float r0 = __bfloat162float(__float2bfloat16_rn(v.tail[0])) * inv;
      const float r1 = __bfloat162float(__float2bfloat16_rn(v.tail[1])) * inv;
      const __nv_bfloat162 h = __floats2bfloat162_rn(r0, r1);
      *reinterpret_cast<uint32_t*>(row + 512 + 4 * lane) = *reinterpret_cast<const uint32_t*>(&h);
    } else if (lane >= 28) {  // dims 448 + 16 (lane - 28) ..: the RoPE part, also in the codes
      uint32_t r[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(v.main[2 * k] * inv, v.main[2 * k + 1] * inv);
        r[k] = *reinterpret_cast<const uint32_t*>(&h);
      }
      uint4* dst = reinterpret_cast<uint4*>(row + 512 + 32 * (lane - 28));
      dst[0] = make_uint4(r[0], r[1], r[2], r[3]);
      dst[1] = make_uint4(r[4], r[5], r[6], r[7]);
    }
    if (lane == 0) p.scales[i] = core::fp8_pow2(e);
  }
}

// --- convert -----------------------------------------------------------------------------------
struct ConvertParams {
  CacheView src, dst;
  IndexList src_blocks, dst_blocks;  // used when block_lists
  bool block_lists;
  int64_t num_tokens;  // block pairs * page_size
  bool tokens_fit_32;
};

template <Codec Src, Codec Dst, int D>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    kv_convert_kernel(const ConvertParams p) {
  // A warp takes kTokens consecutive tokens at a time, kLanes lanes each. With two, the halves may
  // fall in different blocks (odd page sizes), differ in alignment, or one may be past the end:
  // every lane keeps its own token below, and the halves simply diverge there.
  constexpr int kTokens = convert_tokens_per_warp<Src, Dst, D>();
  constexpr int kLanes = 32 / kTokens;
  const int lane = lane_id<kLanes>();
  // (pair, token) of t = pair * page_size + token, stepped by the grid stride without a division
  // per token.
  const int64_t page = p.src.page_size;
  const int64_t first = first_warp() * kTokens + lane_id() / kLanes;
  int64_t pair, token, step_pairs, step_tokens;
  div_mod(first, page, p.tokens_fit_32, &pair, &token);
  div_mod(warp_step() * kTokens, page, p.tokens_fit_32, &step_pairs, &step_tokens);
  for (int64_t t = first; t < p.num_tokens;
       t += warp_step() * kTokens, pair += step_pairs, token += step_tokens) {
    if (token >= page) pair += 1, token -= page;  // token + step_tokens < 2 * page
    const int64_t src_block = p.block_lists ? index_at(p.src_blocks, pair) : pair;
    const int64_t dst_block = p.block_lists ? index_at(p.dst_blocks, pair) : pair;
    if (src_block < 0 || src_block >= p.src.num_blocks || dst_block < 0 ||
        dst_block >= p.dst.num_blocks) {
      continue;  // -1 and out-of-range ids: skipped
    }
    transcode<Src, Dst, D, kLanes>(true, token_at<const uint8_t>(p.src, src_block, token),
                                   token_at<uint8_t>(p.dst, dst_block, token), lane);
  }
}

// --- dispatch ----------------------------------------------------------------------------------
template <typename Params>
using Kernel = void (*)(Params);

// The kernel template K<Src, Dst, D> for runtime codecs, or nullptr where the pair cannot exist
// (validation rules those out: both codecs hold d_qk dims).
template <template <Codec, Codec, int> class K, typename Params>
Kernel<Params> pick(int64_t d_qk, auto src_tag, auto dst_tag) {
  return kvcodec::with_dims(d_qk, [&](auto dims) -> Kernel<Params> {
    constexpr Codec kSrc = decltype(src_tag)::value;
    constexpr Codec kDst = decltype(dst_tag)::value;
    constexpr int kD = decltype(dims)::value;
    if constexpr (kvcodec::codec_supports<kSrc, kD>() && kvcodec::codec_supports<kDst, kD>()) {
      return K<kSrc, kDst, kD>::kernel();
    } else {
      return nullptr;
    }
  });
}

template <Codec S, Codec T, int D>
struct WriteKernelOf {
  static Kernel<WriteParams> kernel() { return kv_write_kernel<S, T, D>; }
};
template <Codec S, Codec T, int D>
struct GatherKernelOf {
  static Kernel<GatherParams> kernel() { return kv_gather_kernel<S, T, D>; }
};
template <Codec S, Codec T, int D>
struct Fp8RowsKernelOf {
  static Kernel<Fp8RowsParams> kernel() { return kv_gather_fp8_rows_kernel<S, T, D>; }
};
template <Codec S, Codec T, int D>
struct ConvertKernelOf {
  static Kernel<ConvertParams> kernel() { return kv_convert_kernel<S, T, D>; }
};

// Resident blocks per SM of `kernel` (read once per kernel: the launch path stays a few calls).
int resident_blocks_per_sm(const void* kernel) {
  static std::mutex mutex;
  static std::unordered_map<const void*, int> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  if (auto it = cache.find(kernel); it != cache.end()) return it->second;
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, 0) != cudaSuccess ||
      blocks < 1) {
    (void)cudaGetLastError();
    blocks = kMinBlocksPerSm;
  }
  cache.emplace(kernel, blocks);
  return blocks;
}

template <typename Params>
Status launch(const char* op, Kernel<Params> kernel, const Params& params, int64_t num_tokens,
              cudaStream_t stream) {
  if (kernel == nullptr) {
    return Status::Internal(std::string(op) +
                            ": no kernel for this codec pair (validation let "
                            "through a pair of different dims)");
  }
  if (num_tokens <= 0) return Status::Ok();
  int device = 0;
  OPENMLA_RETURN_IF_ERROR(cuda_error(op, "cudaGetDevice", cudaGetDevice(&device)));
  DeviceFacts facts;  // the SM count, read once per device
  OPENMLA_RETURN_IF_ERROR(device_facts(op, device, &facts));
  const int num_sms = facts.num_sms;
  // A warp per token: a kernel taking two per warp (convert_tokens_per_warp) may, below the
  // resident cap, start twice the warps it needs; the spare ones exit at once.
  const int64_t wanted = (num_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const int64_t cap =
      static_cast<int64_t>(num_sms) * resident_blocks_per_sm(reinterpret_cast<const void*>(kernel));
  const unsigned blocks = static_cast<unsigned>(wanted < cap ? wanted : cap);
  kernel<<<blocks, kThreads, 0, stream>>>(params);
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) {
    return cuda_error(op, "kernel launch", err);
  }
  return Status::Ok();
}

constexpr int64_t kMax32 = int64_t{1} << 32;

}  // namespace

Status kv_cache_write_launch(const KVCacheWriteArgs& args, const core::KVCacheWriteShape& shape,
                             cudaStream_t stream) {
  WriteParams p{};
  p.kv = static_cast<const uint8_t*>(args.kv.data);
  p.kv_row_bytes = args.kv.strides[0] * static_cast<int64_t>(dtype_size_bytes(args.kv.dtype));
  p.slots = make_index_list(args.slot_mapping);
  p.num_tokens = shape.num_tokens;
  p.cache = make_view(args.cache);
  p.slots_fit_32 = p.cache.num_slots <= kMax32;
  const Kernel<WriteParams> kernel = kvcodec::with_dense_codec(args.kv.dtype, [&](auto src) {
    return kvcodec::with_cache_codec(args.cache.layout.format, [&](auto dst) {
      return pick<WriteKernelOf, WriteParams>(shape.d_qk, src, dst);
    });
  });
  return launch("kv_cache_write", kernel, p, shape.num_tokens, stream);
}

Status kv_cache_gather_launch(const KVCacheGatherArgs& args, const core::KVCacheWriteShape& shape,
                              cudaStream_t stream) {
  GatherParams p{};
  p.cache = make_view(args.cache);
  p.slots = make_index_list(args.slots);
  p.out = static_cast<uint8_t*>(args.out.data);
  p.out_row_bytes = args.out.strides[0] * static_cast<int64_t>(dtype_size_bytes(args.out.dtype));
  p.num_tokens = shape.num_tokens;
  p.slots_fit_32 = p.cache.num_slots <= kMax32;
  const KVFormat format = args.cache.layout.format;
  const Kernel<GatherParams> kernel = kvcodec::with_cache_codec(format, [&](auto src) {
    return kvcodec::with_dense_codec(args.out.dtype, [&](auto dst) {
      return pick<GatherKernelOf, GatherParams>(shape.d_qk, src, dst);
    });
  });
  return launch("kv_cache_gather", kernel, p, shape.num_tokens, stream);
}

Status kv_cache_gather_listed_launch(const KVCache& cache, int64_t d_qk, const int32_t* slots,
                                     const int32_t* live_count, int64_t capacity, uint16_t* rows,
                                     cudaStream_t stream) {
  GatherParams p{};
  p.cache = make_view(cache);
  p.slots = {slots, 1, false};
  p.out = reinterpret_cast<uint8_t*>(rows);
  p.out_row_bytes = d_qk * 2;
  p.num_tokens = capacity;
  p.slots_fit_32 = p.cache.num_slots <= kMax32;
  p.live_count = live_count;
  const Kernel<GatherParams> kernel = kvcodec::with_cache_codec(cache.layout.format, [&](auto src) {
    return pick<GatherKernelOf, GatherParams>(d_qk, src,
                                              CodecTag<Codec::kBF16>{});
  });
  return launch("kv_cache_gather", kernel, p, capacity, stream);
}

Status kv_cache_gather_listed_fp8_launch(const KVCache& cache, int64_t d_qk, const int32_t* slots,
                                         const int32_t* live_count, int64_t capacity,
                                         uint8_t* rows, float* scales, cudaStream_t stream) {
  Fp8RowsParams p{};
  p.cache = make_view(cache);
  p.slots = {slots, 1, false};
  p.rows = rows;
  p.scales = scales;
  p.num_tokens = capacity;
  p.slots_fit_32 = p.cache.num_slots <= kMax32;
  p.live_count = live_count;
  const KVFormat format = cache.layout.format;
  const Kernel<Fp8RowsParams> kernel = kvcodec::with_cache_codec(format, [&](auto src) {
    return pick<Fp8RowsKernelOf, Fp8RowsParams>(d_qk, src, CodecTag<Codec::kBF16>{});
  });
  return launch("sparse_prefill", kernel, p, capacity, stream);
}

Status kv_cache_convert_launch(const KVCacheConvertArgs& args,
                               const core::KVCacheConvertShape& shape, cudaStream_t stream) {
  ConvertParams p{};
  p.src = make_view(args.src);
  p.dst = make_view(args.dst);
  p.block_lists = shape.block_lists;
  if (shape.block_lists) {
    p.src_blocks = make_index_list(args.src_blocks);
    p.dst_blocks = make_index_list(args.dst_blocks);
  }
  p.num_tokens = shape.num_blocks * shape.page_size;
  p.tokens_fit_32 = p.num_tokens <= kMax32;
  const KVFormat src_format = args.src.layout.format;
  const Kernel<ConvertParams> kernel = kvcodec::with_cache_codec(src_format, [&](auto src) {
    return kvcodec::with_cache_codec(args.dst.layout.format, [&](auto dst) {
      return pick<ConvertKernelOf, ConvertParams>(shape.d_qk, src, dst);
    });
  });
  return launch("kv_cache_convert", kernel, p, p.num_tokens, stream);
}

}  // namespace openmla::cuda
