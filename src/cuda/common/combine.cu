// Split-KV decode combine (combine.h). The decode kernel leaves a split's partial as its CTA held
// it (combine.h, "o_accum"): a block per (partial slot, kv head, m-block), float4 (32 wg + k) *
// 32 G + t (G 16-row groups) holding rows r, r + 8 (r = 16 (t / 32) + (t % 32) / 4) x dims
// 256 wg + 8 k + 2 (t % 4), + 1. A warp here takes what one decode warp held: lane l of the warp
// for 16-row group w reads float4 slot * 32 G + 32 w + l of each of its slots (32 wg + k), so
// every load instruction is 512 contiguous bytes, and sums them over the splits with its rows'
// weights, in one pass with a running max; a 4 x 4 transpose in each quad then gives every lane 8
// contiguous dims of one n-block for 16-byte stores.
// A unit (one warp, or G = params.warps_per_row warps that deal the splits and meet once in
// shared memory) is 8 slots of a 16-row group (G <= 4) or 1 (G = 8: one long request, few rows,
// 8x the blocks). With G = 1 a unit needs no barrier at all. (Before session 10 the decode
// kernel stored row-major partials with 8-byte stores: ~12 µs of b 32 x 4096's 89; a row-pair
// warp here read them back as 64-byte runs and was slower than this.)
#include "cuda/common/combine.h"

#include "core/schedule.h"
#include "cuda/common/merge_math.cuh"
#include "cuda/common/quad_transpose.cuh"
#include "cuda/common/smem_opt_in.h"
#include "cuda/sm90/sparse_decode/fused_out.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

namespace openmla::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kDimV = 512;  // d_v (combine.h)

// Float4s of the G warps' sums and stats (G > 1): the block's dynamic shared memory.
constexpr int merge_float4s(int slots, int G) { return G > 1 ? kWarps * (slots + 1) * 32 : 0; }

template <typename Element>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}


// The fused op's cos/sin of a lane's 8 pairs in the RoPE dims (dims 448 + 8 (k - 24) + 2 q,
// + 1 for slots 56 + k - 24 .. of the unit with chunk 7), read before the wait for the decode.
struct FusedRope {
  float c[8], s[8];
  bool bad;
};
__device__ __forceinline__ FusedRope fused_rope(const sm90::SparseFusedParams& f, int token, int q,
                                                bool rope_unit) {
  FusedRope r;
#pragma unroll
  for (int k = 0; k < 8; ++k) r.c[k] = 1.f, r.s[k] = 0.f;
  const int pos = __ldg(f.positions + static_cast<int64_t>(token) * f.positions_stride);
  r.bad = pos < 0 || pos >= f.num_positions;
  if (!r.bad && rope_unit) {
    const float* row = f.cos_sin + static_cast<int64_t>(pos) * f.cos_sin_stride0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int i = 4 * k + q;  // pair (dim - 448) / 2 of dims 448 + 8 k + 2 q, + 1
      r.c[k] = __ldg(row + i * f.cos_sin_stride1);
      r.s[k] = __ldg(row + (32 + i) * f.cos_sin_stride1);
    }
  }
  return r;
}

// The fused op's store of one merged row's 64 dims held by a lane's quad (8 slots: two 32-dim
// chunks of 4 n-blocks; lane q has dims 8 k + 2 q, + 1 of each): the RoPE dims turned back, each
// chunk's amax over the quad, e4m3 pairs and the chunk's scale byte (sparse_decode/fused_out.cuh).
// Every lane calls it (shuffles); `live` says whether its row is stored.
__device__ __forceinline__ void fused_store(const sm90::SparseFusedParams& f, int token, int h,
                                            int slot0, int q, float (&v)[16],
                                            const FusedRope& rope, bool live) {
  using namespace sm90::sparse_decode_detail;
  if (slot0 == 56) {  // dims 448 - 511: the RoPE dims
#pragma unroll
    for (int k = 0; k < 8; ++k) fused_unrotate(rope.c[k], rope.s[k], v[2 * k], v[2 * k + 1]);
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float amax = 0.f;
#pragma unroll
    for (int e = 8 * half; e < 8 * half + 8; ++e) amax = fmaxf(amax, fabsf(v[e]));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    if (!live) continue;
    const int e = fused_scale_exponent(amax);
    const float inv = ldexpf(1.f, -e);
    const int dim0 = 256 * (slot0 / 32) + 8 * (slot0 % 32) + 32 * half;
    const FusedChunk dst = fused_chunk(f, token, h, dim0 / 32);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int e2 = 8 * half + 2 * k;
      *reinterpret_cast<uint16_t*>(dst.bytes + 8 * k + 2 * q) =
          rope.bad ? uint16_t{0x7F7F} : fused_e4m3x2(v[e2], v[e2 + 1], inv);
    }
    if (q == 0) *dst.scale = rope.bad ? uint8_t{0xFF} : static_cast<uint8_t>(e + 127);
  }
}

