// pool_zero_test.cpp — Pool's zeroing of recycled memory (always with
// zero_recycled, per allocation with zero=true, in parallel for a big range)
// and allocate_cached, which serves only what is cached: never a new chunk,
// never a wait for the target.
#include "pool/pool.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <thread>

#include "../support/pool_fixture.h"

namespace ferry {
namespace {

using namespace test_support;

// ---- zeroing -------------------------------------------------------------------

TEST_F(PoolTest, ZeroRecycledZeroesDirtyMemoryOnlyWhenAsked) {
  for (bool zero : {true, false}) {
    PoolOptions o = small_chunks(4 * MiB);
    o.zero_recycled = zero;
    Pool pool(o);
    void* p = pool.allocate(MiB + 100, 64, HugeWant::no);
    EXPECT_TRUE(all_zero(p, MiB + 100)) << "fresh memory is not zero";
    std::memset(p, 0xAB, MiB + 100);
    pool.deallocate(p);
    std::memset(p, 0xCD, MiB + 100);  // poison the freed block
    void* q = pool.allocate(MiB + 100, 64, HugeWant::no);
    ASSERT_EQ(q, p);
    EXPECT_EQ(pool.stats().recycles, 1u);
    if (zero)
      EXPECT_TRUE(all_zero(q, MiB + 100)) << "zero_recycled is on but recycled memory is dirty";
    else
      EXPECT_EQ(static_cast<uint8_t*>(q)[MiB], 0xCD) << "zero_recycled is off but the memory was zeroed";
    pool.deallocate(q);
  }
}

TEST_F(PoolTest, ZeroOnRequestClearsOnlyThatAllocationsRecycledBytes) {
  Pool pool(small_chunks(8 * MiB));  // zero_recycled off: the default
  std::mt19937_64 rng(21);
  const size_t n = 3 * MiB + 77;
  void* p = pool.allocate(n, 64, HugeWant::yes);
  ASSERT_TRUE(all_zero(p, n)) << "fresh memory is not zero";
  auto* b = static_cast<uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(rng() | 1);  // random, never zero
  pool.deallocate(p);
  void* q = pool.allocate(n, 64, HugeWant::yes, /*zero=*/true);
  ASSERT_EQ(q, p);
  EXPECT_TRUE(all_zero(q, n)) << "zero=true handed out another allocation's bytes";
  PoolStats s = pool.stats();
  EXPECT_EQ(s.zeroed_bytes, round_up(n, 64)) << "only the recycled bytes are cleared";
  std::memset(q, 0x5A, n);
  pool.deallocate(q);
  void* r = pool.allocate(n, 64, HugeWant::yes);  // no zero asked: the old bytes stay
  ASSERT_EQ(r, p);
  EXPECT_EQ(static_cast<uint8_t*>(r)[n / 2], 0x5A);
  EXPECT_EQ(pool.stats().zeroed_bytes, s.zeroed_bytes);
  // Part recycled, part fresh: only the recycled part counts.
  void* fresh_too = pool.allocate(5 * MiB, 64, HugeWant::yes, true);
  EXPECT_TRUE(all_zero(fresh_too, 5 * MiB));
  pool.deallocate(r);
  pool.deallocate(fresh_too);
  EXPECT_CONSISTENT(pool);
}

TEST_F(PoolTest, ZeroRecycledClearsABigRangeInParallel) {
  PoolOptions o = small_chunks(8 * MiB);
  o.zero_recycled = true;
  o.touch_threads = 3;
  Pool pool(o);
  const size_t n = 80 * MiB + 4096;  // above the parallel threshold, odd shares
  auto* p = static_cast<uint8_t*>(pool.allocate(n, 4096));
  std::mt19937_64 rng(22);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t v = rng() | 0x0101010101010101ull;
    std::memcpy(p + i, &v, 8);
  }
  pool.deallocate(p);
  auto* q = static_cast<uint8_t*>(pool.allocate(n, 4096));
  ASSERT_EQ(q, p);
  EXPECT_TRUE(all_zero(q, n)) << "a recycled byte survived";
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.zeroed_bytes, n);
  EXPECT_GT(s.zero_ns, 0u);
  pool.deallocate(q);
}

// ---- allocate_cached -----------------------------------------------------------

TEST_F(PoolTest, AllocateCachedNeverReservesNorWaits) {
  Pool pool(small_chunks(8 * MiB));
  EXPECT_EQ(pool.allocate_cached(MiB), nullptr) << "an empty pool has nothing cached";
  EXPECT_EQ(pool.stats().chunk_reservations, 0u);
  void* p = pool.allocate(MiB, 256, HugeWant::no);
  std::memset(p, 0x77, MiB);
  pool.deallocate(p);
  void* q = pool.allocate_cached(MiB, 256, HugeWant::no, /*zero=*/true);
  ASSERT_EQ(q, p);
  EXPECT_TRUE(all_zero(q, MiB));
  void* r = pool.allocate_cached(2 * MiB, 4096, HugeWant::no);  // the rest of the chunk
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(pool.allocate_cached(7 * MiB, 256, HugeWant::no), nullptr) << "does not fit what is cached";
  EXPECT_THROW(pool.allocate_cached(0), InvalidArgument);
  EXPECT_EQ(pool.stats().chunk_reservations, 1u);
  pool.deallocate(q);
  pool.deallocate(r);
  EXPECT_CONSISTENT(pool);
}

TEST_F(PoolTest, AllocateCachedDoesNotWaitForTheTarget) {
  class Slow : public ChunkHooks {
   public:
    void on_chunk_ready(void*, size_t) override { std::this_thread::sleep_for(std::chrono::milliseconds(300)); }
    void on_chunk_release(void*, size_t) noexcept override {}
  };
  PoolOptions o = small_chunks(4 * MiB);
  o.target_bytes = 8 * MiB;
  Pool pool(o, std::make_shared<Slow>());
  // Had it waited for the target (300 ms of registration), the target would have served it.
  EXPECT_EQ(pool.allocate_cached(MiB), nullptr);
  pool.wait_ready();
  void* p = pool.allocate_cached(8 * MiB);
  EXPECT_NE(p, nullptr) << "the target is in: it serves from it";
  pool.deallocate(p);
}

}  // namespace
}  // namespace ferry
