// pool_alloc_test.cpp — where Pool puts allocations, on real memory: exact
// sizes and alignments with patterns and no overlap, accounting invariants
// after every step, huge/small separation, recycling before a new chunk,
// coalescing, best fit, dedicated chunks for large requests, and the speed of
// a recycled allocate and free.
#include "pool/pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "../support/pool_fixture.h"

namespace ferry {
namespace {

using namespace test_support;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

PageKind kind_of(HugeWant want, size_t rounded) {
  if (want == HugeWant::yes) return PageKind::huge;
  if (want == HugeWant::no) return PageKind::small;
  return rounded >= 2 * MiB ? PageKind::huge : PageKind::small;
}

// ---- sizes, alignments, patterns ---------------------------------------------

TEST_F(PoolTest, ExactSizesAndAlignmentsKeepTheirPatternsAndNeverOverlap) {
  Pool pool(small_chunks(16 * MiB));
  const size_t sizes[] = {1,       3,         255,          256,         257,     4095,
                          4097,    65537,     MiB + 13,     2 * MiB - 1, 2 * MiB, 2 * MiB + 1,
                          7 * MiB + 5, 16 * MiB, 16 * MiB + 1, 64 * MiB + 3};
  const size_t alignments[] = {1, 2, 8, 64, 256, 4096, 64 * KiB, 2 * MiB};
  std::mt19937_64 rng(1);
  std::vector<Live> live;
  uint64_t expected_in_use = 0;
  for (size_t size : sizes) {
    for (size_t alignment : alignments) {
      const HugeWant want = static_cast<HugeWant>(rng() % 3);
      void* p = pool.allocate(size, alignment, want);
      ASSERT_NE(p, nullptr);
      const uintptr_t a = reinterpret_cast<uintptr_t>(p);
      EXPECT_EQ(a % alignment, 0u) << size << " at " << alignment;
      const size_t rounded = round_up(size, alignment);
      EXPECT_EQ(pool.allocation_size(p), rounded) << size << " at " << alignment;
      const uint64_t seed = rng();
      write_pattern(p, size, seed);
      live.push_back({a, rounded, size, seed, kind_of(want, rounded)});
      expected_in_use += rounded;
      const PoolStats s = pool.stats();
      ASSERT_EQ(accounting_violation(s), "") << describe(s);
      ASSERT_EQ(in_use(s), expected_in_use);
    }
  }
  expect_no_overlap(live);
  std::shuffle(live.begin(), live.end(), rng);
  for (const Live& l : live) {
    ASSERT_EQ(check_pattern(reinterpret_cast<void*>(l.begin), l.bytes, l.seed), SIZE_MAX)
        << "pattern of the allocation at " << std::hex << l.begin << " was overwritten";
    pool.deallocate(reinterpret_cast<void*>(l.begin));
    expected_in_use -= l.size;
    const PoolStats t = pool.stats();
    ASSERT_EQ(accounting_violation(t), "") << describe(t);
    ASSERT_EQ(in_use(t), expected_in_use);
  }
  const PoolStats end = pool.stats();
  EXPECT_EQ(in_use(end), 0u);
  EXPECT_EQ(end.allocations, live.size());
  EXPECT_EQ(end.frees, live.size());
}

TEST_F(PoolTest, HugeAndSmallNeverShareAChunk) {
  auto hooks = std::make_shared<RecordingHooks>();
  Pool pool(small_chunks(4 * MiB), hooks);
  std::mt19937_64 rng(2);
  std::vector<Live> live;
  uint64_t by_kind[2] = {};
  for (int i = 0; i < 300; ++i) {
    const size_t size = 1 + rng() % (3 * MiB);
    const HugeWant want = static_cast<HugeWant>(rng() % 3);
    void* p = pool.allocate(size, 256, want);
    const size_t rounded = round_up(size, 256);
    const PageKind kind = kind_of(want, rounded);
    live.push_back({reinterpret_cast<uintptr_t>(p), rounded, size, 0, kind});
    by_kind[static_cast<int>(kind)] += rounded;
    if (rng() % 3 == 0) {  // free a random one
      const size_t k = rng() % live.size();
      pool.deallocate(reinterpret_cast<void*>(live[k].begin));
      by_kind[static_cast<int>(live[k].kind)] -= live[k].size;
      live.erase(live.begin() + static_cast<long>(k));
    }
  }
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.kind[0].in_use.current, by_kind[0]);
  EXPECT_EQ(s.kind[1].in_use.current, by_kind[1]);
  for (const auto& [base, bytes] : hooks->live_chunks()) {
    std::set<PageKind> kinds;
    for (const Live& l : live)
      if (l.begin >= base && l.begin < base + bytes) {
        EXPECT_LE(l.begin + l.size, base + bytes) << "an allocation crosses its chunk's end";
        kinds.insert(l.kind);
      }
    EXPECT_LE(kinds.size(), 1u) << "huge and small allocations share the chunk at " << std::hex << base;
  }
  expect_no_overlap(live);
}

// ---- recycling and coalescing -------------------------------------------------

TEST_F(PoolTest, FreedMemoryIsRecycledBeforeANewChunk) {
  Pool pool(small_chunks(8 * MiB));
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(pool.allocate(MiB, 4096, HugeWant::no));
  const PoolStats full = pool.stats();
  EXPECT_EQ(full.chunk_reservations, 1u);
  EXPECT_EQ(full.recycles, 0u);
  for (int round = 0; round < 20; ++round) {
    const size_t k = static_cast<size_t>(round) % blocks.size();
    void* old = blocks[k];
    pool.deallocate(old);
    blocks[k] = pool.allocate(MiB, 4096, HugeWant::no);
    EXPECT_EQ(blocks[k], old) << "the only free range is the one just freed";
    EXPECT_CONSISTENT(pool);
  }
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.chunk_reservations, 1u) << "a new chunk was reserved although freed memory fit";
  EXPECT_EQ(s.recycles, 20u);
  for (void* b : blocks) pool.deallocate(b);
}

