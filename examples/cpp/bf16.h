// bf16 <-> float for the examples' host data (the public API takes bf16 as raw 16-bit words;
// an engine has its own conversions).
#pragma once

#include <cstdint>
#include <cstring>

namespace example {

inline uint16_t to_bf16(float x) {  // round to nearest even (finite inputs)
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

inline float from_bf16(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &bits, 4);
  return x;
}

}  // namespace example
