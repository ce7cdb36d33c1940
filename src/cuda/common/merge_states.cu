// Merge of partial attention states: lse = log Σ exp(lse_i), out = Σ exp(lse_i - lse) · out_i,
// skipping parts whose lse is ±inf or NaN (they hold no keys).
//
// A group of threads owns one (token, head) row. Every thread reads the row's n lse values (the
// same address across the group: one broadcast load per warp), so no shared memory or group
// reduction is needed; then each thread merges kVec consecutive elements of d_v. The kernel is
// bound by reading n · d_v elements, so loads are 16 B wide and the part loop is unrolled to keep
// several in flight.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "cuda/common/merge_math.cuh"
#include "cuda/common/merge_states.h"

namespace openmla::cuda {
namespace {

constexpr int kBlockThreads = 256;
// 4 resident blocks (32 warps) keep enough 16 B loads in flight per SM, and the 64-register cap
// this implies fits every instantiation. (With __launch_bounds__(256) alone, ptxas of CUDA 13
// chose 48 registers and spilled the fp32-input kernels.)
constexpr int kMinBlocksPerSm = 4;
constexpr int kMaxThreadsPerRow = 128;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}

// kN elements moved as 32-bit words packed by hand, then as one 16 B access (two for 8 floats,
// one narrower below 16 B). Stores go through __stwb (st.global.wb, the default policy): a plain
// store of a uint4, a struct or a memcpy of bf16s is split by nvcc into 4-byte pieces.
__device__ __forceinline__ uint32_t bits(float x) { return __float_as_uint(x); }
__device__ __forceinline__ uint32_t bits(__nv_bfloat16 x) { return __bfloat16_as_ushort(x); }
__device__ __forceinline__ uint32_t bits(__half x) { return __half_as_ushort(x); }
template <typename T>
__device__ __forceinline__ T element_from_bits(uint32_t w);
template <>
__device__ __forceinline__ float element_from_bits<float>(uint32_t w) {
  return __uint_as_float(w);
}
template <>
__device__ __forceinline__ __nv_bfloat16 element_from_bits<__nv_bfloat16>(uint32_t w) {
  return __ushort_as_bfloat16(static_cast<unsigned short>(w));
}
template <>
__device__ __forceinline__ __half element_from_bits<__half>(uint32_t w) {
  return __ushort_as_half(static_cast<unsigned short>(w));
}

template <int kWords>
__device__ __forceinline__ void load_words(const void* src, uint32_t (&w)[kWords]) {
  static_assert(kWords == 1 || kWords == 2 || kWords % 4 == 0);
  if constexpr (kWords == 1) {
    w[0] = *static_cast<const uint32_t*>(src);
  } else if constexpr (kWords == 2) {
    const uint2 x = *static_cast<const uint2*>(src);
    w[0] = x.x, w[1] = x.y;
  } else {
#pragma unroll
    for (int i = 0; i < kWords / 4; ++i) {
      const uint4 x = static_cast<const uint4*>(src)[i];
      w[4 * i] = x.x, w[4 * i + 1] = x.y, w[4 * i + 2] = x.z, w[4 * i + 3] = x.w;
    }
  }
}

template <int kWords>
__device__ __forceinline__ void store_words(void* dst, const uint32_t (&w)[kWords]) {
  static_assert(kWords == 1 || kWords == 2 || kWords % 4 == 0);
  if constexpr (kWords == 1) {
    *static_cast<uint32_t*>(dst) = w[0];
  } else if constexpr (kWords == 2) {
    __stwb(static_cast<uint2*>(dst), make_uint2(w[0], w[1]));
  } else {
#pragma unroll
    for (int i = 0; i < kWords / 4; ++i) {
      __stwb(static_cast<uint4*>(dst) + i,
             make_uint4(w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]));
    }
  }
}

template <typename T, int kN>
__device__ __forceinline__ void load_pack(const T* src, T (&v)[kN]) {
  if constexpr (kN == 1) {
    v[0] = *src;
  } else {
    constexpr int kPerWord = 4 / sizeof(T);
    uint32_t w[kN / kPerWord];
    load_words(src, w);
#pragma unroll
    for (int e = 0; e < kN; ++e) {
      v[e] = element_from_bits<T>(w[e / kPerWord] >> (32 / kPerWord * (e % kPerWord)));
    }
  }
}

template <typename T, int kN>
__device__ __forceinline__ void store_pack(T* dst, const T (&v)[kN]) {
  if constexpr (kN == 1) {
    *dst = v[0];
  } else {
    constexpr int kPerWord = 4 / sizeof(T);
    uint32_t w[kN / kPerWord] = {};
#pragma unroll
    for (int e = 0; e < kN; ++e) w[e / kPerWord] |= bits(v[e]) << (32 / kPerWord * (e % kPerWord));
    store_words(dst, w);
  }
}

__device__ __forceinline__ bool holds_keys(float lse) { return isfinite(lse); }

