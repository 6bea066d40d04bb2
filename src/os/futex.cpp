// futex.cpp — FUTEX_WAIT / FUTEX_WAKE without FUTEX_PRIVATE_FLAG.
#include "os/futex.h"

#include <cerrno>
#include <climits>
#include <ctime>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace ferry::os {

int futex_wait_shared(uint32_t* word, uint32_t expected, int64_t timeout_ns) noexcept {
  timespec ts{};
  timespec* limit = nullptr;
  if (timeout_ns >= 0) {
    ts.tv_sec = static_cast<time_t>(timeout_ns / 1000000000);
    ts.tv_nsec = static_cast<long>(timeout_ns % 1000000000);
    limit = &ts;
  }
  if (::syscall(SYS_futex, word, FUTEX_WAIT, expected, limit, nullptr, 0) == 0) return 0;
  return errno == EAGAIN ? 0 : errno;
}

int futex_wake_shared(uint32_t* word) noexcept {
  return ::syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0) < 0 ? errno : 0;
}

}  // namespace ferry::os
