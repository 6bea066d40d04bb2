// pool_fault_test.cpp — Pool under fault injection: a failed mmap, touch or
// memfd_create fails the allocation cleanly and the pool recovers; a refused
// madvise is a fallback note, not an error.
#include "pool/pool.h"

#include <gtest/gtest.h>

#include <string>

#include "../support/pool_fixture.h"

namespace ferry {
namespace {

using namespace test_support;

TEST_F(PoolTest, FailedMmapFailsTheAllocationAndThePoolRecovers) {
  Pool pool(small_chunks(4 * MiB));
  set_fault_injection("mmap:0");
  const PoolStats before = pool.stats();
  try {
    pool.allocate(MiB);
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), FERRY_ERROR_OUT_OF_MEMORY);
    EXPECT_NE(std::string(e.what()).find("mmap of a 4 MiB pool chunk failed"), std::string::npos) << e.what();
  }
  expect_same_stats(pool.stats(), before);
  set_fault_injection("");
  void* p = pool.allocate(MiB);
  pool.deallocate(p);
  EXPECT_CONSISTENT(pool);
}

TEST_F(PoolTest, FailedMadviseIsAFallbackNote) {
  // Documented choice: a refused madvise is a fallback (noted, remembered),
  // not an error; the allocation succeeds.
  Pool pool(small_chunks(4 * MiB));
  set_fault_injection("madvise:0+");
  void* s = pool.allocate(MiB, 256, HugeWant::no);
  void* h = pool.allocate(3 * MiB, 256, HugeWant::yes);
  const PoolStats st = pool.stats();
  std::string notes;
  for (const auto& n : st.notes) notes += n + "\n";
  EXPECT_NE(notes.find("madvise(MADV_NOHUGEPAGE) refused (Invalid argument)"), std::string::npos) << notes;
  EXPECT_GE(st.fallbacks, 1u);
  pool.deallocate(s);
  pool.deallocate(h);
  // A failing MADV_DONTNEED in trim leaves the memory cached and consistent.
  void* keep = pool.allocate(MiB, 256, HugeWant::no);
  const uint64_t cached_before = cached(pool.stats());
  pool.trim(0);  // idle huge chunk is unmapped (no madvise); the small chunk's parts fail
  EXPECT_EQ(pool.stats().kind[0].cached.current, 3 * MiB);
  EXPECT_LT(cached(pool.stats()), cached_before);
  EXPECT_CONSISTENT(pool);
  set_fault_injection("");
  EXPECT_EQ(pool.trim(0), 3 * MiB);
  pool.deallocate(keep);
  EXPECT_CONSISTENT(pool);
}

TEST_F(PoolTest, FailedTouchFailsCleanly) {
  Pool pool(small_chunks(4 * MiB));
  set_fault_injection("touch:0");
  try {
    pool.allocate(MiB);
    FAIL() << "no exception";
  } catch (const OsError& e) {
    EXPECT_NE(std::string(e.what()).find("first touch of a 4 MiB pool chunk"), std::string::npos) << e.what();
  }
  EXPECT_EQ(reserved(pool.stats()), 0u);
  set_fault_injection("");
  pool.deallocate(pool.allocate(MiB));
  EXPECT_CONSISTENT(pool);
}

TEST_F(PoolTest, FailedMemfdFailsCleanly) {
  PoolOptions o = small_chunks(4 * MiB);
  o.memfd = true;
  Pool pool(o);
  set_fault_injection("memfd:0");
  try {
    pool.allocate(MiB);
    FAIL() << "no exception";
  } catch (const OsError& e) {
    EXPECT_NE(std::string(e.what()).find("memfd_create"), std::string::npos) << e.what();
  }
  EXPECT_EQ(reserved(pool.stats()), 0u);
  set_fault_injection("");
  pool.deallocate(pool.allocate(MiB));
}

}  // namespace
}  // namespace ferry
