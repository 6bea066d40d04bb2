// first_touch.h — the first touch of a fresh chunk by several threads, front
// to back, so that a registration can start behind the touch.
//
// Touching (a write of one zero byte per 4 KiB page) makes the kernel commit
// the pages, in parallel threads (one thread commits 4 KiB pages at about
// 2 GB/s, 16 threads over THP 26-55 GB/s on the H200). cudaHostRegister pins
// a range from its start on ONE thread and faults in itself any page not yet
// present (about ten times slower than pinning touched pages). So the threads
// here do not each take a fixed slice: they claim 2 MiB units in address order
// from one cursor, and the touched part grows from the chunk's base. A
// registration started once a prefix is touched walks behind the touch front;
// where it overtakes, it faults the pages itself, which is correct (the pages
// read as zero either way), only slower.
//
// A unit is 2 MiB and 2 MiB aligned (chunks are): no huge page is faulted by
// two touching threads.
//
// Lifecycle: the constructor starts the helper threads (none when the touch
// fault is injected); wait_touched() may be called at any time by one other
// thread; join() must be called once before destruction (the destructor joins
// too, for error paths). join() has the caller touch what no helper took, so
// the chunk is fully touched even where no thread could be started.
//
// Locking: mu_ guards prefix_units_, done_, helpers_running_; the cursor and
// the stop flag are atomics. No system call under mu_ (touching is a page
// fault, done outside it).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "os/memory.h"

namespace ferry {

class FirstTouch {
 public:
  static constexpr size_t kUnitBytes = os::kHugePage2MBytes;

  // Starts up to `threads` helper threads touching [base, base + bytes).
  // Preconditions: the range is mapped read-write, base 2 MiB aligned,
  // bytes > 0; threads >= 1.
  FirstTouch(uintptr_t base, size_t bytes, int threads);
  ~FirstTouch();
  FirstTouch(const FirstTouch&) = delete;
  FirstTouch& operator=(const FirstTouch&) = delete;

  // Blocks until the first `bytes` of the chunk are touched (true), or until
  // no helper is left to touch them (none started, the touch fault injected,
  // stop()) or `*cancel` became true (false). `cancel` is polled every
  // millisecond; it may be null.
  bool wait_touched(size_t bytes, const std::atomic<bool>* cancel);

  // Helpers take no new unit after this; what they are touching completes.
  void stop() noexcept;

  // Touches the units no helper took (unless stopped), waits for the
  // helpers. Returns 0, ENOMEM (touch fault injected: nothing touched) or
  // ECANCELED (stopped before the whole chunk was touched).
  int join() noexcept;

  // From construction until the last unit was touched (or until join()
  // returned, when the touch did not complete). Valid after join().
  uint64_t elapsed_ns() const noexcept { return elapsed_ns_; }

 private:
  // Claims and touches units until none is left or stop(); returns how many.
  void run() noexcept;
  void unit_done(size_t unit) noexcept;

  const uintptr_t base_;
  const size_t bytes_;
  const size_t units_;
  const std::chrono::steady_clock::time_point start_;
  std::atomic<size_t> next_unit_{0};
  std::atomic<bool> stop_{false};
  int error_ = 0;  // set before any thread starts; read-only afterwards
  bool joined_ = false;  // owner only
  uint64_t elapsed_ns_ = 0;  // owner only, set by join()

  std::mutex mu_;
  std::condition_variable cv_;     // the prefix grew, or a helper left
  size_t prefix_units_ = 0;        // mu_: units [0, prefix) are all touched
  std::chrono::steady_clock::time_point touched_at_{};  // mu_: when the prefix became whole
  std::vector<bool> done_;         // mu_: per unit, touched
  int helpers_running_ = 0;        // mu_
  std::vector<std::thread> helpers_;  // owner only
};

}  // namespace ferry
