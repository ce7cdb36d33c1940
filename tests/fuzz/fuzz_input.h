// What the fuzz targets share: a reader of the fuzzer's bytes for structural choices, and a
// generator seeded from them for bulk data (cache bytes, q), so that a short input still
// reaches deep into an operation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace openmla::fuzz {

class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  // The next sizeof(T) bytes (zeros once the input runs out).
  template <typename T>
  T take() {
    T value{};
    const size_t n = sizeof(T) < size_ ? sizeof(T) : size_;
    std::memcpy(&value, data_, n);
    data_ += n;
    size_ -= n;
    return value;
  }
  int below(int n) { return static_cast<int>(take<uint8_t>() % n); }
  bool flag() { return take<uint8_t>() & 1; }

 private:
  const uint8_t* data_;
  size_t size_;
};

// splitmix64: bulk data from a seed the input chooses.
class Bulk {
 public:
  explicit Bulk(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

 private:
  uint64_t state_;
};

}  // namespace openmla::fuzz
