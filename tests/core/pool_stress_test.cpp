// pool_stress_test.cpp — many threads allocating and freeing random sizes
// (log-uniform 1 B .. 64 MiB) at random alignments and kinds, each allocation
// carrying its own pattern that is verified before it is freed, while another
// thread trims and checks the accounting. Deterministic seeds; size from
// FERRYTEST_STRESS_THREADS (threads), FERRYTEST_STRESS_SCALE (live allocations per
// thread) and FERRYTEST_STRESS_ITER (operations per thread), mimalloc style.
// Two configurations: anonymous memory, and memfd memory with zero_recycled
// (where every new allocation must read zero before its pattern is written).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "pool/pool.h"
#include "pool/stats.h"

namespace ferry {
namespace {

constexpr size_t MiB = size_t{1} << 20;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

uint8_t pattern_byte(uint64_t seed, size_t i) {
  uint64_t x = seed ^ (i * 0x9E3779B97F4A7C15ull);
  x ^= x >> 31;
  x *= 0xD6E8FEB86659FD93ull;
  return static_cast<uint8_t>(x >> 40);
}

// First and last 256 bytes, and one byte in every 4 KiB.
template <class F>
void for_each_checked_offset(size_t n, F f) {
  if (n <= 1024) {
    for (size_t i = 0; i < n; ++i) f(i);
    return;
  }
  for (size_t i = 0; i < 256; ++i) f(i);
  for (size_t i = 256; i < n - 256; i += 4096) f(i);
  for (size_t i = n - 256; i < n; ++i) f(i);
}

struct Block {
  uint8_t* p;
  size_t bytes, rounded;
  uint64_t seed;
};

struct Config {
  const char* name;
  bool memfd;
  bool zero_recycled;
};

class PoolStress : public ::testing::TestWithParam<Config> {};

TEST_P(PoolStress, ManyThreadsRandomSizesPatternsAndExactAccounting) {
  const int threads = env_int("FERRYTEST_STRESS_THREADS", 4);
  const int scale = env_int("FERRYTEST_STRESS_SCALE", 8);
  // Sanitizers shadow every mapped byte: fewer operations keep them at a few seconds.
  const int iterations = env_int("FERRYTEST_STRESS_ITER", kSanitized ? 250 : 1000);
  PoolOptions o;
  o.chunk_bytes = 16 * MiB;
  o.touch_threads = 2;
  o.memfd = GetParam().memfd;
  o.zero_recycled = GetParam().zero_recycled;
  Pool pool(o);

  std::atomic<bool> done{false};
  std::atomic<uint64_t> allocations{0};
  std::mutex failure_mu;
  std::string failure;  // first failure seen by a worker
  auto fail = [&](const std::string& what) {
    std::lock_guard lock(failure_mu);
    if (failure.empty()) failure = what;
  };

  auto worker = [&](int t) {
    std::mt19937_64 rng(0xFE44 + static_cast<uint64_t>(t));
    std::uniform_real_distribution<double> log_size(0.0, std::log(64.0 * MiB));
    std::vector<Block> live;
    auto free_one = [&](size_t k) {
      const Block b = live[k];
      size_t bad = SIZE_MAX;
      for_each_checked_offset(b.bytes, [&](size_t i) {
        if (bad == SIZE_MAX && b.p[i] != pattern_byte(b.seed, i)) bad = i;
      });
      if (bad != SIZE_MAX) fail("pattern broken at offset " + std::to_string(bad) + " of a " + std::to_string(b.bytes) + "-byte block");
      if (pool.allocation_size(b.p) != b.rounded) fail("allocation_size changed");
      pool.deallocate(b.p);
      live[k] = live.back();
      live.pop_back();
    };
    for (int i = 0; i < iterations; ++i) {
      if (static_cast<int>(live.size()) < scale && (live.empty() || rng() % 2 == 0)) {
        const size_t bytes = std::max<size_t>(1, static_cast<size_t>(std::exp(log_size(rng))));
        const size_t alignment = size_t{1} << (rng() % 22);  // 1 B .. 2 MiB
        const HugeWant want = static_cast<HugeWant>(rng() % 3);
        auto* p = static_cast<uint8_t*>(pool.allocate(bytes, alignment, want));
        if (reinterpret_cast<uintptr_t>(p) % alignment != 0) fail("misaligned allocation");
        const uint64_t seed = rng();
        if (o.zero_recycled) {
          bool zero = true;
          for_each_checked_offset(bytes, [&](size_t k) { zero = zero && p[k] == 0; });
          if (!zero) fail("zero_recycled is on, yet a new allocation is not zero");
        }
        for_each_checked_offset(bytes, [&](size_t k) { p[k] = pattern_byte(seed, k); });
        live.push_back({p, bytes, (bytes + alignment - 1) / alignment * alignment, seed});
        ++allocations;
      } else {
        free_one(rng() % live.size());
      }
    }
    while (!live.empty()) free_one(live.size() - 1);
  };

  // Trims (releasing free parts of chunks that other threads are using) and
  // checks the invariants of every snapshot.
  std::thread trimmer([&] {
    std::mt19937_64 rng(7);
    while (!done) {
      pool.trim(rng() % (64 * MiB));
      const PoolStats s = pool.stats();
      if (std::string v = accounting_violation(s); !v.empty()) fail("mid-run accounting: " + v);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) workers.emplace_back(worker, t);
  for (auto& w : workers) w.join();
  done = true;
  trimmer.join();

  EXPECT_EQ(failure, "");
  const PoolStats s = pool.stats();
  EXPECT_EQ(accounting_violation(s), "") << describe(s);
  for (int k = 0; k < 2; ++k) {
    const KindStats& c = s.kind[k];
    EXPECT_EQ(c.in_use.current, 0u) << "kind " << k;
    EXPECT_EQ(c.committed.current, c.cached.current) << "kind " << k;
    EXPECT_EQ(c.reserved.current, c.committed.current + c.released.current) << "kind " << k;
  }
  EXPECT_EQ(s.allocations, allocations.load());
  EXPECT_EQ(s.frees, allocations.load());
  pool.trim(0);
  const PoolStats end = pool.stats();
  EXPECT_EQ(end.kind[0].reserved.current + end.kind[1].reserved.current, 0u) << describe(end);
  EXPECT_EQ(end.chunk_reservations, end.chunk_releases);
}

INSTANTIATE_TEST_SUITE_P(Configs, PoolStress,
                         ::testing::Values(Config{"anonymous", false, false}, Config{"memfd_zeroed", true, true}),
                         [](const ::testing::TestParamInfo<Config>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace ferry