// kSlots float4s a lane a split: 8 (G <= 4) or 1 (G = 8). kFused: the fused op's output (kSlots 8).
template <typename Element, int kSlots, bool kFused>
__global__ void __launch_bounds__(kThreads) decode_combine_kernel(const DecodeCombineParams p) {
  static_assert(!kFused || kSlots == 8, "a fused row's 32-dim chunk is 4 slots of one lane");
  const int r = p.request0 + static_cast<int>(blockIdx.y);
  int64_t first64, n64, slot064;
  if (p.uniform_splits > 0) {  // sparse: n splits a request, slot = global split
    n64 = p.uniform_splits;
    first64 = static_cast<int64_t>(r) * n64;
    slot064 = first64;
  } else {
    first64 = p.num_splits[r * p.num_splits_stride];
    n64 = p.num_splits[(r + 1) * p.num_splits_stride] - first64;
    slot064 = 2 * (first64 - r);  // core::partial_slot(first, first, r)
  }
  // One split: the decode kernel wrote this request itself. (num_splits comes from the planner,
  // which finished before the decode kernel, our primary, started.)
  if (n64 <= 1) return;
  // Splits or slots past the workspace's: a corrupted schedule (params.max_splits).
  if (first64 < 0 || first64 + n64 > p.max_splits || slot064 < 0 || slot064 + n64 > p.max_slots) {
    return;
  }
  const int first = static_cast<int>(first64), n = static_cast<int>(n64);

  constexpr int kChunks = 64 / kSlots;  // units a 16-row group's 64 slots are dealt over
  // G > 1: each warp's partial sums (kSlots x 32), then stats.
  extern __shared__ float4 part[];
  const int G = p.warps_per_row;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = warp % G;
  const int group = p.h_q / p.h_kv;
  const int rows_kv = p.s_q * group;  // query rows of a kv head
  const int m_blocks = (rows_kv + 63) / 64;
  const int groups = core::partial_row_groups(rows_kv);
  int unit = blockIdx.x * (kWarps / G) + warp / G;
  const int chunk = unit % kChunks;
  unit /= kChunks;
  const int w = unit % groups;
  unit /= groups;
  const int m_block = unit % m_blocks;
  const int kv_head = unit / m_blocks;
  const bool unit_live = kv_head < p.h_kv;  // else past the request's units (warp-uniform)
  const int q = lane % 4;
  const int grow0 = m_block * 64 + 16 * w + lane / 4, grow1 = grow0 + 8;
  const bool live0 = unit_live && grow0 < rows_kv, live1 = unit_live && grow1 < rows_kv;
  // Rows past the kv head's read the m-block's first row instead (never stored).
  const int kvh = unit_live ? kv_head : 0;
  const int c0 = live0 ? grow0 : m_block * 64, c1 = live1 ? grow1 : c0;
  const int s0 = c0 / group, h0 = kvh * group + c0 % group;
  const int s1 = c1 / group, h1 = kvh * group + c1 % group;
  const int rows = p.s_q * p.h_q;
  FusedRope rope;  // the fused op's cos/sin: inputs, read while the decode grid still runs
  if constexpr (kFused) rope = fused_rope(p.fused, r, q, chunk == 7);
  asm volatile("griddepcontrol.wait;" ::: "memory");

  float4 acc[kSlots];
#pragma unroll
  for (int v = 0; v < kSlots; ++v) acc[v] = make_float4(0.f, 0.f, 0.f, 0.f);
  // One pass over this warp's splits: mx (running max of the lse), sum and acc relative to it.
  // The G warps of a unit merge their (mx, sum, acc) in shared memory. (Two passes, max then
  // weights, made each lane read its rows' lse of every split first: with G = 8 and 132 splits
  // that cost more than the partials.)
  float mx0 = -INFINITY, mx1 = -INFINITY, sum0 = 0.f, sum1 = 0.f;
  const float* lse0 = p.lse_accum + static_cast<int64_t>(first) * rows + s0 * p.h_q + h0;
  const float* lse1 = p.lse_accum + static_cast<int64_t>(first) * rows + s1 * p.h_q + h1;
  if (unit_live) {
    // The first piece's block, then one block stride per piece; a block is 64 column slots of
    // 32 G float4s.
    const int lanes = 32 * groups;
    const int64_t block_float4s = core::partial_block_float4s(groups, kDimV);
    const int64_t block =
        core::partial_block(static_cast<int>(slot064), kvh, m_block, p.h_kv, m_blocks);
    const float4* o = reinterpret_cast<const float4*>(p.o_accum) + block * block_float4s +
                      chunk * kSlots * lanes + 32 * w + lane;
    const int64_t split_stride = static_cast<int64_t>(p.h_kv) * m_blocks * block_float4s;
    // One split into the running (mx, sum, acc) (merge_math.cuh); a split that saw no key
    // weighs 0 and its values, which may be garbage, are dropped.
    auto add_split = [&](float l0, float l1, const float4 (&xs)[kSlots]) {
      const merge_math::OnlineStep a0 = merge_math::online_add(mx0, sum0, l0);
      const merge_math::OnlineStep a1 = merge_math::online_add(mx1, sum1, l1);
#pragma unroll
      for (int v = 0; v < kSlots; ++v) {
        float4 x = xs[v];
        if (l0 == -INFINITY) x.x = x.y = 0.f;
        if (l1 == -INFINITY) x.z = x.w = 0.f;
        acc[v].x = acc[v].x * a0.rescale + a0.weight * x.x;
        acc[v].y = acc[v].y * a0.rescale + a0.weight * x.y;
        acc[v].z = acc[v].z * a1.rescale + a1.weight * x.z;
        acc[v].w = acc[v].w * a1.rescale + a1.weight * x.w;
      }
    };
    // Loads unconditional (a split that saw no key, lse -inf, weighs 0 by a select after its
    // load). (Staging 8 or 2 splits a warp in shared memory by cp.async, all in flight together,
    // measured -3.5 to +2.2 µs by shape: removed, dense_decode/NOTES.md.)
    constexpr int kUnroll = kSlots == 1 ? 16 : 2;
#pragma unroll kUnroll
    for (int i = g; i < n; i += G) {
      float4 x[kSlots];
#pragma unroll
      for (int v = 0; v < kSlots; ++v) x[v] = __ldg(o + i * split_stride + v * lanes);
      add_split(lse0[static_cast<int64_t>(i) * rows], lse1[static_cast<int64_t>(i) * rows], x);
    }
  }
  if (G > 1) {  // the unit's G warps meet: its first merges them
    float4* stats = part + kWarps * kSlots * 32;  // each lane's (mx0, mx1, sum0, sum1)
#pragma unroll
    for (int v = 0; v < kSlots; ++v) part[(warp * kSlots + v) * 32 + lane] = acc[v];
    stats[warp * 32 + lane] = make_float4(mx0, mx1, sum0, sum1);
    __syncthreads();
    if (g != 0) return;
    float m0 = mx0, m1 = mx1;
    for (int j = 1; j < G; ++j) {
      const float4 st = stats[(warp + j) * 32 + lane];
      m0 = fmaxf(m0, st.x);
      m1 = fmaxf(m1, st.y);
    }
    for (int j = 0; j < G; ++j) {
      const float4 st = stats[(warp + j) * 32 + lane];
      const float f0 = st.x == m0 ? 1.f : __expf(st.x - m0);
      const float f1 = st.y == m1 ? 1.f : __expf(st.y - m1);
      if (j == 0) {
        sum0 = 0.f;
        sum1 = 0.f;
      }
      sum0 += st.z * f0;
      sum1 += st.w * f1;
#pragma unroll
      for (int v = 0; v < kSlots; ++v) {
        const float4 u = part[((warp + j) * kSlots + v) * 32 + lane];
        if (j == 0) acc[v] = make_float4(0.f, 0.f, 0.f, 0.f);
        acc[v].x += u.x * f0;
        acc[v].y += u.y * f0;
        acc[v].z += u.z * f1;
        acc[v].w += u.w * f1;
      }
    }
    mx0 = m0;
    mx1 = m1;
  }
  if (!unit_live) return;

  // Where query token s of request r lands in out / lse / max_logits: row i, column j.
  const int s_q_out = p.s_q_out > 0 ? p.s_q_out : p.s_q;
  const int t0 = r * p.s_q + s0, t1 = r * p.s_q + s1;
  const int i0 = t0 / s_q_out, j0 = t0 - i0 * s_q_out;
  const int i1 = t1 / s_q_out, j1 = t1 - i1 * s_q_out;
  const float lse_0 = merge_math::merged_lse(mx0, sum0), lse_1 = merge_math::merged_lse(mx1, sum1);
  float inv0 = sum0 > 0.f ? 1.f / sum0 : 0.f, inv1 = sum1 > 0.f ? 1.f / sum1 : 0.f;
  if (p.sink != nullptr) {
    inv0 *= merge_math::sink_factor(p.sink[h0 * p.sink_stride], lse_0);
    inv1 *= merge_math::sink_factor(p.sink[h1 * p.sink_stride], lse_1);
  }
  if (chunk == 0 && q == 0) {
    if (live0) p.lse[i0 * p.lse_stride_b + h0 * p.lse_stride_h + j0 * p.lse_stride_s] = lse_0;
    if (live1) p.lse[i1 * p.lse_stride_b + h1 * p.lse_stride_h + j1 * p.lse_stride_s] = lse_1;
    if (p.max_accum != nullptr) {  // the max logit: every split's, lane by lane
      float ml0 = -INFINITY, ml1 = -INFINITY;
      const float* max0 = p.max_accum + (lse0 - p.lse_accum);
      const float* max1 = p.max_accum + (lse1 - p.lse_accum);
#pragma unroll 8
      for (int i = 0; i < n; ++i) {
        ml0 = fmaxf(ml0, max0[static_cast<int64_t>(i) * rows]);
        ml1 = fmaxf(ml1, max1[static_cast<int64_t>(i) * rows]);
      }
      if (live0) {
        p.max_logits[i0 * p.max_logits_stride_b + h0 * p.max_logits_stride_h +
                     j0 * p.max_logits_stride_s] = ml0;
      }
      if (live1) {
        p.max_logits[i1 * p.max_logits_stride_b + h1 * p.max_logits_stride_h +
                     j1 * p.max_logits_stride_s] = ml1;
      }
    }
  }
  if constexpr (kFused) {  // sparse mode, one token a request: token r, rows = heads
    float v0[16], v1[16];
#pragma unroll
    for (int v = 0; v < 8; ++v) {
      v0[2 * v] = acc[v].x * inv0, v0[2 * v + 1] = acc[v].y * inv0;
      v1[2 * v] = acc[v].z * inv1, v1[2 * v + 1] = acc[v].w * inv1;
    }
    fused_store(p.fused, r, h0, chunk * 8, q, v0, rope, live0);
    fused_store(p.fused, r, h1, chunk * 8, q, v1, rope, live1);
    return;
  }
  char* out0 = static_cast<char*>(p.out) + (i0 * p.out_stride_b + j0 * p.out_stride_s +
                                           h0 * p.out_stride_h) * 2;
  char* out1 = static_cast<char*>(p.out) + (i1 * p.out_stride_b + j1 * p.out_stride_s +
                                           h1 * p.out_stride_h) * 2;
  if constexpr (kSlots >= 4) {
    if (p.out_16B) {
      // Slots 4 j .. 4 j + 3 are n-blocks k .. k + 3 of one warpgroup half; transposed in the
      // quad, lane q holds all 8 dims of n-block k + q (every lane shuffles).
#pragma unroll
      for (int j = 0; j < kSlots / 4; ++j) {
        uint32_t a0[4], a1[4];
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const float4 x = acc[4 * j + m];
          a0[m] = pack2<Element>(x.x * inv0, x.y * inv0);
          a1[m] = pack2<Element>(x.z * inv1, x.w * inv1);
        }
        const uint4 v0 = quad_transpose(a0, q), v1 = quad_transpose(a1, q);
        const int slot = chunk * kSlots + 4 * j;  // 32 wg + k
        const int dim = 256 * (slot / 32) + 8 * (slot % 32 + q);
        if (live0) *reinterpret_cast<uint4*>(out0 + dim * 2) = v0;
        if (live1) *reinterpret_cast<uint4*>(out1 + dim * 2) = v1;
      }
      return;
    }
  }
