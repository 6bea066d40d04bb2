// range_cache_test.cpp — the address range cache behind PointerLookup: hits at
// both ends, misses just outside, refused overlaps, and many ranges added out
// of order. No memory behind the addresses.
#include <gtest/gtest.h>

#include <random>

#include "core/range_cache.h"

namespace ferry {
namespace {

TEST(RangeCache, FindsAnAddressOnlyInsideItsRange) {
  RangeCache<int> c;
  EXPECT_EQ(c.find(0x1000), nullptr);
  ASSERT_TRUE(c.add(0x1000, 0x100, 1));
  ASSERT_TRUE(c.add(0x3000, 0x10, 3));
  ASSERT_TRUE(c.add(0x2000, 0x1000, 2));  // touches 0x3000, does not overlap it
  struct Case { uintptr_t a; int value; };  // value 0: no range
  for (auto k : {Case{0xfff, 0}, Case{0x1000, 1}, Case{0x10ff, 1}, Case{0x1100, 0}, Case{0x1fff, 0},
                 Case{0x2000, 2}, Case{0x2fff, 2}, Case{0x3000, 3}, Case{0x300f, 3}, Case{0x3010, 0},
                 Case{0, 0}, Case{UINTPTR_MAX, 0}}) {
    auto* r = c.find(k.a);
    EXPECT_EQ(r ? r->value : 0, k.value) << std::hex << k.a;
  }
}

TEST(RangeCache, RefusesEmptyWrappingAndOverlappingRanges) {
  RangeCache<int> c;
  ASSERT_TRUE(c.add(0x1000, 0x1000, 1));
  EXPECT_FALSE(c.add(0x5000, 0, 2));
  EXPECT_FALSE(c.add(UINTPTR_MAX - 4, 16, 2));
  EXPECT_FALSE(c.add(0x1800, 0x10, 2));   // inside
  EXPECT_FALSE(c.add(0x800, 0x801, 2));   // over the start
  EXPECT_FALSE(c.add(0x1fff, 0x10, 2));   // over the end
  EXPECT_FALSE(c.add(0x800, 0x2000, 2));  // around it
  EXPECT_TRUE(c.add(0x800, 0x800, 2));    // just before
  EXPECT_TRUE(c.add(0x2000, 0x10, 3));    // just after
  EXPECT_EQ(c.size(), 3u);
  EXPECT_EQ(c.find(0x1000)->value, 1);
  EXPECT_EQ(c.find(0xfff)->value, 2);
}

TEST(RangeCache, ManyRangesAddedInRandomOrder) {
  std::vector<uintptr_t> starts;
  for (uintptr_t i = 0; i < 500; ++i) starts.push_back(0x10000 + i * 0x300);  // 0x200 used, 0x100 gap
  std::shuffle(starts.begin(), starts.end(), std::mt19937_64(7));
  RangeCache<uintptr_t> c;
  for (uintptr_t s : starts) ASSERT_TRUE(c.add(s, 0x200, s));
  std::mt19937_64 rng(8);
  for (int i = 0; i < 20000; ++i) {
    const uintptr_t a = 0x10000 - 0x100 + rng() % (500 * 0x300 + 0x200);
    const uintptr_t off = (a - 0x10000) % 0x300;
    auto* r = c.find(a);
    if (a < 0x10000 || off >= 0x200 || a >= 0x10000 + 500 * 0x300) {
      ASSERT_EQ(r, nullptr) << std::hex << a;
    } else {
      ASSERT_NE(r, nullptr) << std::hex << a;
      ASSERT_EQ(r->value, a - off);
    }
  }
}

}  // namespace
}  // namespace ferry
