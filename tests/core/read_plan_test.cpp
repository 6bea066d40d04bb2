// read_plan_test.cpp — the read plan on ranges with no files behind them:
// table-driven cases (merging, window cuts, gaps, duplicates), the plan's
// invariants on random ranges (every byte copied once, reads within windows,
// disjoint pages), and each refused input.
#include "load/read_plan.h"

#include <gtest/gtest.h>

#include <algorithm>

#include <random>

#include "core/error.h"

namespace ferry::load {
namespace {

constexpr uint64_t KiB = 1024, MiB = 1024 * KiB;

// Executes the plan against in-memory "files": each read's bytes are taken
// from the file, each copy writes the destination buffer (dst = offset into it).
std::vector<uint8_t> execute(const ReadPlan& plan, const std::vector<std::vector<uint8_t>>& files, size_t dst_bytes) {
  std::vector<uint8_t> dst(dst_bytes, 0xEE);
  for (const PlannedRead& r : plan.reads)
    for (size_t c = r.first_copy; c < r.first_copy + r.copy_count; ++c) {
      const PlannedCopy& cp = plan.copies[c];
      EXPECT_LE(cp.at + cp.bytes, r.bytes);
      std::copy_n(files[r.file].begin() + static_cast<ptrdiff_t>(r.offset + cp.at), cp.bytes,
                  dst.begin() + static_cast<ptrdiff_t>(cp.dst - 1));
    }
  return dst;
}

void check_invariants(const ReadPlan& plan, const PlanOptions& o) {
  uint64_t sum = 0;
  size_t next_copy = 0;
  for (size_t i = 0; i < plan.reads.size(); ++i) {
    const PlannedRead& r = plan.reads[i];
    EXPECT_GT(r.bytes, 0u);
    EXPECT_EQ(r.offset / o.window_bytes, (r.offset + r.bytes - 1) / o.window_bytes) << "read " << i << " crosses a window";
    EXPECT_EQ(r.first_copy, next_copy);
    next_copy += r.copy_count;
    sum += r.bytes;
    if (i > 0) {
      const PlannedRead& p = plan.reads[i - 1];
      ASSERT_TRUE(p.file < r.file || (p.file == r.file && p.offset + p.bytes <= r.offset)) << "reads out of order";
      if (p.file == r.file) {  // pages of two reads never overlap
        uint64_t p_end_page = (p.offset + p.bytes + 4095) / 4096;
        uint64_t r_first_page = r.offset / 4096;
        EXPECT_LE(p_end_page, r_first_page) << "reads " << i - 1 << " and " << i << " share a page";
      }
    }
  }
  EXPECT_EQ(next_copy, plan.copies.size());
  EXPECT_EQ(sum, plan.read_bytes);
}

TEST(ReadPlan, MergesNearbyRangesAndCutsAtWindows) {
  PlanOptions o{1 * MiB, 64 * KiB};
  std::vector<uint64_t> sizes{10 * MiB, 3 * MiB};
  std::vector<std::string> names{"a", "b"};
  std::vector<FileRange> ranges{
      {0, 100, 1000, 1},                      // with the next: gap 24 bytes
      {0, 1124, 2000, 1001},
      {0, 1124 + 2000 + 64 * KiB + 1, 10, 5001},  // gap past merge_gap: new read
      {0, MiB - 10, 30, 6001},                 // crosses the 1 MiB boundary: cut
      {1, 0, 3 * MiB, 7001},                   // three windows
      {0, 5 * MiB, 0, 0},                      // empty: skipped (even with a null dst)
  };
  ReadPlan plan = plan_reads(ranges, sizes, names, o);
  check_invariants(plan, o);
  ASSERT_EQ(plan.reads.size(), 7u);
  EXPECT_EQ(plan.reads[0].offset, 100u);
  EXPECT_EQ(plan.reads[0].bytes, 3024u);
  EXPECT_EQ(plan.reads[0].copy_count, 2u);
  EXPECT_EQ(plan.reads[1].offset, 1124 + 2000 + 64 * KiB + 1);
  EXPECT_EQ(plan.reads[2].offset, MiB - 10);
  EXPECT_EQ(plan.reads[2].bytes, 10u);
  EXPECT_EQ(plan.reads[3].offset, MiB);
  EXPECT_EQ(plan.reads[3].bytes, 20u);
  EXPECT_EQ(plan.copies[plan.reads[3].first_copy].dst, 6011u);
  for (int w = 0; w < 3; ++w) {
    EXPECT_EQ(plan.reads[4 + w].file, 1u);
    EXPECT_EQ(plan.reads[4 + w].offset, w * MiB);
    EXPECT_EQ(plan.reads[4 + w].bytes, MiB);
  }
  EXPECT_EQ(plan.range_bytes, 1000u + 2000 + 10 + 30 + 3 * MiB);
}

TEST(ReadPlan, OverlappingSourcesShareOneRead) {
  // Tied weights: two destinations of the same file bytes.
  PlanOptions o{16 * MiB, 64 * KiB};
  std::vector<uint64_t> sizes{1 * MiB};
  std::vector<std::string> names{"a"};
  std::vector<FileRange> ranges{{0, 4096, 8192, 1}, {0, 4096, 8192, 100000}, {0, 6000, 100, 200000}};
  ReadPlan plan = plan_reads(ranges, sizes, names, o);
  ASSERT_EQ(plan.reads.size(), 1u);
  EXPECT_EQ(plan.reads[0].bytes, 8192u);
  EXPECT_EQ(plan.copies.size(), 3u);
  EXPECT_EQ(plan.read_bytes, 8192u);
}

TEST(ReadPlan, BackToBackRangesAreCopiedOneByOne) {
  // 5,000 small tensors back to back in the file and at the destination:
  // they share reads, but each is its own copy (tensors back to back may be
  // two allocations, which one cudaMemcpyAsync must not span: the H200 run
  // failed with cudaErrorInvalidValue when the plan merged them).
  PlanOptions o{1 * MiB, 64 * KiB};
  std::vector<uint64_t> sizes{40 * MiB};
  std::vector<std::string> names{"a"};
  std::vector<FileRange> ranges;
  uint64_t at = 8 + 1000;  // header
  for (int i = 0; i < 5000; ++i) {
    uint64_t n = 1000 + 37 * static_cast<uint64_t>(i % 100);
    ranges.push_back({0, at, n, 1 + at});
    at += n;
  }
  ReadPlan plan = plan_reads(ranges, sizes, names, o);
  check_invariants(plan, o);
  EXPECT_LT(plan.reads.size(), 100u);
  EXPECT_GE(plan.copies.size(), 5000u);
  EXPECT_LE(plan.copies.size(), 5000u + plan.reads.size());  // a range cut at a window: two copies
  for (const auto& c : plan.copies) {  // inside one range's destination
    auto r = std::upper_bound(ranges.begin(), ranges.end(), c.dst,
                              [](uintptr_t d, const FileRange& x) { return d < x.dst; });
    ASSERT_NE(r, ranges.begin());
    --r;
    EXPECT_LE(c.dst + c.bytes, r->dst + r->bytes);
  }
}

TEST(ReadPlan, RandomRangesAreCopiedExactlyOnce) {
  std::mt19937_64 rng(3);
  for (int round = 0; round < 150; ++round) {
    PlanOptions o{4096 * (1 + rng() % 64), 4096 * (1 + rng() % 4)};
    size_t nfiles = 1 + rng() % 4;
    std::vector<std::vector<uint8_t>> files(nfiles);
    std::vector<uint64_t> sizes;
    std::vector<std::string> names;
    for (size_t f = 0; f < nfiles; ++f) {
      files[f].resize(rng() % (300 * KiB));
      for (size_t i = 0; i < files[f].size(); i += 8) {  // random bytes, 8 per draw
        uint64_t r = rng();
        for (size_t k = i; k < std::min(i + 8, files[f].size()); ++k, r >>= 8) files[f][k] = static_cast<uint8_t>(r);
      }
      sizes.push_back(files[f].size());
      names.push_back("f" + std::to_string(f));
    }
    // Ranges at odd offsets and sizes, destinations packed one after another
    // (dst is 1-based: 0 is the null destination).
    std::vector<FileRange> ranges;
    std::vector<uint8_t> expected;
    for (int k = 0; k < 1 + static_cast<int>(rng() % 40); ++k) {
      uint32_t f = static_cast<uint32_t>(rng() % nfiles);
      if (sizes[f] == 0) continue;
      uint64_t off = rng() % sizes[f];
      uint64_t n = rng() % (sizes[f] - off + 1);
      ranges.push_back({f, off, n, expected.size() + 1});
      expected.insert(expected.end(), files[f].begin() + static_cast<ptrdiff_t>(off),
                      files[f].begin() + static_cast<ptrdiff_t>(off + n));
    }
    ReadPlan plan = plan_reads(ranges, sizes, names, o);
    check_invariants(plan, o);
    EXPECT_EQ(execute(plan, files, expected.size()), expected) << "round " << round;
    uint64_t copied = 0;
    for (const auto& c : plan.copies) copied += c.bytes;
    EXPECT_EQ(copied, plan.range_bytes);
  }
}

TEST(ReadPlan, RefusesBadInput) {
  std::vector<uint64_t> sizes{1000, 50};
  std::vector<std::string> names{"model-1.safetensors", "model-2.safetensors"};
  PlanOptions o;
  struct {
    std::vector<FileRange> ranges;
    PlanOptions options;
    const char* expect;
  } cases[] = {
      {{{2, 0, 10, 1}}, o, "range 0 names file 2 of 2"},
      {{{1, 40, 11, 1}}, o, "model-2.safetensors: range 0 (bytes [40, 51)) runs past the end of the file (50 bytes)"},
      {{{1, 51, 1, 1}}, o, "runs past the end"},
      {{{0, 0, 10, 1}, {1, UINT64_MAX, 2, 100}}, o, "model-2.safetensors: range 1"},
      {{{0, 0, 10, 0}}, o, "model-1.safetensors: range 0 (bytes [0, 10)): null destination"},
      {{{0, 0, 10, UINTPTR_MAX - 4}}, o, "destination wraps around"},
      {{{0, 0, 10, 100}, {0, 20, 10, 105}}, o, "range 1 (bytes [20, 30)) and model-1.safetensors: range 0 (bytes [0, 10)) write overlapping destination bytes"},
      {{{0, 0, 10, 100}}, PlanOptions{0, 4096}, "window_bytes=0"},
      {{{0, 0, 10, 100}}, PlanOptions{5000, 4096}, "window_bytes=5000: expected a positive multiple of 4096"},
      {{{0, 0, 10, 100}}, PlanOptions{4096, 100}, "merge_gap_bytes=100"},
  };
  for (const auto& c : cases) {
    try {
      plan_reads(c.ranges, sizes, names, c.options);
      ADD_FAILURE() << "accepted: " << c.expect;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(c.expect), std::string::npos) << e.what();
    }
  }
  std::vector<std::string> one_name{"x"};
  EXPECT_THROW(plan_reads({}, sizes, one_name, o), InvalidArgument);
  EXPECT_TRUE(plan_reads({}, sizes, names, o).reads.empty());
}

}  // namespace
}  // namespace ferry::load
