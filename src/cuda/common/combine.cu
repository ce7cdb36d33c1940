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
#include "cuda/common/quad_transpose.cuh"
#include "cuda/common/smem_opt_in.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

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


// kSlots float4s a lane a split: 8 (G <= 4) or 1 (G = 8).
template <typename Element, int kSlots>
__global__ void __launch_bounds__(kThreads) decode_combine_kernel(const DecodeCombineParams p) {
  const int r = blockIdx.y;
  const int64_t first64 = p.num_splits[r * p.num_splits_stride];
  const int64_t n64 = p.num_splits[(r + 1) * p.num_splits_stride] - first64;
  // One split: the decode kernel wrote this request itself. (num_splits comes from the planner,
  // which finished before the decode kernel, our primary, started.)
  if (n64 <= 1) return;
  // Splits or slots past the workspace's: a corrupted schedule (params.max_splits).
  const int64_t slot0 = 2 * (first64 - r);  // core::partial_slot(first, first, r)
  if (first64 < 0 || first64 + n64 > p.max_splits || slot0 < 0 || slot0 + n64 > p.max_slots) return;
  const int first = static_cast<int>(first64), n = static_cast<int>(n64);
  asm volatile("griddepcontrol.wait;" ::: "memory");

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

  float4 acc[kSlots];
#pragma unroll
  for (int v = 0; v < kSlots; ++v) acc[v] = make_float4(0.f, 0.f, 0.f, 0.f);
  // One pass over this warp's splits: mx (running max of the lse), sum and acc relative to it.
  // The G warps of a unit merge their (mx, sum, acc) in shared memory. (Two passes, max then
  // weights, made each lane read its rows' lse of every split first: with G = 8 and 132 splits
  // that cost more than the partials.)
  float mx0 = -INFINITY, mx1 = -INFINITY, sum0 = 0.f, sum1 = 0.f;
  if (unit_live) {
    const float* lse0 = p.lse_accum + static_cast<int64_t>(first) * rows + s0 * p.h_q + h0;
    const float* lse1 = p.lse_accum + static_cast<int64_t>(first) * rows + s1 * p.h_q + h1;
    // The first piece's block (slot core::partial_slot(first, first, r)), then one block
    // stride per piece; a block is 64 column slots of 32 G float4s.
    const int lanes = 32 * groups;
    const int64_t block_float4s = core::partial_block_float4s(groups, kDimV);
    const int64_t block =
        core::partial_block(core::partial_slot(first, first, r), kvh, m_block, p.h_kv, m_blocks);
    const float4* o = reinterpret_cast<const float4*>(p.o_accum) + block * block_float4s +
                      chunk * kSlots * lanes + 32 * w + lane;
    const int64_t split_stride = static_cast<int64_t>(p.h_kv) * m_blocks * block_float4s;
    // One split into the running (mx, sum, acc): e^(mx - new max) rescales the sums so far (1
    // while the max stays; 0 from -inf), e^(l - new max) weighs the split (0 where it saw no
    // key; its values, which may be garbage, are dropped).
    auto add_split = [&](float l0, float l1, const float4 (&xs)[kSlots]) {
      const float n0 = fmaxf(mx0, l0), n1 = fmaxf(mx1, l1);
      const float c0 = mx0 == n0 ? 1.f : __expf(mx0 - n0);
      const float c1 = mx1 == n1 ? 1.f : __expf(mx1 - n1);
      const float w0 = l0 == -INFINITY ? 0.f : __expf(l0 - n0);
      const float w1 = l1 == -INFINITY ? 0.f : __expf(l1 - n1);
      mx0 = n0;
      mx1 = n1;
      sum0 = sum0 * c0 + w0;
      sum1 = sum1 * c1 + w1;
#pragma unroll
      for (int v = 0; v < kSlots; ++v) {
        float4 x = xs[v];
        if (l0 == -INFINITY) x.x = x.y = 0.f;
        if (l1 == -INFINITY) x.z = x.w = 0.f;
        acc[v].x = acc[v].x * c0 + w0 * x.x;
        acc[v].y = acc[v].y * c0 + w0 * x.y;
        acc[v].z = acc[v].z * c1 + w1 * x.z;
        acc[v].w = acc[v].w * c1 + w1 * x.w;
      }
    };
    // Loads unconditional (a split that saw no key, lse -inf, weighs 0 by a select after its
    // load). (Staging 8 or 2 splits a warp in shared memory by cp.async, all in flight together,
    // measured -3.5 to +2.2 µs by shape: removed, NOTES.md.)
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

  const float inv0 = sum0 > 0.f ? 1.f / sum0 : 0.f, inv1 = sum1 > 0.f ? 1.f / sum1 : 0.f;
  if (chunk == 0 && q == 0) {
    if (live0) {
      p.lse[r * p.lse_stride_b + h0 * p.lse_stride_h + s0 * p.lse_stride_s] =
          mx0 == -INFINITY ? INFINITY : mx0 + logf(sum0);
    }
    if (live1) {
      p.lse[r * p.lse_stride_b + h1 * p.lse_stride_h + s1 * p.lse_stride_s] =
          mx1 == -INFINITY ? INFINITY : mx1 + logf(sum1);
    }
  }
  char* out0 = static_cast<char*>(p.out) + (r * p.out_stride_b + s0 * p.out_stride_s +
                                           h0 * p.out_stride_h) * 2;
  char* out1 = static_cast<char*>(p.out) + (r * p.out_stride_b + s1 * p.out_stride_s +
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
  auto kernel = slots == 8 ? (bf16 ? decode_combine_kernel<__nv_bfloat16, 8>
                                   : decode_combine_kernel<__half, 8>)
                           : (bf16 ? decode_combine_kernel<__nv_bfloat16, 1>
                                   : decode_combine_kernel<__half, 1>);
  // Up to ~36 KB (eight slots, G = 4).
  const size_t smem_bytes = sizeof(float4) * merge_float4s(slots, G);
  if (const cudaError_t err = allow_dynamic_smem(kernel, smem_bytes); err != cudaSuccess) {
    return err;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>((units + units_per_block - 1) / units_per_block),
                        params.batch);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = programmatic ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, params);
}

}  // namespace openmla::cuda
