// struct_size.h — how the C API reads and writes ferry.h's growable structs
// (the rule is in ferry.h's header comment): only the members that lie within
// the caller's struct_size, so a caller built against an older (smaller) or a
// newer (larger) ferry.h keeps working.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <type_traits>

#include "core/error.h"

namespace ferry::capi {

inline constexpr size_t kMaxStructSize = 4096;  // larger: struct_size was not set

// The caller's struct_size, checked: a multiple of 8 from 8 to kMaxStructSize.
template <class T>
size_t caller_struct_size(const T* s, const char* what) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) % 8 == 0 && offsetof(T, struct_size) == 0);
  const size_t n = s->struct_size;
  if (n < sizeof(size_t) || n > kMaxStructSize || n % 8 != 0)
    throw InvalidArgument(std::string(what) + "->struct_size=" + std::to_string(n) + ": expected sizeof the struct (" +
                          std::to_string(sizeof(T)) + " in this library's ferry.h); set it before the call");
  return n;
}

// An input struct: the caller's members laid over `defaults` (members beyond the
// caller's struct_size keep their defaults; members the library does not know
// are ignored).
template <class T>
T read_struct(const T* in, T defaults, const char* what) {
  std::memcpy(static_cast<void*>(&defaults), in, std::min(caller_struct_size(in, what), sizeof(T)));
  defaults.struct_size = sizeof(T);
  return defaults;
}

// A create or open call's options: the caller's laid over `defaults` as
// read_struct does, or `defaults` when the caller passed none (NULL).
template <class T>
T options_or(const T* given, T defaults) {
  return given ? read_struct(given, defaults, "options") : defaults;
}

// An output struct: the members of `value` that fit the caller's struct_size;
// struct_size becomes the number of bytes written.
template <class T>
void write_struct(T* out, T value, const char* what) {
  const size_t n = std::min(caller_struct_size(out, what), sizeof(T));
  value.struct_size = n;
  std::memcpy(static_cast<void*>(out), &value, n);
}

}  // namespace ferry::capi
