// pool_bad_input_test.cpp — Pool refuses bad input and changes nothing:
// double, foreign, interior and null frees, absurd sizes and alignments; a
// double free of memory handed out again names both allocations;
// allocation_size knows only starts of live allocations.
#include "pool/pool.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <string>

#include "../support/pool_fixture.h"

namespace ferry {
namespace {

using namespace test_support;

TEST_F(PoolTest, BadInputIsRejectedAndChangesNothing) {
  Pool pool(small_chunks(4 * MiB));
  void* live = pool.allocate(4096, 256, HugeWant::no);
  void* freed = pool.allocate(8192, 256, HugeWant::no);
  pool.deallocate(freed);
  int on_stack = 0;
  void* from_malloc = std::malloc(64);

  struct Bad {
    const char* what;
    std::function<void()> call;
    const char* message;
  };
  const Bad cases[] = {
      {"double free", [&] { pool.deallocate(freed); }, "already freed (it was an allocation of 8192 bytes)"},
      {"stack pointer", [&] { pool.deallocate(&on_stack); }, "not allocated by this pool"},
      {"malloc pointer", [&] { pool.deallocate(from_malloc); }, "not allocated by this pool"},
      {"interior pointer", [&] { pool.deallocate(static_cast<char*>(live) + 100); },
       "points inside an allocation of 4096 bytes starting at 0x"},
      {"in a chunk, never allocated", [&] { pool.deallocate(static_cast<char*>(live) + 3 * MiB); },
       "not the start of a live allocation"},
      {"null", [&] { pool.deallocate(nullptr); }, "null pointer"},
      {"size 0", [&] { pool.allocate(0); }, "cannot allocate 0 bytes"},
      {"SIZE_MAX", [&] { pool.allocate(SIZE_MAX); }, "beyond the 128 TiB address space"},
      {"2^47 + 1", [&] { pool.allocate((size_t{1} << 47) + 1); }, "beyond the 128 TiB address space"},
      {"alignment 3", [&] { pool.allocate(64, 3); }, "alignment 3 is not a power of two"},
      {"alignment 0", [&] { pool.allocate(64, 0); }, "alignment 0 is not a power of two"},
      {"alignment 4 MiB", [&] { pool.allocate(64, 4 * MiB); }, "alignment 4194304 (4 MiB) is above the 2 MiB maximum"},
  };
  for (const Bad& c : cases) {
    const PoolStats before = pool.stats();
    try {
      c.call();
      ADD_FAILURE() << c.what << ": accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos) << c.what << ": " << e.what();
    }
    expect_same_stats(pool.stats(), before);
    EXPECT_EQ(pool.allocation_size(live), 4096u) << c.what;
  }
  std::free(from_malloc);
  pool.deallocate(live);
  EXPECT_CONSISTENT(pool);
}

TEST_F(PoolTest, ADoubleFreeOfMemoryHandedOutAgainNamesBoth) {
  Pool pool(small_chunks(4 * MiB));
  void* first = pool.allocate(4096, 256, HugeWant::no);
  void* second = pool.allocate(8192, 256, HugeWant::no);
  pool.deallocate(first);
  pool.deallocate(second);
  void* covering = pool.allocate(16384, 256, HugeWant::no);  // over both freed blocks
  ASSERT_EQ(covering, first);
  const PoolStats before = pool.stats();
  try {
    pool.deallocate(second);
    FAIL() << "double free accepted";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("already freed (it was an allocation of 8192 bytes); the memory now belongs to an "
                     "allocation of 16384 bytes starting at 0x"),
              std::string::npos)
        << m;
  }
  expect_same_stats(pool.stats(), before);
  EXPECT_EQ(pool.allocation_size(covering), 16384u);
  pool.deallocate(covering);
}

TEST_F(PoolTest, AllocationSizeIsForStartsOfLiveAllocationsOnly) {
  Pool pool(small_chunks(4 * MiB));
  void* p = pool.allocate(1000, 64);
  EXPECT_EQ(pool.allocation_size(p), 1024u);
  EXPECT_EQ(pool.allocation_size(static_cast<char*>(p) + 1), 0u);
  int x = 0;
  EXPECT_EQ(pool.allocation_size(&x), 0u);
  pool.deallocate(p);
  EXPECT_EQ(pool.allocation_size(p), 0u);
}

}  // namespace
}  // namespace ferry
