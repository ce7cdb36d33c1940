// Test helpers shared by the CPU and GPU tiers (no test framework in here): seeded random data,
// host tensors that own their (possibly strided, poisoned) storage, bf16/fp16 bit conversions
// written independently of src/core, random permutations, KV caches written through the codec,
// and error metrics.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <numeric>
#include <random>
#include <vector>

#include "core/codec.h"
#include "openmla/kv_format.h"
#include "openmla/tensor.h"

namespace openmla::testing {

// --- random numbers ---------------------------------------------------------------------------
class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  double uniform(double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(gen_);
  }
  double normal() { return std::normal_distribution<double>(0.0, 1.0)(gen_); }
  // Uniform integer in [lo, hi] (inclusive).
  int64_t randint(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(gen_);
  }
  bool coin(double p_true = 0.5) { return uniform(0.0, 1.0) < p_true; }
  std::mt19937_64& engine() { return gen_; }

 private:
  std::mt19937_64 gen_;
};

// A random permutation of 0 .. n-1.
inline std::vector<int32_t> random_permutation(int64_t n, Rng& rng) {
  std::vector<int32_t> p(n);
  std::iota(p.begin(), p.end(), 0);
  std::shuffle(p.begin(), p.end(), rng.engine());
  return p;
}

// --- 16-bit floats, by bit arithmetic (independent of src/core/codec) -------------------------
inline double bf16_bits_to_double(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

inline double fp16_bits_to_double(uint16_t bits) {
  const int sign = bits >> 15, exponent = (bits >> 10) & 0x1F, mantissa = bits & 0x3FF;
  double v;
  if (exponent == 0) {
    v = std::ldexp(static_cast<double>(mantissa), -24);
  } else if (exponent == 31) {
    v = mantissa ? std::numeric_limits<double>::quiet_NaN()
                 : std::numeric_limits<double>::infinity();
  } else {
    v = std::ldexp(static_cast<double>(mantissa | 0x400), exponent - 25);
  }
  return sign ? -v : v;
}

// Round-to-nearest-even of a finite value to bf16 bits (NaN stays NaN).
inline uint16_t double_to_bf16_bits(double x) {
  const float f = static_cast<float>(x);
  if (std::isnan(f)) return 0x7FC0;
  uint32_t bits = std::bit_cast<uint32_t>(f);
  bits += 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

// Round-to-nearest-even to fp16 bits, saturating to inf beyond the range (for data generation).
inline uint16_t double_to_fp16_bits(double x) {
  if (std::isnan(x)) return 0x7E00;
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  if (a >= 65520.0) return sign | 0x7C00;
  int exponent;
  std::frexp(a, &exponent);  // a = m * 2^exponent, m in [0.5, 1)
  // Quantum of the binade (subnormals share the 2^-24 quantum).
  const int quantum_exp = std::max(exponent - 11, -24);
  const double q = std::nearbyint(std::ldexp(a, -quantum_exp));  // ties to even (default mode)
  const double v = std::ldexp(q, quantum_exp);
  if (v == 0.0) return sign;
  int e2;
  std::frexp(v, &e2);
  if (e2 - 1 < -14) return sign | static_cast<uint16_t>(std::ldexp(v, 24));  // subnormal
  const int biased = e2 - 1 + 15;
  const uint16_t mantissa = static_cast<uint16_t>(std::ldexp(v, 11 - e2)) & 0x3FF;
  return sign | static_cast<uint16_t>(biased << 10) | mantissa;
}

// --- host tensors -----------------------------------------------------------------------------
// 64-byte aligned bytes, released on destruction.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes) : bytes_(bytes) {
    data_.reset(
        static_cast<uint8_t*>(::operator new(std::max<size_t>(bytes, 64), std::align_val_t(64))));
  }
  uint8_t* data() const { return data_.get(); }
  size_t bytes() const { return bytes_; }

 private:
  struct Free {
    void operator()(uint8_t* p) const { ::operator delete(p, std::align_val_t(64)); }
  };
  std::unique_ptr<uint8_t, Free> data_;
  size_t bytes_ = 0;
};

