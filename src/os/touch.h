// touch.h — first touch of a fresh range, in parallel threads.
//
// Writing one zero byte to every 4 KiB page makes the kernel commit the range
// (allocating huge pages where the range is advised so) while leaving its
// contents zero. Parallel threads matter: one thread commits about 2 GB/s with
// 4 KiB pages, 16 threads over THP reach 26-55 GB/s (the H200 machine:
// docs/doctor-h200.txt).
#pragma once

#include <cstddef>

namespace ferry::os {

// Writes a zero byte to each 4 KiB page of [p, p + bytes) using up to `threads`
// threads (the caller is one of them); each thread gets a slice that starts on
// a 2 MiB boundary so that no huge page is faulted by two threads. A thread
// that cannot be started has its slice done by the caller.
// Returns 0, or ENOMEM when the touch fault is injected (nothing is touched).
// Preconditions: [p, p + bytes) is mapped read-write; threads >= 1.
int touch_pages(void* p, size_t bytes, int threads) noexcept;

}  // namespace ferry::os
