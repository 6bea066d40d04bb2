// error.cpp — message formatting for ferry's exceptions.
#include "core/error.h"

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

namespace ferry {

OsError::OsError(const std::string& call, int err)
    : Error(err == ENOMEM ? FERRY_ERROR_OUT_OF_MEMORY : FERRY_ERROR_OS,
            call + " failed: " + std::strerror(err) + " (errno " + std::to_string(err) + ")"),
      errno_(err) {}

std::string format_address(uintptr_t address) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%" PRIxPTR, address);
  return buf;
}

std::string format_bytes(size_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 6) {
    v /= 1024.0;
    ++u;
  }
  char buf[48];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%zu B", bytes);
  else if (v == static_cast<double>(static_cast<long long>(v)))
    std::snprintf(buf, sizeof buf, "%.0f %s", v, units[u]);
  else
    std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

std::string printable(std::string_view text) {
  constexpr size_t kMax = 200;
  std::string out;
  for (size_t i = 0; i < text.size() && i < kMax; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (text.size() > kMax) out += "...";
  return out;
}

}  // namespace ferry
