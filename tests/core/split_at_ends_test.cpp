// split_at_ends_test.cpp — a copy cut at the ends of ranges on both sides:
// random ranges and copies, every piece inside one range per side, the pieces
// consecutive and covering the copy exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "copy/split_at_ends.h"

namespace ferry {
namespace {

// Ranges [ends[k-1], ends[k]) over an address space starting at `base`.
struct Ranges {
  uintptr_t base;
  std::vector<uintptr_t> ends;
  size_t left(const void* p) const {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    for (uintptr_t e : ends)
      if (a < e) return e - a;
    return SIZE_MAX;  // past the last range: no end to respect
  }
  size_t index(uintptr_t a) const {
    return static_cast<size_t>(std::upper_bound(ends.begin(), ends.end(), a) - ends.begin());
  }
};

Ranges random_ranges(std::mt19937_64& r, uintptr_t base) {
  Ranges rs{base, {}};
  uintptr_t at = base;
  for (int k = 0; k < 12; ++k) rs.ends.push_back(at += 1 + r() % 5000);
  return rs;
}

TEST(SplitAtEnds, PiecesStayInsideOneRangePerSideAndCoverTheCopy) {
  std::mt19937_64 r(17);
  for (int trial = 0; trial < 2000; ++trial) {
    const Ranges s = random_ranges(r, 0x10000), d = random_ranges(r, 0x900000);
    const size_t bytes = 1 + r() % 40000;
    void* dst = reinterpret_cast<void*>(d.base + r() % 3000);
    const void* src = reinterpret_cast<const void*>(s.base + r() % 3000);
    auto left = [&](const void* p) {
      const uintptr_t a = reinterpret_cast<uintptr_t>(p);
      return a >= d.base && a < 0x900000 + 0x100000 ? d.left(p) : s.left(p);
    };
    uintptr_t want_d = reinterpret_cast<uintptr_t>(dst), want_s = reinterpret_cast<uintptr_t>(src);
    size_t total = 0;
    split_at_ends(dst, src, bytes, left, [&](void* pd, const void* ps, size_t n) {
      const uintptr_t a = reinterpret_cast<uintptr_t>(pd), b = reinterpret_cast<uintptr_t>(ps);
      ASSERT_GT(n, 0u);
      ASSERT_EQ(a, want_d);  // consecutive
      ASSERT_EQ(b, want_s);
      ASSERT_EQ(d.index(a), d.index(a + n - 1)) << "a piece crosses a destination range end";
      ASSERT_EQ(s.index(b), s.index(b + n - 1)) << "a piece crosses a source range end";
      want_d += n, want_s += n, total += n;
    });
    ASSERT_EQ(total, bytes);
  }
}

TEST(SplitAtEnds, NoEndsGiveOnePiece) {
  int calls = 0;
  char a[100], b[100];
  split_at_ends(a, b, 100, [](const void*) { return SIZE_MAX; }, [&](void*, const void*, size_t n) {
    ++calls;
    EXPECT_EQ(n, 100u);
  });
  EXPECT_EQ(calls, 1);
  split_at_ends(a, b, 0, [](const void*) { return SIZE_MAX; }, [&](void*, const void*, size_t) { ++calls; });
  EXPECT_EQ(calls, 1);  // nothing to copy: no piece
}

}  // namespace
}  // namespace ferry
