// pool_fixture.h — test support shared by the core tests of Pool
// (tests/core/pool_*_test.cpp): the PoolTest fixture (clears fault injection),
// small-chunk options, the accounting check after a step, sums of the stats
// over both page kinds, byte patterns that show an overwrite, live allocations
// that must not overlap, stats that must not change, and hooks that record
// every chunk they are given.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/fault.h"
#include "pool/pool.h"
#include "pool/stats.h"

namespace ferry::test_support {

inline constexpr size_t KiB = size_t{1} << 10, MiB = size_t{1} << 20, GiB = size_t{1} << 30;

class PoolTest : public ::testing::Test {
 protected:
  void TearDown() override { set_fault_injection(""); }
};

inline PoolOptions small_chunks(size_t chunk = 8 * MiB) {
  PoolOptions o;
  o.chunk_bytes = chunk;
  o.touch_threads = 2;
  return o;
}

inline size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

#define EXPECT_CONSISTENT(pool)                                          \
  do {                                                                   \
    const PoolStats s_ = (pool).stats();                                 \
    EXPECT_EQ(accounting_violation(s_), "") << describe(s_);             \
  } while (0)

inline uint64_t in_use(const PoolStats& s) { return s.kind[0].in_use.current + s.kind[1].in_use.current; }
inline uint64_t reserved(const PoolStats& s) { return s.kind[0].reserved.current + s.kind[1].reserved.current; }
inline uint64_t cached(const PoolStats& s) { return s.kind[0].cached.current + s.kind[1].cached.current; }
inline uint64_t released(const PoolStats& s) { return s.kind[0].released.current + s.kind[1].released.current; }

// A pattern: every byte of the first and last 8 KiB, every 4093rd in between.
template <class F>
void for_each_checked_offset(size_t n, F f) {
  constexpr size_t kDense = 8 * KiB;
  if (n <= 3 * kDense) {
    for (size_t i = 0; i < n; ++i) f(i);
    return;
  }
  for (size_t i = 0; i < kDense; ++i) f(i);
  for (size_t i = kDense; i < n - kDense; i += 4093) f(i);
  for (size_t i = n - kDense; i < n; ++i) f(i);
}

inline uint8_t pattern_byte(uint64_t seed, size_t i) {
  uint64_t x = seed ^ (i * 0x9E3779B97F4A7C15ull);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  return static_cast<uint8_t>(x >> 32);
}

inline void write_pattern(void* p, size_t n, uint64_t seed) {
  auto* b = static_cast<uint8_t*>(p);
  for_each_checked_offset(n, [&](size_t i) { b[i] = pattern_byte(seed, i); });
}

// Offset of the first wrong byte, or SIZE_MAX.
inline size_t check_pattern(const void* p, size_t n, uint64_t seed) {
  const auto* b = static_cast<const uint8_t*>(p);
  size_t bad = SIZE_MAX;
  for_each_checked_offset(n, [&](size_t i) {
    if (bad == SIZE_MAX && b[i] != pattern_byte(seed, i)) bad = i;
  });
  return bad;
}

inline bool all_zero(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  return std::all_of(b, b + n, [](uint8_t v) { return v == 0; });
}

struct Live {
  uintptr_t begin;
  size_t size;   // rounded: what the pool holds for it
  size_t bytes;  // asked for: what the pattern covers
  uint64_t seed;
  PageKind kind;
};

inline void expect_no_overlap(std::vector<Live> live) {
  std::sort(live.begin(), live.end(), [](const Live& a, const Live& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < live.size(); ++i)
    EXPECT_LE(live[i - 1].begin + live[i - 1].size, live[i].begin)
        << "allocations at " << std::hex << live[i - 1].begin << " and " << live[i].begin << " overlap";
}

inline void expect_same_stats(const PoolStats& a, const PoolStats& b) {
  for (int k = 0; k < 2; ++k) {
    const Counter* ca[] = {&a.kind[k].reserved, &a.kind[k].committed, &a.kind[k].in_use, &a.kind[k].cached,
                           &a.kind[k].released};
    const Counter* cb[] = {&b.kind[k].reserved, &b.kind[k].committed, &b.kind[k].in_use, &b.kind[k].cached,
                           &b.kind[k].released};
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(ca[i]->current, cb[i]->current) << "kind " << k << " counter " << i;
      EXPECT_EQ(ca[i]->peak, cb[i]->peak) << "kind " << k << " counter " << i;
      EXPECT_EQ(ca[i]->total, cb[i]->total) << "kind " << k << " counter " << i;
    }
  }
  EXPECT_EQ(a.allocations, b.allocations);
  EXPECT_EQ(a.frees, b.frees);
  EXPECT_EQ(a.recycles, b.recycles);
  EXPECT_EQ(a.chunk_reservations, b.chunk_reservations);
  EXPECT_EQ(a.chunk_releases, b.chunk_releases);
  EXPECT_EQ(a.fallbacks, b.fallbacks);
  EXPECT_EQ(a.notes, b.notes);
}

// Records every hook call; optionally throws on chosen on_chunk_ready calls.
class RecordingHooks : public ChunkHooks {
 public:
  struct Event {
    bool ready;
    uintptr_t base;
    size_t bytes;
    bool threw = false;  // a ready call that refused the chunk
  };
  void on_chunk_ready(void* base, size_t bytes) override {
    std::lock_guard lock(mu_);
    const int n = ready_calls_++;
    const bool refuse = throw_on_call_ == n;
    events_.push_back({true, reinterpret_cast<uintptr_t>(base), bytes, refuse});
    if (refuse) throw CudaError("injected registration failure", 2);
  }
  void on_chunk_release(void* base, size_t bytes) noexcept override {
    std::lock_guard lock(mu_);
    events_.push_back({false, reinterpret_cast<uintptr_t>(base), bytes});
  }
  std::vector<Event> events() const {
    std::lock_guard lock(mu_);
    return events_;
  }
  void throw_on_call(int n) {
    std::lock_guard lock(mu_);
    throw_on_call_ = n;
  }
  // Ranges of the chunks that are ready and not released.
  std::vector<std::pair<uintptr_t, size_t>> live_chunks() const {
    std::lock_guard lock(mu_);
    std::vector<std::pair<uintptr_t, size_t>> out;
    for (const Event& e : events_) {
      if (e.threw) continue;
      if (e.ready)
        out.emplace_back(e.base, e.bytes);
      else
        out.erase(std::find(out.begin(), out.end(), std::make_pair(e.base, e.bytes)));
    }
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::vector<Event> events_;
  int ready_calls_ = 0;
  int throw_on_call_ = -1;
};

}  // namespace ferry::test_support