#pragma unroll
  for (int v = 0; v < kSlots; ++v) {  // 4-byte stores (out's strides not multiples of 8)
    const int slot = chunk * kSlots + v;
    const int dim = 256 * (slot / 32) + 8 * (slot % 32) + 2 * q;
    if (live0) {
      *reinterpret_cast<uint32_t*>(out0 + dim * 2) =
          pack2<Element>(acc[v].x * inv0, acc[v].y * inv0);
    }
    if (live1) {
      *reinterpret_cast<uint32_t*>(out1 + dim * 2) =
          pack2<Element>(acc[v].z * inv1, acc[v].w * inv1);
    }
  }
}

}  // namespace

int decode_combine_warps_per_row(int batch, int num_sm_parts) {
  // Splits a request typically has: its share of the workers, plus the one it shares with a
  // neighbour. Few: a warp a row (no barrier); many (one long request): up to the 8 warps.
  const int typical = (num_sm_parts + batch - 1) / (batch > 0 ? batch : 1) + 1;
  if (typical <= 4) return 1;
  if (typical <= 8) return 2;
  if (typical <= 16) return 4;
  return 8;
}

cudaError_t launch_decode_combine(const DecodeCombineParams& params, DType out_dtype,
                                  cudaStream_t stream, bool programmatic) {
  if (params.batch == 0 || params.s_q * params.h_q == 0) return cudaSuccess;
  const int G = params.warps_per_row;
  if (G != 1 && G != 2 && G != 4 && G != 8) return cudaErrorInvalidValue;
  if (params.h_kv < 1 || params.h_q % params.h_kv != 0) return cudaErrorInvalidValue;
  // 8 slots of a 16-row group a unit (G <= 4), or 1 (G = 8).
  const int slots = G == 8 ? 1 : 8;
  const int rows_kv = params.s_q * (params.h_q / params.h_kv);
  const int64_t units = static_cast<int64_t>(params.h_kv) * ((rows_kv + 63) / 64) *
                        core::partial_row_groups(rows_kv) * (64 / slots);
  const int units_per_block = kWarps / G;
  const bool bf16 = out_dtype == DType::kBF16;
  if (params.fused.on && (slots != 8 || !bf16 || params.h_kv != 1 || params.s_q != 1)) {
    return cudaErrorInvalidValue;
  }
  auto kernel = params.fused.on
                    ? decode_combine_kernel<__nv_bfloat16, 8, true>
                    : slots == 8 ? (bf16 ? decode_combine_kernel<__nv_bfloat16, 8, false>
                                         : decode_combine_kernel<__half, 8, false>)
                                 : (bf16 ? decode_combine_kernel<__nv_bfloat16, 1, false>
                                         : decode_combine_kernel<__half, 1, false>);
  // Up to ~36 KB (eight slots, G = 4).
  const size_t smem_bytes = sizeof(float4) * merge_float4s(slots, G);
  if (const cudaError_t err = allow_dynamic_smem(kernel, smem_bytes); err != cudaSuccess) {
    return err;
  }
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  // Requests in grids of at most 65535 (gridDim.y's bound).
  DecodeCombineParams chunk = params;
  for (chunk.request0 = 0; chunk.request0 < params.batch; chunk.request0 += 65535) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(static_cast<unsigned>((units + units_per_block - 1) / units_per_block),
                          std::min(params.batch - chunk.request0, 65535));
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = smem_bytes;
    config.stream = stream;
    config.attrs = attribute;
    // Only the first grid may start under the decode kernel: a later one's blocks could all be
    // requests of one split, which exit without griddepcontrol.wait.
    config.numAttrs = programmatic && chunk.request0 == 0 ? 1 : 0;
    if (const cudaError_t err = cudaLaunchKernelEx(&config, kernel, chunk); err != cudaSuccess) {
      return err;
    }
  }
  return cudaSuccess;
}

}  // namespace openmla::cuda
