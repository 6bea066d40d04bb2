// pool_range_set_test.cpp — RangeSet bookkeeping with no memory behind it:
// table-driven cases (insert, coalesce, split, best fit, alignment, states,
// chunk boundaries, releasable stretches) and a randomized comparison with a
// byte-map model.
#include "pool/range_set.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <ostream>
#include <random>

namespace ferry {

std::ostream& operator<<(std::ostream& os, const Run& r) {
  return os << "{run " << std::hex << r.begin << "+" << r.size << " chunk " << r.chunk << std::dec << "}";
}
std::ostream& operator<<(std::ostream& os, const Span& s) {
  return os << "{span " << std::hex << s.begin << "+" << s.size << std::dec << " " << span_state_name(s.state) << "}";
}

namespace {

constexpr SpanState Z = SpanState::zero, D = SpanState::dirty, R = SpanState::released;

struct Op {
  enum Kind { insert, best_fit, exact } kind;
  uintptr_t chunk;  // insert
  uintptr_t begin;  // insert, exact; for best_fit the expected begin (0 = no fit)
  size_t size;
  size_t alignment = 1;
  size_t want_zero = 0, want_dirty = 0, want_released = 0;  // bytes the take should report
};

Op Ins(uintptr_t chunk, uintptr_t begin, size_t size, SpanState s) {
  Op o{Op::insert, chunk, begin, size};
  o.alignment = static_cast<size_t>(s);  // carries the state
  return o;
}
Op Fit(size_t size, size_t alignment, uintptr_t want_begin, size_t z = 0, size_t d = 0, size_t r = 0) {
  return Op{Op::best_fit, 0, want_begin, size, alignment, z, d, r};
}
Op Take(uintptr_t begin, size_t size, size_t z = 0, size_t d = 0, size_t r = 0) {
  return Op{Op::exact, 0, begin, size, 1, z, d, r};
}

struct Case {
  const char* name;
  std::vector<Op> ops;
  std::vector<Run> runs;
  std::vector<Span> spans;
};

const Case kCases[] = {
    {"one insert is one run and one span",
     {Ins(0x1000, 0x1000, 0x1000, Z)},
     {{0x1000, 0x1000, 0x1000}},
     {{0x1000, 0x1000, Z}}},
    {"adjacent ranges of one state coalesce",
     {Ins(0, 0, 0x100, D), Ins(0, 0x100, 0x100, D)},
     {{0, 0x200, 0}},
     {{0, 0x200, D}}},
    {"adjacent ranges of different states: one run, two spans",
     {Ins(0, 0, 0x100, Z), Ins(0, 0x100, 0x100, D)},
     {{0, 0x200, 0}},
     {{0, 0x100, Z}, {0x100, 0x100, D}}},
    {"a gap filled from both sides merges three into one",
     {Ins(0, 0, 0x100, D), Ins(0, 0x200, 0x100, D), Ins(0, 0x100, 0x100, D)},
     {{0, 0x300, 0}},
     {{0, 0x300, D}}},
    {"a gap filled with another state keeps three spans",
     {Ins(0, 0, 0x100, D), Ins(0, 0x200, 0x100, D), Ins(0, 0x100, 0x100, R)},
     {{0, 0x300, 0}},
     {{0, 0x100, D}, {0x100, 0x100, R}, {0x200, 0x100, D}}},
    {"adjacent chunks never merge, not even their spans",
     {Ins(0x0, 0x0, 0x100, Z), Ins(0x100, 0x100, 0x100, Z)},
     {{0x0, 0x100, 0x0}, {0x100, 0x100, 0x100}},
     {{0x0, 0x100, Z}, {0x100, 0x100, Z}}},
    {"best fit takes the smallest run that holds the size",
     {Ins(0, 0, 0x100, Z), Ins(0x1000, 0x1000, 0x50, D), Fit(0x40, 1, 0x1000, 0, 0x40)},
     {{0, 0x100, 0}, {0x1040, 0x10, 0x1000}},
     {{0, 0x100, Z}, {0x1040, 0x10, D}}},
    {"runs of equal size: the lowest address wins",
     {Ins(0x1000, 0x1000, 0x100, Z), Ins(0, 0, 0x100, Z), Fit(0x100, 1, 0, 0x100)},
     {{0x1000, 0x100, 0x1000}},
     {{0x1000, 0x100, Z}}},
    {"alignment leaves the padding in front as a run",
     {Ins(0, 0x10, 0x100, Z), Fit(0x40, 0x40, 0x40, 0x40)},
     {{0x10, 0x30, 0}, {0x80, 0x90, 0}},
     {{0x10, 0x30, Z}, {0x80, 0x90, Z}}},
    {"a run too small once aligned is skipped for a larger one",
     {Ins(0x1000, 0x1010, 0x40, Z), Ins(0x2000, 0x2000, 0x100, Z), Fit(0x40, 0x40, 0x2000, 0x40)},
     {{0x1010, 0x40, 0x1000}, {0x2040, 0xc0, 0x2000}},
     {{0x1010, 0x40, Z}, {0x2040, 0xc0, Z}}},
    {"no run fits",
     {Ins(0, 0, 0x100, Z), Ins(0x1000, 0x1000, 0x100, Z), Fit(0x101, 1, 0)},
     {{0, 0x100, 0}, {0x1000, 0x100, 0x1000}},
     {{0, 0x100, Z}, {0x1000, 0x100, Z}}},
    {"a take across states reports the bytes of each state",
     {Ins(0, 0, 0x100, Z), Ins(0, 0x100, 0x100, D), Ins(0, 0x200, 0x100, R), Take(0x80, 0x200, 0x80, 0x100, 0x80)},
     {{0, 0x80, 0}, {0x280, 0x80, 0}},
     {{0, 0x80, Z}, {0x280, 0x80, R}}},
    {"a carved range freed again coalesces back",
     {Ins(0, 0, 0x1000, Z), Fit(0x100, 1, 0, 0x100), Ins(0, 0, 0x100, D)},
     {{0, 0x1000, 0}},
     {{0, 0x100, D}, {0x100, 0xf00, Z}}},
    {"two carved neighbours freed merge into one dirty span",
     {Ins(0, 0, 0x1000, Z), Fit(0x100, 1, 0, 0x100), Fit(0x100, 1, 0x100, 0x100), Ins(0, 0x100, 0x100, D),
      Ins(0, 0, 0x100, D)},
     {{0, 0x1000, 0}},
     {{0, 0x200, D}, {0x200, 0xe00, Z}}},
    {"taking a whole run leaves nothing",
     {Ins(0, 0, 0x100, Z), Ins(0, 0x100, 0x100, D), Take(0, 0x200, 0x100, 0x100)},
     {},
     {}},
    {"best fit with alignment 1 returns odd addresses",
     {Ins(0, 0x1001, 0x7, D), Fit(0x3, 1, 0x1001, 0, 3)},
     {{0x1004, 0x4, 0}},
     {{0x1004, 0x4, D}}},
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class RangeSetTable : public ::testing::TestWithParam<Case> {};

TEST_P(RangeSetTable, EndsInTheExpectedRunsAndSpans) {
  const Case& c = GetParam();
  RangeSet set;
  for (const Op& op : c.ops) {
    switch (op.kind) {
      case Op::insert:
        set.insert(op.chunk, op.begin, op.size, static_cast<SpanState>(op.alignment));
        break;
      case Op::best_fit: {
        std::vector<Span> dirty;
        std::optional<Carved> got = set.take_best_fit(op.size, op.alignment, &dirty);
        if (op.begin == 0 && op.want_zero + op.want_dirty + op.want_released == 0) {
          EXPECT_FALSE(got) << c.name;
          break;
        }
        ASSERT_TRUE(got) << c.name;
        EXPECT_EQ(got->begin, op.begin) << c.name;
        EXPECT_EQ(got->size, op.size) << c.name;
        EXPECT_EQ(got->bytes_in(Z), op.want_zero) << c.name;
        EXPECT_EQ(got->bytes_in(D), op.want_dirty) << c.name;
        EXPECT_EQ(got->bytes_in(R), op.want_released) << c.name;
        size_t dirty_bytes = 0;
        for (const Span& s : dirty) dirty_bytes += s.size;
        EXPECT_EQ(dirty_bytes, op.want_dirty) << c.name;
        break;
      }
      case Op::exact: {
        Carved got = set.take_exact(op.begin, op.size);
        EXPECT_EQ(got.bytes_in(Z), op.want_zero) << c.name;
        EXPECT_EQ(got.bytes_in(D), op.want_dirty) << c.name;
        EXPECT_EQ(got.bytes_in(R), op.want_released) << c.name;
        break;
      }
    }
    ASSERT_EQ(set.check(), "") << c.name;
  }
  EXPECT_EQ(set.runs(), c.runs) << c.name;
  EXPECT_EQ(set.spans(), c.spans) << c.name;
  size_t total = 0, by_state[3] = {};
  for (const Span& s : c.spans) {
    total += s.size;
    by_state[static_cast<int>(s.state)] += s.size;
  }
  EXPECT_EQ(set.available_bytes(), total) << c.name;
  for (SpanState s : {Z, D, R}) EXPECT_EQ(set.bytes_in(s), by_state[static_cast<int>(s)]) << c.name;
}

INSTANTIATE_TEST_SUITE_P(Cases, RangeSetTable, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string n = info.param.name;
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

struct ReleasableCase {
  const char* name;
  std::vector<Op> inserts;
  uintptr_t begin, end;
  size_t page, max_bytes;
  std::vector<Run> want;
};

const ReleasableCase kReleasable[] = {
    {"released spans split stretches; ends are cut to pages",
     {Ins(0, 0, 0x1800, D), Ins(0, 0x1800, 0x800, R), Ins(0, 0x2000, 0x3000, Z)},
     0, 0x10000, 0x1000, SIZE_MAX,
     {{0, 0x1000, 0}, {0x2000, 0x3000, 0}}},
    {"zero and dirty side by side are one stretch",
     {Ins(0, 0, 0x800, Z), Ins(0, 0x800, 0x800, D)},
     0, 0x10000, 0x1000, SIZE_MAX,
     {{0, 0x1000, 0}}},
    {"max_bytes cuts the last stretch to the pages that cover what is left",
     {Ins(0, 0, 0x1000, D), Ins(0, 0x1000, 0x1000, R), Ins(0, 0x2000, 0x4000, Z)},
     0, 0x10000, 0x1000, 0x1800,
     {{0, 0x1000, 0}, {0x2000, 0x1000, 0}}},
    {"the asked range clips runs",
     {Ins(0, 0, 0x8000, D)},
     0x1800, 0x5000, 0x1000, SIZE_MAX,
     {{0x2000, 0x3000, 0}}},
    {"nothing smaller than a page",
     {Ins(0, 0x100, 0xe00, D), Ins(0x10000, 0x10000, 0x3000, R)},
     0, 0x20000, 0x1000, SIZE_MAX,
     {}},
    {"each chunk is its own run",
     {Ins(0, 0, 0x2000, D), Ins(0x2000, 0x2000, 0x2000, Z)},
     0, 0x10000, 0x1000, SIZE_MAX,
     {{0, 0x2000, 0}, {0x2000, 0x2000, 0x2000}}},
};

TEST(RangeSet, ReleasableStretches) {
  for (const ReleasableCase& c : kReleasable) {
    RangeSet set;
    for (const Op& op : c.inserts) set.insert(op.chunk, op.begin, op.size, static_cast<SpanState>(op.alignment));
    EXPECT_EQ(set.releasable(c.begin, c.end, c.page, c.max_bytes), c.want) << c.name;
  }
}

// Randomized: the set against a model that keeps one state per 16-byte unit.
TEST(RangeSet, MatchesAByteMapModel) {
  constexpr size_t kUnit = 16, kChunkUnits = 64, kChunks = 3;
  enum Cell : int { in_use = -1 };  // else a SpanState value
  std::vector<int> model(kChunkUnits * kChunks, static_cast<int>(Z));
  RangeSet set;
  // Chunks 0 and 1 are adjacent in the address space, chunk 2 is apart.
  auto chunk_base = [](size_t c) { return c < 2 ? 0x10000 + c * kChunkUnits * kUnit : 0x40000; };
  auto address = [&](size_t cell) { return chunk_base(cell / kChunkUnits) + (cell % kChunkUnits) * kUnit; };
  for (size_t c = 0; c < kChunks; ++c) set.insert(chunk_base(c), chunk_base(c), kChunkUnits * kUnit, Z);

  std::mt19937_64 rng(20240611);
  std::vector<std::pair<size_t, size_t>> taken;  // (first cell, cells)
  for (int step = 0; step < 20000; ++step) {
    if (taken.empty() || rng() % 2 == 0) {
      const size_t cells = 1 + rng() % 12, alignment = kUnit << (rng() % 4);
      // Expected best fit from the model: maximal available stretches per chunk.
      std::optional<std::pair<size_t, uintptr_t>> best;  // (run size, aligned begin)
      for (size_t c = 0; c < kChunks; ++c) {
        size_t i = c * kChunkUnits;
        while (i < (c + 1) * kChunkUnits) {
          if (model[i] == in_use) {
            ++i;
            continue;
          }
          size_t j = i;
          while (j < (c + 1) * kChunkUnits && model[j] != in_use) ++j;
          const uintptr_t b = address(i), e = address(j - 1) + kUnit;
          const uintptr_t a = (b + alignment - 1) & ~(alignment - 1);
          if (a + cells * kUnit <= e) {
            const std::pair<size_t, uintptr_t> key{e - b, b};
            if (!best || key < std::pair<size_t, uintptr_t>{best->first, best->second}) best = key;
          }
          i = j;
        }
      }
      std::optional<Carved> got = set.take_best_fit(cells * kUnit, alignment);
      ASSERT_EQ(got.has_value(), best.has_value()) << "step " << step;
      if (!got) continue;
      EXPECT_EQ(got->begin, (best->second + alignment - 1) & ~(alignment - 1)) << "step " << step;
      size_t first = 0;
      while (address(first) != got->begin) ++first;
      size_t by_state[3] = {};
      for (size_t k = first; k < first + cells; ++k) {
        ASSERT_NE(model[k], in_use);
        by_state[model[k]] += kUnit;
        model[k] = in_use;
      }
      for (int s = 0; s < 3; ++s) EXPECT_EQ(got->bytes[s], by_state[s]) << "step " << step;
      taken.emplace_back(first, cells);
    } else {
      // Give back a random taken range, in whole or in part, in a random state.
      const size_t pick = rng() % taken.size();
      auto [first, cells] = taken[pick];
      taken.erase(taken.begin() + static_cast<long>(pick));
      const SpanState state = static_cast<SpanState>(rng() % 3);
      const size_t c = first / kChunkUnits;
      set.insert(chunk_base(c), address(first), cells * kUnit, state);
      for (size_t k = first; k < first + cells; ++k) model[k] = static_cast<int>(state);
    }
    ASSERT_EQ(set.check(), "") << "step " << step;
  }
  // The spans say exactly what the model says.
  for (const Span& s : set.spans())
    for (uintptr_t a = s.begin; a < s.end(); a += kUnit) {
      size_t cell = 0;
      while (address(cell) != a) ++cell;
      EXPECT_EQ(model[cell], static_cast<int>(s.state));
    }
}

}  // namespace
}  // namespace ferry
