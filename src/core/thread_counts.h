// thread_counts.h — how many threads ferry starts when the user does not say.
#pragma once

namespace ferry {

// Default copy and touch threads: one per usable core, at most this many.
// Host memcpy on the H200 machine reached 32 GB/s with 4 threads and 37 with
// 16 (DESIGN.md); past that the memory bus, not the thread count, is the
// limit, and more threads only add wake-up cost and contention. Users (and
// the profile's `workers`) may ask for more, up to kMaxThreads (core/options.h).
inline constexpr int kDefaultThreadCap = 16;

}  // namespace ferry
