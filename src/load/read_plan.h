// read_plan.h — which reads a load makes: byte ranges of files (tensors) and
// where each goes, turned into file reads of at most one staging slot, each
// with the copies out of it. Pure C++: the plan is a value, tested with no
// file and no GPU behind it.
//
// Invariants of a plan (checked by the tests):
//   - reads are sorted by (file, offset); a read never crosses a multiple of
//     window_bytes in its file, so it fits one slot, and (window_bytes being a
//     multiple of the page size) the pages of two reads of one file are
//     disjoint: reads in different windows meet at most at a page-aligned
//     boundary, and reads in one window are more than merge_gap_bytes
//     (>= one page) apart. The mapped path relies on this: it registers each
//     read's pages, and two registrations must never overlap;
//   - every byte of every range is covered by exactly one copy; a read's
//     copies lie inside it; ranges closer than merge_gap_bytes (or
//     overlapping: two destinations of the same bytes) share a read;
//   - each range's segment is its own copy: ranges back to back at the
//     destination may be two allocations, which one copy must not span.
// Refused (InvalidArgument naming the file and the range): a file index out
// of range, a range past the end of its file, a null destination, two ranges
// whose destinations overlap, bad window or gap sizes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ferry::load {

struct FileRange {
  uint32_t file = 0;    // index into the load's files
  uint64_t offset = 0;  // in the file
  uint64_t bytes = 0;   // 0: nothing to do (skipped)
  uintptr_t dst = 0;    // where the bytes go (device memory for the CUDA loader)
};

struct PlannedCopy {
  uint64_t at = 0;  // offset of the bytes within their read
  uint64_t bytes = 0;
  uintptr_t dst = 0;
};

struct PlannedRead {
  uint32_t file = 0;
  uint64_t offset = 0;  // in the file
  uint64_t bytes = 0;
  size_t first_copy = 0, copy_count = 0;  // into ReadPlan::copies
};

struct PlanOptions {
  uint64_t window_bytes = uint64_t{16} << 20;  // the slot size; a multiple of 4 KiB
  uint64_t merge_gap_bytes = uint64_t{64} << 10;  // >= 4 KiB
};

struct ReadPlan {
  std::vector<PlannedRead> reads;
  std::vector<PlannedCopy> copies;
  uint64_t range_bytes = 0;  // sum of the ranges' sizes
  uint64_t read_bytes = 0;   // sum of the reads' sizes (includes merged gaps)
};

// file_bytes[i] and file_names[i] describe file i.
ReadPlan plan_reads(std::span<const FileRange> ranges, std::span<const uint64_t> file_bytes,
                    std::span<const std::string> file_names, const PlanOptions& options);

}  // namespace ferry::load
