// Host codecs of the KV-cache formats (docs/formats.md): the one definition of every byte, used by the
// CPU backend, the tests, the write kernels' reference and the Python package.
//
// Quantiser, per group of dims (amax over the group's finite values; inf saturates, NaN stays NaN):
//   fp8_v32, fp8_model1, fp8_mx: scale = 2^ceil(log2(max(amax / 448, 1e-4)))   (exact power of two)
//   fp4:                         scale = e4m3(max(amax / 6, 1e-4)) (RNE, >= 2^-9); the stored value
//                                divides
//   element = round-to-nearest-even(x / scale) (x / scale as one float32 division), saturating.
// Dequantised value = decode(element) * scale.
#pragma once

#include <cstdint>

#include "openmla/kv_format.h"

namespace openmla::codec {

// --- scalar conversions ---------------------------------------------------------------------
float bf16_to_float(uint16_t bits);
uint16_t float_to_bf16(float x);  // round to nearest even; NaN stays NaN
float fp16_to_float(uint16_t bits);
uint16_t float_to_fp16(float x);  // round to nearest even

// e4m3 "fn": max 448, no inf, 0x7F/0xFF NaN. Saturating: |x| > 448 (and ±inf) → ±448; NaN → 0x7F.
float e4m3_to_float(uint8_t bits);
uint8_t float_to_e4m3(float x);

// e8m0: 2^(bits - 127), 255 is NaN.
float e8m0_to_float(uint8_t bits);
// The e8m0 code of 2^exponent (exponent clamped to [-127, 127]).
uint8_t e8m0_from_exponent(int exponent);

// e2m1 nibble (bit 3 sign, then 2 exponent bits and 1 mantissa bit): ±{0, .5, 1, 1.5, 2, 3, 4, 6}.
// Saturating: |x| > 6 (and ±inf) → ±6; NaN → +0 (e2m1 has no NaN; the token's scale cannot carry
// one either, so NaN inputs of an fp4 cache are lost; documented in README).
float e2m1_to_float(uint8_t nibble);
uint8_t float_to_e2m1(float x);

// FP4 packing convention, the one place it is defined: dim 2i in the low nibble, 2i+1 in the high.
inline uint8_t fp4_pack(uint8_t even_dim_nibble, uint8_t odd_dim_nibble) {
  return static_cast<uint8_t>((even_dim_nibble & 0xF) | ((odd_dim_nibble & 0xF) << 4));
}
inline uint8_t fp4_unpack(uint8_t byte, int dim) {
  return (dim & 1) ? static_cast<uint8_t>(byte >> 4) : static_cast<uint8_t>(byte & 0xF);
}

// --- group scales ---------------------------------------------------------------------------
// Largest |x| over the finite values of x[0..n) (0 if none).
float finite_amax(const float* x, int n);
// Power-of-two scale for e4m3 elements (fp8_v32/model1/mx): returns the exponent e, scale = 2^e.
int pow2_scale_exponent(float amax);
// fp4's scale as stored (e4m3 bits).
uint8_t fp4_scale_e4m3(float amax);

// --- tokens ---------------------------------------------------------------------------------
// Byte pointer of block `block` of a cache with `layout`.
inline uint8_t* block_ptr(void* base, const KVLayout& layout, int64_t block) {
  return static_cast<uint8_t*>(base) + block * layout.block_stride;
}
inline const uint8_t* block_ptr(const void* base, const KVLayout& layout, int64_t block) {
  return static_cast<const uint8_t*>(base) + block * layout.block_stride;
}

// Quantises one token of d_qk floats into token `token` of the block at `block`.
// Every byte of the token's data, scale and rope parts is written (padding bytes set to 0).
void encode_token(const KVLayout& layout, const float* x, uint8_t* block, int token);
// Dequantises token `token` of the block at `block` into d_qk floats.
void decode_token(const KVLayout& layout, const uint8_t* block, int token, float* out);

// Slot-addressed helpers over a KVCache (slot = block * page_size + offset; caller checks range).
void encode_slot(const KVCache& cache, int64_t slot, const float* x);
void decode_slot(const KVCache& cache, int64_t slot, float* out);

}  // namespace openmla::codec