template <typename TIn, typename TOut, int kVec>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSm)
    merge_states_kernel(const MergeStatesParams p, int threads_per_row) {
  const int rows_per_block = kBlockThreads / threads_per_row;
  const int64_t row =
      static_cast<int64_t>(blockIdx.x) * rows_per_block + threadIdx.x / threads_per_row;
  const int lane = threadIdx.x % threads_per_row;
  if (row >= p.tokens * p.heads) return;
  const int64_t token = row / p.heads;
  const int64_t head = row % p.heads;

  const float* lse_row = p.part_lse + token * p.part_lse_strides[1] + head * p.part_lse_strides[2];
  const int64_t lse_part_stride = p.part_lse_strides[0];
  float max_lse = -INFINITY;
  for (int64_t i = 0; i < p.num_parts; ++i) {
    const float l = lse_row[i * lse_part_stride];
    if (holds_keys(l)) max_lse = fmaxf(max_lse, l);
  }
  float sum = 0.f;
  for (int64_t i = 0; i < p.num_parts; ++i) {
    const float l = lse_row[i * lse_part_stride];
    if (holds_keys(l)) sum += expf(l - max_lse);
  }
  const bool empty = max_lse == -INFINITY;
  const float merged_lse = merge_math::merged_lse(max_lse, sum);

  const TIn* in_row = static_cast<const TIn*>(p.part_out) + token * p.part_out_strides[1] +
                      head * p.part_out_strides[2];
  TOut* out_row = static_cast<TOut*>(p.out) + token * p.out_strides[0] + head * p.out_strides[1];
  const int64_t part_stride = p.part_out_strides[0];
  const int64_t num_chunks = p.d_v / kVec;
  for (int64_t chunk = lane; chunk < num_chunks; chunk += threads_per_row) {
    float acc[kVec];
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc[e] = 0.f;
    if (!empty) {
#pragma unroll 4
      for (int64_t i = 0; i < p.num_parts; ++i) {
        // An empty part's values may be garbage (NaN): load them, but select them away.
        const float l = lse_row[i * lse_part_stride];
        const bool valid = holds_keys(l);
        const float w = valid ? expf(l - merged_lse) : 0.f;
        TIn x[kVec];
        load_pack(in_row + i * part_stride + chunk * kVec, x);
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[e] = valid ? fmaf(w, to_float(x[e]), acc[e]) : acc[e];
      }
    }
    TOut y[kVec];
#pragma unroll
    for (int e = 0; e < kVec; ++e) y[e] = from_float<TOut>(acc[e]);
    store_pack(out_row + chunk * kVec, y);
  }
  if (p.lse != nullptr && lane == 0) {
    p.lse[token * p.lse_strides[0] + head * p.lse_strides[1]] = merged_lse;
  }
}

bool aligned(const void* ptr, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % static_cast<uintptr_t>(bytes) == 0;
}

template <typename TIn, typename TOut, int kVec>
cudaError_t launch_typed(const MergeStatesParams& p, cudaStream_t stream) {
  const int64_t num_chunks = p.d_v / kVec;
  int threads_per_row = 1;
  while (threads_per_row < num_chunks && threads_per_row < kMaxThreadsPerRow) threads_per_row *= 2;
  const int rows_per_block = kBlockThreads / threads_per_row;
  const int64_t rows = p.tokens * p.heads;
  const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  merge_states_kernel<TIn, TOut, kVec>
      <<<static_cast<unsigned>(blocks), kBlockThreads, 0, stream>>>(p, threads_per_row);
  return cudaGetLastError();
}

// 16 B loads need part_out's base, every stride and d_v on a 16 B grid; the matching store of
// kVec outputs needs out on its own (up to 16 B) grid.
template <typename TIn, typename TOut>
cudaError_t launch_for_alignment(const MergeStatesParams& p, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(TIn);
  constexpr int64_t kStoreBytes = sizeof(TOut) * kVec < 16 ? sizeof(TOut) * kVec : 16;
  bool vectorizable = p.d_v % kVec == 0 && aligned(p.part_out, 16) && aligned(p.out, kStoreBytes);
  for (int64_t s : p.part_out_strides) vectorizable &= s % kVec == 0;
  for (int64_t s : p.out_strides) vectorizable &= s % kVec == 0;
  return vectorizable ? launch_typed<TIn, TOut, kVec>(p, stream)
                      : launch_typed<TIn, TOut, 1>(p, stream);
}

template <typename TIn>
cudaError_t launch_for_out(const MergeStatesParams& p, cudaStream_t stream) {
  switch (p.out_dtype) {
    case DType::kFP32:
      return launch_for_alignment<TIn, float>(p, stream);
    case DType::kBF16:
      return launch_for_alignment<TIn, __nv_bfloat16>(p, stream);
    case DType::kFP16:
      return launch_for_alignment<TIn, __half>(p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t launch_merge_states(const MergeStatesParams& p, cudaStream_t stream) {
  if (p.tokens * p.heads == 0) return cudaSuccess;  // nothing to write; a 0-block grid is an error
  switch (p.part_out_dtype) {
    case DType::kFP32:
      return launch_for_out<float>(p, stream);
    case DType::kBF16:
      return launch_for_out<__nv_bfloat16>(p, stream);
    case DType::kFP16:
      return launch_for_out<__half>(p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace openmla::cuda
