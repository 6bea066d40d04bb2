// stats.h — counter arithmetic and the accounting invariants of pool.h.
//
// Counter: current moves up and down; peak is the highest current seen; total
// sums every increase. The invariants (per kind):
//   reserved  = committed + released
//   committed = in_use + cached
#pragma once

#include <cstdint>
#include <string>

#include "pool/pool.h"

namespace ferry {

inline void counter_add(Counter& c, uint64_t n) {
  c.current += n;
  c.total += n;
  if (c.current > c.peak) c.peak = c.current;
}

inline void counter_sub(Counter& c, uint64_t n) { c.current -= n; }

inline KindStats& kind_stats(PoolStats& s, PageKind k) { return s.kind[static_cast<int>(k)]; }

// "" when the invariants hold for both kinds, else which one broke, with the numbers.
std::string accounting_violation(const PoolStats& s);

// One line per kind, for messages and test failures.
std::string describe(const PoolStats& s);

}  // namespace ferry
