// pool_memfd_test.cpp — a memfd pool: every allocation's pages can be
// mapped a second time from the pool's descriptor, and hold the same bytes.
#include "pool/pool.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <random>
#include <vector>

#include "../support/pool_fixture.h"

namespace ferry {
namespace {

using namespace test_support;

TEST_F(PoolTest, MemfdPoolMemoryIsSharedThroughItsDescriptor) {
  PoolOptions o = small_chunks(4 * MiB);
  o.memfd = true;
  o.zero_recycled = true;
  Pool pool(o);
  std::vector<Live> live;
  std::mt19937_64 rng(6);
  for (int i = 0; i < 40; ++i) {
    const size_t size = 1 + rng() % (3 * MiB);
    void* p = pool.allocate(size, 4096, static_cast<HugeWant>(rng() % 3));
    const uint64_t seed = rng();
    write_pattern(p, size, seed);
    live.push_back({reinterpret_cast<uintptr_t>(p), round_up(size, 4096), size, seed, PageKind::small});
  }
  expect_no_overlap(live);
  // Map one allocation's pages a second time from the descriptor: same bytes.
  const Live& l = live[7];
  const Pool::SharedLocation where = pool.shared_location(reinterpret_cast<void*>(l.begin));
  ASSERT_GE(where.fd, 0);
  EXPECT_EQ(where.offset % 4096, 0u);
  void* view = mmap(nullptr, round_up(l.size, 4096), PROT_READ | PROT_WRITE, MAP_SHARED, where.fd,
                    static_cast<off_t>(where.offset));
  ASSERT_NE(view, MAP_FAILED);
  EXPECT_EQ(check_pattern(view, l.bytes, l.seed), SIZE_MAX);
  static_cast<char*>(view)[0] = static_cast<char>(~pattern_byte(l.seed, 0));
  EXPECT_EQ(reinterpret_cast<char*>(l.begin)[0], static_cast<char>(~pattern_byte(l.seed, 0)));
  static_cast<char*>(view)[0] = static_cast<char>(pattern_byte(l.seed, 0));
  munmap(view, round_up(l.size, 4096));
  for (const Live& x : live) {
    EXPECT_EQ(check_pattern(reinterpret_cast<void*>(x.begin), x.bytes, x.seed), SIZE_MAX);
    pool.deallocate(reinterpret_cast<void*>(x.begin));
  }
  int on_stack = 0;
  EXPECT_EQ(pool.shared_location(&on_stack).fd, -1);
  EXPECT_GT(pool.trim(0), 0u);
  EXPECT_CONSISTENT(pool);
}

}  // namespace
}  // namespace ferry
