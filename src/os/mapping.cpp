// mapping.cpp — address-space checks (msync with MS_ASYNC flushes nothing for
// anonymous memory; it fails with ENOMEM on an unmapped page).
#include "os/mapping.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

namespace ferry::os {

int range_is_mapped(const void* p, size_t bytes) noexcept {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  uintptr_t begin = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  uintptr_t end = reinterpret_cast<uintptr_t>(p) + bytes;
  if (end < begin) return EINVAL;  // wraps around
  return msync(reinterpret_cast<void*>(begin), end - begin, MS_ASYNC) == 0 ? 0 : errno;
}

}  // namespace ferry::os