TEST_F(PoolTest, NeighboursCoalesce) {
  Pool pool(small_chunks(4 * MiB));
  void* q[4];
  for (auto& p : q) p = pool.allocate(MiB, 4096, HugeWant::no);
  for (int i = 1; i < 4; ++i)
    EXPECT_EQ(static_cast<char*>(q[i]), static_cast<char*>(q[0]) + i * MiB) << "carved in address order";
  pool.deallocate(q[1]);
  pool.deallocate(q[2]);
  void* both = pool.allocate(2 * MiB, 4096, HugeWant::no);
  EXPECT_EQ(both, q[1]) << "two freed neighbours did not coalesce";
  pool.deallocate(both);
  pool.deallocate(q[0]);
  pool.deallocate(q[3]);
  void* all = pool.allocate(4 * MiB, 4096, HugeWant::no);
  EXPECT_EQ(all, q[0]);
  EXPECT_EQ(pool.stats().chunk_reservations, 1u);
  pool.deallocate(all);
  EXPECT_CONSISTENT(pool);
}

TEST_F(PoolTest, BestFitPrefersTheSmallestHole) {
  Pool pool(small_chunks(8 * MiB));
  void* a = pool.allocate(MiB, 4096, HugeWant::no);      // [0, 1)
  void* hole3 = pool.allocate(3 * MiB, 4096, HugeWant::no);  // [1, 4)
  void* b = pool.allocate(MiB, 4096, HugeWant::no);      // [4, 5)
  void* hole2 = pool.allocate(2 * MiB, 4096, HugeWant::no);  // [5, 7)
  void* c = pool.allocate(MiB, 4096, HugeWant::no);      // [7, 8)
  pool.deallocate(hole3);
  pool.deallocate(hole2);
  EXPECT_EQ(pool.allocate(2 * MiB, 4096, HugeWant::no), hole2);
  EXPECT_EQ(pool.allocate(3 * MiB, 4096, HugeWant::no), hole3);
  EXPECT_EQ(pool.stats().chunk_reservations, 1u);
  for (void* p : {a, b, c, hole2, hole3}) pool.deallocate(p);
}

// ---- large requests --------------------------------------------------------------

TEST_F(PoolTest, ALargerRequestGetsADedicatedChunkThatIsThenRecycled) {
  Pool pool(small_chunks(8 * MiB));
  const size_t request = 8 * MiB * 21 / 10;  // 2.1 chunks
  void* p = pool.allocate(request, 4096, HugeWant::yes);
  write_pattern(p, request, 3);
  PoolStats s = pool.stats();
  EXPECT_EQ(s.chunk_reservations, 1u);
  EXPECT_EQ(reserved(s), round_up(request, 2 * MiB)) << "a 2.1-chunk request reserved more than it needs";
  EXPECT_LE(reserved(s), request + 8 * MiB);
  EXPECT_EQ(check_pattern(p, request, 3), SIZE_MAX);
  pool.deallocate(p);
  void* again = pool.allocate(request - 4096, 4096, HugeWant::yes);
  EXPECT_EQ(again, p);
  s = pool.stats();
  EXPECT_EQ(s.chunk_reservations, 1u);
  EXPECT_EQ(s.recycles, 1u);
  pool.deallocate(again);
  EXPECT_CONSISTENT(pool);
}

TEST_F(PoolTest, A2Point1GiBRequestReservesAtMostItsSizePlusOneChunk) {
  PoolOptions o;  // default 64 MiB chunks
  Pool pool(o);
  const size_t request = GiB * 21 / 10;
  void* p = pool.allocate(request);
  write_pattern(p, request, 4);
  const PoolStats s = pool.stats();
  EXPECT_LE(reserved(s), request + o.chunk_bytes);
  EXPECT_EQ(s.kind[1].in_use.current, round_up(request, 256));
  EXPECT_EQ(check_pattern(p, request, 4), SIZE_MAX);
  pool.deallocate(p);
  EXPECT_GE(pool.trim(0), request);
  EXPECT_EQ(reserved(pool.stats()), 0u);
}

// ---- speed -------------------------------------------------------------------------

TEST_F(PoolTest, RecycledAllocateAndFreeOf1MiBTakesMicroseconds) {
  Pool pool(small_chunks(64 * MiB));
  std::vector<void*> background;  // a few live allocations so the maps are not trivial
  for (int i = 0; i < 64; ++i) background.push_back(pool.allocate(4096 * (1 + i % 7), 256, HugeWant::no));
  pool.deallocate(pool.allocate(MiB, 256, HugeWant::no));
  std::vector<double> ns;
  for (int i = 0; i < 20000; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    void* p = pool.allocate(MiB, 256, HugeWant::no);
    pool.deallocate(p);
    ns.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(ns.begin(), ns.begin() + ns.size() / 2, ns.end());
  const double median_us = ns[ns.size() / 2] / 1000.0;
  RecordProperty("median_us", std::to_string(median_us));
  EXPECT_LE(median_us, kSanitized ? 50.0 : 2.0) << "median allocate+free of a recycled 1 MiB block";
  EXPECT_EQ(pool.stats().chunk_reservations, 1u);
  for (void* p : background) pool.deallocate(p);
}

}  // namespace
}  // namespace ferry
