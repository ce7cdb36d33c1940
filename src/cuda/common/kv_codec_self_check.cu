// The device codec's self-check (kv_cache_kernels.h launch_kv_codec_self_check): the hardware
// fast paths of kv_codec.cuh against its portable `_sw` versions on every input (all 2^32 floats,
// every code of the decoders), counted per check with the first mismatching input.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/kv_cache_kernels.h"
#include "cuda/common/kv_codec.cuh"

namespace openmla::cuda {
namespace {

using kvcodec::Codec;
__device__ __forceinline__ void record_mismatch(unsigned long long* results, int check,
                                                uint64_t input) {
  atomicAdd(results + 2 * check, 1ull);
  atomicMin(results + 2 * check + 1, static_cast<unsigned long long>(input));
}

__global__ void kv_codec_self_check_init(unsigned long long* results) {
  if (threadIdx.x < 2 * kKVCodecChecks) results[threadIdx.x] = (threadIdx.x & 1) ? ~0ull : 0ull;
}

__global__ void __launch_bounds__(256) kv_codec_self_check_kernel(unsigned long long* results) {
  namespace kc = kvcodec;
  const uint64_t first = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const uint64_t step = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t u = first; u < (uint64_t{1} << 32); u += step) {
    const float x = __uint_as_float(static_cast<uint32_t>(u));
    // A partner value for the pair's other byte: a different bit pattern of every kind.
    const float y = __uint_as_float(static_cast<uint32_t>(u) * 2654435761u);
    const uint32_t pair = kc::float2_to_e4m3x2(x, y);
    if ((pair & 0xFFu) != kc::float_to_e4m3_sw(x)) record_mismatch(results, 0, u);
    if ((pair >> 8) != kc::float_to_e4m3_sw(y)) record_mismatch(results, 1, u);
    if (kc::float_to_fp16(x) != kc::float_to_fp16_sw(x)) record_mismatch(results, 2, u);
    if (u < 256) {
      // Four different codes per word (u, u+1, u+2, u+3), so the byte order is checked too.
      const uint32_t code = static_cast<uint32_t>(u);
      float e[4];
      kc::e4m3x4_to_float(code | ((code + 1) & 0xFFu) << 8 | ((code + 2) & 0xFFu) << 16 |
                              ((code + 3) & 0xFFu) << 24,
                          e);
      bool bad =
          __float_as_uint(kc::e4m3_to_float(code)) != __float_as_uint(kc::e4m3_to_float_sw(code));
      bad |= (code & 0x7Fu) != 0x7Fu && __float_as_uint(kc::e4m3_to_float_finite(code)) !=
                                            __float_as_uint(kc::e4m3_to_float_sw(code));
      for (uint32_t i = 0; i < 4; ++i) {
        const uint32_t c = (code + i) & 0xFFu;
        bad |= __float_as_uint(kc::host_mul_e4m3(c, e[i], 1.0f)) !=
               __float_as_uint(kc::e4m3_to_float_sw(c));
      }
      if (bad) record_mismatch(results, 3, u);
    }
    if (u < 65536 && __float_as_uint(kc::fp16_to_float(static_cast<uint32_t>(u))) !=
                         __float_as_uint(kc::fp16_to_float_sw(static_cast<uint32_t>(u)))) {
      record_mismatch(results, 4, u);
    }
  }
}

// fp4's division-free element encoders (compares, the FMA-pipe count, and the f16x2 count on the
// bf16 values) against the division, for scale code blockIdx.y + 1 (every positive finite e4m3
// code, 0x01..0x7E) and all 2^32 floats. Input recorded as code << 32 | float bits. With code 1
// also the bf16 path's group amax (VIMNMX3 on 16-bit lanes) against a plain loop on 2^24 sets of
// words, and its scale code against fp4_scale_code for every bf16 amax it takes.
__global__ void __launch_bounds__(256) kv_codec_fp4_check_kernel(unsigned long long* results) {
  namespace kc = kvcodec;
  const uint32_t code = blockIdx.y + 1;
  const float scale = kc::e4m3_to_float_sw(code);
  const kc::Fp4Bounds bounds = kc::fp4_bounds(scale);
  const kc::Fp4SatBounds sat_bounds = kc::fp4_sat_bounds(bounds);
  const uint64_t first = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const uint64_t step = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t u = first; u < (uint64_t{1} << 32); u += step) {
    const float x = __uint_as_float(static_cast<uint32_t>(u));
    const uint32_t expected = kc::float_to_e2m1(__fdiv_rn(x, scale));
    // The FMA-pipe encoder's nibble for a non-NaN x (NaN lanes are zeroed before it).
    const uint32_t sat_code = (kc::e2m1_count_biased(fabsf(x), sat_bounds) & 7u) |
                              ((static_cast<uint32_t>(u) >> 28) & 8u);
    if (kc::e2m1_of_quotient(x, bounds) != expected || (x == x && sat_code != expected)) {
      record_mismatch(results, 5, (uint64_t{code} << 32) | u);
    }
    // The f16x2 encoder for bf16 sources, on every bf16 it takes, in all eight nibbles.
    if (u < 0x10000u && (u & 0x7FFFu) < kc::kFp4H2MaxBits) {
      const uint32_t pair = static_cast<uint32_t>(u) * 0x10001u;
      const uint32_t w[4] = {pair, pair, pair, pair};
      const uint32_t want = kc::float_to_e2m1(__fdiv_rn(__uint_as_float(pair << 16), scale));
      if (kc::fp4_word_from_bf16(w, kc::fp4_h2_bounds(scale)) != want * 0x11111111u) {
        record_mismatch(results, 5, (uint64_t{code} << 32) | u);
      }
    }
    if (code == 1 && u < (1u << 24)) {
      // Words of mixed, all-negative (u >> 22 == 1) and all-positive (2) signs.
      uint32_t w[8], want = 0;
      for (uint32_t k = 0; k < 8; ++k) {
        w[k] = (static_cast<uint32_t>(u) + k * 0x01000193u) * 0x9E3779B1u;
        w[k] = (u >> 22) == 1 ? w[k] | 0x80008000u : (u >> 22) == 2 ? w[k] & 0x7FFF7FFFu : w[k];
        want = max(want, max(w[k] & 0x7FFFu, (w[k] >> 16) & 0x7FFFu));
      }
      const float amax = kc::bf16_to_float(static_cast<uint32_t>(u));
      if (__float_as_uint(kc::max_abs_bf16x16(w)) != want << 16 ||
          (u < kc::kFp4H2MaxBits && kc::fp4_scale_code_bf16(amax) != kc::fp4_scale_code(amax))) {
        record_mismatch(results, 5, (uint64_t{code} << 32) | u);
      }
    }
  }
}

}  // namespace

cudaError_t launch_kv_codec_self_check(unsigned long long* device_results, cudaStream_t stream) {
  kv_codec_self_check_init<<<1, 32, 0, stream>>>(device_results);
  kv_codec_self_check_kernel<<<4096, 256, 0, stream>>>(device_results);
  kv_codec_fp4_check_kernel<<<dim3(512, 126), 256, 0, stream>>>(device_results);
  return cudaGetLastError();
}

}  // namespace openmla::cuda
