// Locale-independent message building: every error and "not implemented" message of the library
// goes through str_cat, never through iostreams.
//
// Why: an ostream formats numbers through the global locale's num_put facet, so a caller that
// installs a locale with digit grouping would change our messages; and on the H200 device image
// the Python extension crashed (SIGSEGV in basic_ostream::_M_insert<long>, called from a
// validator building its message) where the same validators in a plain C++ binary passed.
// std::to_chars touches no locale.
#pragma once

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace openmla::core {

namespace str_cat_detail {

template <typename T>
void append(std::string& out, const T& v) {
  using U = std::decay_t<T>;
  if constexpr (std::is_array_v<T>) {  // string literals
    out += std::string_view(v);
  } else if constexpr (std::is_same_v<U, bool>) {
    out += v ? "true" : "false";
  } else if constexpr (std::is_same_v<U, char>) {
    out += v;
  } else if constexpr (std::is_integral_v<U> || std::is_enum_v<U>) {
    using I = std::conditional_t<std::is_enum_v<U>, std::underlying_type<U>, std::type_identity<U>>;
    char buf[24];
    const auto r = std::to_chars(buf, buf + sizeof buf, static_cast<typename I::type>(v));
    out.append(buf, r.ptr);
  } else if constexpr (std::is_floating_point_v<U>) {
    char buf[48];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);  // shortest round-trip form
    out.append(buf, r.ptr);
  } else if constexpr (std::is_same_v<U, const char*> || std::is_same_v<U, char*>) {
    out += v != nullptr ? v : "(null)";
  } else if constexpr (std::is_convertible_v<const U&, std::string_view>) {
    out += std::string_view(v);
  } else if constexpr (std::is_pointer_v<U>) {  // addresses: 0x + hex, nullptr as 0x0
    char buf[24];
    const auto r = std::to_chars(buf, buf + sizeof buf,
                                 reinterpret_cast<std::uintptr_t>(static_cast<const void*>(v)), 16);
    out += "0x";
    out.append(buf, r.ptr);
  } else {
    static_assert(sizeof(U) == 0, "str_cat: unsupported argument type");
  }
}

}  // namespace str_cat_detail

// Concatenates strings, characters, integers, floats and pointers into one string.
template <typename... Parts>
std::string str_cat(const Parts&... parts) {
  std::string out;
  (str_cat_detail::append(out, parts), ...);
  return out;
}

}  // namespace openmla::core
