// thread_counts.h — how many threads ferry starts when the user does not say.
#pragma once

namespace ferry {

// Default copy, touch and reader threads (the engine's workers and crews, the
// arena's first touch, the loader's readers): one per usable core, at most
// this many. Host memcpy on the H200 machine reached 32 GB/s with 4 threads
// and 37 with 16 (DESIGN.md); past that the memory bus, not the thread count,
// is the limit (page-cache reads too), and more threads only add wake-up cost
// and contention. Users (and the profile's `workers`) may ask for more, up to
// kMaxThreads (core/options.h).
inline constexpr int kDefaultThreadCap = 16;

// The default thread count for work that may run on `cpus` CPUs (the CPUs its
// threads are bound to, or os::usable_cores(): os::cpus_or_usable): one per
// CPU, at least 1, at most kDefaultThreadCap. The one place this rule lives.
constexpr int default_thread_count(int cpus) noexcept {
  return cpus < 1 ? 1 : (cpus > kDefaultThreadCap ? kDefaultThreadCap : cpus);
}

}  // namespace ferry
