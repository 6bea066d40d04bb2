// touch.cpp — parallel first touch.
#include "os/touch.h"

#include <algorithm>
#include <cerrno>
#include <thread>
#include <vector>

#include "core/fault.h"
#include "os/memory.h"

namespace ferry::os {
namespace {

void touch_slice(char* begin, char* end) noexcept {
  for (volatile char* q = begin; q < end; q += kSmallPageBytes) *q = 0;
}

}  // namespace

int touch_pages(void* p, size_t bytes, int threads) noexcept {
  if (int err = fault_error(FaultPoint::touch, ENOMEM)) return err;
  char* const base = static_cast<char*>(p);
  const size_t units = (bytes + kHugePage2MBytes - 1) / kHugePage2MBytes;
  const size_t workers = std::clamp<size_t>(units, 1, static_cast<size_t>(std::max(threads, 1)));
  const size_t slice_bytes = (units + workers - 1) / workers * kHugePage2MBytes;
  auto begin_of = [&](size_t i) { return base + std::min(bytes, i * slice_bytes); };

  std::vector<std::thread> helpers;
  size_t next = 1;  // slices 1.. go to helper threads while they can be started
  try {
    helpers.reserve(workers - 1);
    for (; next < workers; ++next) helpers.emplace_back(touch_slice, begin_of(next), begin_of(next + 1));
  } catch (...) {
    // Out of threads or memory: the caller does the remaining slices itself.
  }
  touch_slice(begin_of(0), begin_of(1));
  touch_slice(begin_of(next), begin_of(workers));
  for (auto& t : helpers) t.join();
  return 0;
}

}  // namespace ferry::os