// A tensor that owns its storage. Strides (in elements) may leave gaps; storage covers the
// largest offset. Elements are read and written as double, converted by dtype.
class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(DType dtype, std::vector<int64_t> shape, std::vector<int64_t> strides = {})
      : shape_(std::move(shape)), strides_(std::move(strides)) {
    view_.dtype = dtype;
    view_.rank = static_cast<int>(shape_.size());
    if (strides_.empty()) {
      strides_.assign(shape_.size(), 1);
      for (int d = view_.rank - 2; d >= 0; --d) strides_[d] = strides_[d + 1] * shape_[d + 1];
    }
    int64_t span = 1;
    for (int d = 0; d < view_.rank; ++d) {
      view_.shape[d] = shape_[d];
      view_.strides[d] = strides_[d];
      if (shape_[d] == 0) span = 0;
    }
    if (span != 0) {
      for (int d = 0; d < view_.rank; ++d) span += (shape_[d] - 1) * strides_[d];
    }
    num_storage_ = span;
    buffer_ = AlignedBuffer(static_cast<size_t>(span) * dtype_size_bytes(dtype));
    view_.data = buffer_.data();
    std::memset(buffer_.data(), 0, buffer_.bytes());
  }

  const TensorView& view() const { return view_; }
  TensorView& view() { return view_; }
  DType dtype() const { return view_.dtype; }
  int rank() const { return view_.rank; }
  int64_t numel() const { return view_.numel(); }
  int64_t size(int d) const { return shape_[d]; }
  int64_t storage_elements() const { return num_storage_; }

  int64_t offset(const std::vector<int64_t>& index) const {
    int64_t o = 0;
    for (size_t d = 0; d < index.size(); ++d) o += index[d] * strides_[d];
    return o;
  }

  // Storage element `o` (not a logical index), as double / from double.
  double get_storage(int64_t o) const {
    const uint8_t* p = buffer_.data() + o * dtype_size_bytes(view_.dtype);
    switch (view_.dtype) {
      case DType::kBF16:
        return bf16_bits_to_double(load<uint16_t>(p));
      case DType::kFP16:
        return fp16_bits_to_double(load<uint16_t>(p));
      case DType::kFP32:
        return load<float>(p);
      case DType::kInt32:
        return load<int32_t>(p);
      case DType::kInt64:
        return static_cast<double>(load<int64_t>(p));
      case DType::kUInt8:
        return load<uint8_t>(p);
    }
    return 0.0;
  }
  void set_storage(int64_t o, double v) {
    uint8_t* p = buffer_.data() + o * dtype_size_bytes(view_.dtype);
    switch (view_.dtype) {
      case DType::kBF16:
        store<uint16_t>(p, double_to_bf16_bits(v));
        break;
      case DType::kFP16:
        store<uint16_t>(p, double_to_fp16_bits(v));
        break;
      case DType::kFP32:
        store<float>(p, static_cast<float>(v));
        break;
      case DType::kInt32:
        store<int32_t>(p, static_cast<int32_t>(v));
        break;
      case DType::kInt64:
        store<int64_t>(p, static_cast<int64_t>(v));
        break;
      case DType::kUInt8:
        store<uint8_t>(p, static_cast<uint8_t>(v));
        break;
    }
  }
  double get(const std::vector<int64_t>& index) const { return get_storage(offset(index)); }
  void set(const std::vector<int64_t>& index, double v) { set_storage(offset(index), v); }

  // Fills every storage element (gaps included) with NaN (floats) or `int_value` (integers).
  void poison(double int_value = -7) {
    const bool is_float =
        view_.dtype == DType::kBF16 || view_.dtype == DType::kFP16 || view_.dtype == DType::kFP32;
    for (int64_t o = 0; o < num_storage_; ++o) {
      set_storage(o, is_float ? std::numeric_limits<double>::quiet_NaN() : int_value);
    }
  }

  // Calls f(index) for every logical index, row-major.
  template <typename F>
  void for_each_index(F&& f) const {
    if (numel() == 0) return;
    std::vector<int64_t> index(shape_.size(), 0);
    while (true) {
      f(index);
      int d = view_.rank - 1;
      while (d >= 0 && ++index[d] == shape_[d]) index[d--] = 0;
      if (d < 0) return;
    }
  }
  // Every logical element drawn from N(0, sigma^2) (rounded to the dtype).
  void fill_normal(Rng& rng, double sigma = 1.0) {
    for_each_index([&](const std::vector<int64_t>& i) { set(i, sigma * rng.normal()); });
  }
  // Logical elements in row-major order, as doubles.
  std::vector<double> values() const {
    std::vector<double> v;
    v.reserve(numel());
    for_each_index([&](const std::vector<int64_t>& i) { v.push_back(get(i)); });
    return v;
  }

 private:
  template <typename T>
  static T load(const uint8_t* p) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
  }
  template <typename T>
  static void store(uint8_t* p, T v) {
    std::memcpy(p, &v, sizeof(T));
  }

  std::vector<int64_t> shape_, strides_;
  int64_t num_storage_ = 0;
  AlignedBuffer buffer_;
  TensorView view_;
};

