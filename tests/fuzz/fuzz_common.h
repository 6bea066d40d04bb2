// fuzz_common.h — what every fuzz target shares: an input as text, and the rule
// that a parser may reject input only with ferry::Error (anything else escaping
// is a bug: libFuzzer reports the uncaught exception as a crash), and that an
// invariant it breaks is a crash too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"

namespace ferry::fuzz {

inline std::string text(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// Runs `parse`; a ferry::Error is a rejection (fine), anything else escapes.
template <class F>
bool accepted(F&& parse) {
  try {
    parse();
    return true;
  } catch (const Error&) {
    return false;
  }
}

[[noreturn]] inline void broken(const char* what) {
  std::fprintf(stderr, "fuzz invariant broken: %s\n", what);
  std::abort();
}

inline void require(bool ok, const char* what) {
  if (!ok) broken(what);
}

}  // namespace ferry::fuzz
