// futex.h — waiting on a 32-bit word that several processes map (MAP_SHARED):
// the non-private futex calls, which match waiters by the page, not by the
// address in one process (std::atomic::wait may use the private ones).
//
// The contract of memory.h: 0 or an errno value, nothing thrown.
#pragma once

#include <cstdint>

namespace ferry::os {

// Sleeps while *word == expected, at most timeout_ns (negative: no limit).
// 0: woken (or the word had changed: EAGAIN is folded into 0); ETIMEDOUT;
// EINTR (a signal: the caller looks again).
int futex_wait_shared(uint32_t* word, uint32_t expected, int64_t timeout_ns) noexcept;

// Wakes every process waiting on the word.
int futex_wake_shared(uint32_t* word) noexcept;

}  // namespace ferry::os
