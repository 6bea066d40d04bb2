// pool_trim_test.cpp — Pool::trim: idle chunks are unmapped, free parts of
// used chunks go back to the OS (and come back zero), live memory is never
// touched, and what it is asked to keep stays cached.
#include "pool/pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "../support/pool_fixture.h"

namespace ferry {
namespace {

using namespace test_support;

TEST_F(PoolTest, TrimReleasesIdleChunksAndFreePartsOfUsedOnes) {
  Pool pool(small_chunks(8 * MiB));
  void* kept = pool.allocate(3 * MiB, 4096, HugeWant::yes);  // huge chunk [0, 3) used
  void* gone = pool.allocate(4 * MiB, 2 * MiB, HugeWant::yes);  // [4, 8)
  write_pattern(kept, 3 * MiB, 5);
  std::memset(gone, 0xEE, 4 * MiB);
  pool.deallocate(gone);
  void* small = pool.allocate(MiB, 4096, HugeWant::no);  // a small chunk, then idle
  pool.deallocate(small);
  PoolStats before = pool.stats();
  EXPECT_EQ(cached(before), 5 * MiB + 8 * MiB) << describe(before);

  // The huge chunk has huge pages unless this kernel refused them (then
  // 4 KiB pages and a 4 KiB release granule).
  const bool huge_pages = before.chunks_by_backing[static_cast<int>(Backing::small_pages)] == 1;
  const size_t part = huge_pages ? 4 * MiB : 5 * MiB;

  const size_t n = pool.trim(0);
  PoolStats after = pool.stats();
  EXPECT_EQ(accounting_violation(after), "") << describe(after);
  // The idle small chunk is unmapped; in the huge chunk the 2 MiB-aligned
  // free part [4, 8) MiB goes back, [3, 4) stays cached.
  EXPECT_EQ(n, 8 * MiB + part);
  EXPECT_EQ(after.chunk_releases, 1u);
  EXPECT_EQ(after.kind[0].reserved.current, 0u);
  EXPECT_EQ(after.kind[1].released.current, part);
  EXPECT_EQ(after.kind[1].cached.current, 5 * MiB - part);
  EXPECT_EQ(check_pattern(kept, 3 * MiB, 5), SIZE_MAX) << "trim touched live memory";

  // Released memory comes back zero and committed.
  void* back = pool.allocate(4 * MiB, 2 * MiB, HugeWant::yes);
  EXPECT_EQ(back, gone);
  EXPECT_TRUE(all_zero(back, 4 * MiB));
  PoolStats reused = pool.stats();
  EXPECT_EQ(reused.kind[1].released.current, 0u);
  EXPECT_EQ(reused.kind[1].committed.current, 8 * MiB);
  EXPECT_EQ(reused.recycles, 0u) << "released memory is not dirty, so not a recycle";
  EXPECT_CONSISTENT(pool);
  pool.deallocate(back);
  pool.deallocate(kept);
  EXPECT_EQ(pool.trim(100 * MiB), 0u) << "keep_bytes above what is cached releases nothing";
  EXPECT_EQ(pool.trim(0), 8 * MiB);
  const PoolStats empty = pool.stats();
  EXPECT_EQ(reserved(empty), 0u);
  EXPECT_EQ(released(empty), 0u);
  EXPECT_CONSISTENT(pool);
}

TEST_F(PoolTest, TrimKeepsWhatItIsAskedToKeep) {
  Pool pool(small_chunks(4 * MiB));
  std::vector<void*> v;
  for (int i = 0; i < 4; ++i) v.push_back(pool.allocate(4 * MiB, 4096, HugeWant::no));
  for (void* p : v) pool.deallocate(p);
  EXPECT_EQ(pool.trim(8 * MiB), 8 * MiB);
  EXPECT_EQ(cached(pool.stats()), 8 * MiB);
  EXPECT_EQ(pool.stats().chunk_releases, 2u);
}

}  // namespace
}  // namespace ferry