// Storage elements of a poisoned float tensor that lie outside its logical view (the gaps its
// strides leave) and no longer hold NaN: an operation wrote where it must not.
inline int64_t count_written_gaps(const HostTensor& t) {
  std::vector<bool> logical(t.storage_elements(), false);
  t.for_each_index([&](const std::vector<int64_t>& i) { logical[t.offset(i)] = true; });
  int64_t written = 0;
  for (int64_t o = 0; o < t.storage_elements(); ++o) {
    if (!logical[o] && !std::isnan(t.get_storage(o))) ++written;
  }
  return written;
}

// A host KV cache of `num_blocks` blocks under `layout`, every byte set to `fill`.
struct HostKVCache {
  AlignedBuffer buffer;
  KVCache cache;

  HostKVCache(const KVLayout& layout, int64_t num_blocks, uint8_t fill = 0xFF)
      : buffer(static_cast<size_t>(std::max<int64_t>(num_blocks, 1) * layout.block_stride)) {
    std::memset(buffer.data(), fill, buffer.bytes());
    cache.data = buffer.data();
    cache.layout = layout;
    cache.num_blocks = num_blocks;
    cache.device = Device::cpu();
  }
};

// OPENMLA_TEST_VERBOSE=1 makes the tests print the errors they measure.
inline bool verbose() {
  static const bool v = [] {
    const char* e = std::getenv("OPENMLA_TEST_VERBOSE");
    return e != nullptr && e[0] != '\0' && e[0] != '0';
  }();
  return v;
}

// A token of `d` values whose groups of 32 dims have magnitudes from 2^-3 to 2^3, so every
// group of a quantised format gets its own scale.
inline std::vector<float> random_token(Rng& rng, int d) {
  std::vector<float> x(d);
  double magnitude = 1.0;
  for (int i = 0; i < d; ++i) {
    if (i % 32 == 0) magnitude = std::ldexp(1.0, static_cast<int>(rng.randint(-3, 3)));
    x[i] = static_cast<float>(magnitude * rng.normal());
  }
  return x;
}

// Writes random tokens into the `live` slots of a cache through the codec (the other slots keep
// HostKVCache's 0xFF fill: NaN in every format's scales). Returns the tokens by slot (empty for
// dead slots).
inline std::vector<std::vector<float>> fill_random_cache(HostKVCache* cache, Rng& rng,
                                                         const std::vector<int64_t>& live) {
  const int d = kv_format_info(cache->cache.layout.format, cache->cache.layout.d_qk).d_qk;
  std::vector<std::vector<float>> tokens(cache->cache.num_tokens());
  for (int64_t slot : live) {
    tokens[slot] = random_token(rng, d);
    codec::encode_slot(cache->cache, slot, tokens[slot].data());
  }
  return tokens;
}

// The default or token-interleaved layout of `format`, with `pad_bytes` of gap after each block.
inline KVLayout test_layout(KVFormat format, int page_size, int d_qk, bool interleaved,
                            int64_t pad_bytes) {
  KVLayout layout = interleaved ? interleaved_kv_layout(format, page_size, d_qk)
                                : default_kv_layout(format, page_size, d_qk);
  layout.block_stride += pad_bytes;
  return layout;
}

// --- metrics ----------------------------------------------------------------------------------
// ‖got − ref‖₂ / ‖ref‖₂ (‖got‖₂ when ref is all zero, so zero against zero is 0).
inline double relative_l2_error(const std::vector<double>& got, const std::vector<double>& ref) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < got.size() && i < ref.size(); ++i) {
    diff += (got[i] - ref[i]) * (got[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  if (got.size() != ref.size()) return std::numeric_limits<double>::infinity();
  return norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// Largest |got − ref| / max(1, |ref|) over matching finite pairs; non-finite values must match
// exactly (same infinity, or both NaN), else the result is +inf.
inline double max_lse_error(const std::vector<double>& got, const std::vector<double>& ref) {
  if (got.size() != ref.size()) return std::numeric_limits<double>::infinity();
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(ref[i]) || !std::isfinite(got[i])) {
      const bool same = (std::isnan(ref[i]) && std::isnan(got[i])) || got[i] == ref[i];
      if (!same) return std::numeric_limits<double>::infinity();
      continue;
    }
    worst = std::max(worst, std::fabs(got[i] - ref[i]) / std::max(1.0, std::fabs(ref[i])));
  }
  return worst;
}

}  // namespace openmla::testing
