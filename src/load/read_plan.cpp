// read_plan.cpp — ranges are cut at window boundaries into segments, sorted
// by file position, and runs of segments that are close together in one
// window become one read.
#include "load/read_plan.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace ferry::load {
namespace {

constexpr uint64_t kPage = 4096;

struct Segment {
  uint32_t file;
  uint64_t offset, bytes;
  uintptr_t dst;
};

std::string range_text(const FileRange& r, size_t index, std::span<const std::string> names) {
  std::string file = r.file < names.size() ? names[r.file] : "file " + std::to_string(r.file);
  return file + ": range " + std::to_string(index) + " (bytes [" + std::to_string(r.offset) + ", " +
         std::to_string(r.offset + r.bytes) + "))";
}

void check_options(const PlanOptions& o) {
  if (o.window_bytes == 0 || o.window_bytes % kPage != 0)
    throw InvalidArgument("read plan: window_bytes=" + std::to_string(o.window_bytes) +
                          ": expected a positive multiple of 4096");
  if (o.merge_gap_bytes < kPage)
    throw InvalidArgument("read plan: merge_gap_bytes=" + std::to_string(o.merge_gap_bytes) +
                          ": expected at least 4096 (reads must not share a page)");
}

void check_ranges(std::span<const FileRange> ranges, std::span<const uint64_t> file_bytes,
                  std::span<const std::string> names) {
  if (file_bytes.size() != names.size())
    throw InvalidArgument("read plan: " + std::to_string(file_bytes.size()) + " file sizes but " +
                          std::to_string(names.size()) + " file names");
  for (size_t i = 0; i < ranges.size(); ++i) {
    const FileRange& r = ranges[i];
    if (r.bytes == 0) continue;
    if (r.file >= file_bytes.size())
      throw InvalidArgument("read plan: range " + std::to_string(i) + " names file " + std::to_string(r.file) +
                            " of " + std::to_string(file_bytes.size()));
    if (r.offset > file_bytes[r.file] || r.bytes > file_bytes[r.file] - r.offset)
      throw InvalidArgument(range_text(r, i, names) + " runs past the end of the file (" +
                            std::to_string(file_bytes[r.file]) + " bytes)");
    if (r.dst == 0) throw InvalidArgument(range_text(r, i, names) + ": null destination");
    if (r.dst + r.bytes < r.dst) throw InvalidArgument(range_text(r, i, names) + ": destination wraps around");
  }
  // Two ranges writing the same destination bytes: the result would depend on
  // which copy ran last.
  std::vector<size_t> by_dst;
  for (size_t i = 0; i < ranges.size(); ++i)
    if (ranges[i].bytes) by_dst.push_back(i);
  std::sort(by_dst.begin(), by_dst.end(), [&](size_t a, size_t b) { return ranges[a].dst < ranges[b].dst; });
  for (size_t k = 1; k < by_dst.size(); ++k) {
    const FileRange& a = ranges[by_dst[k - 1]];
    const FileRange& b = ranges[by_dst[k]];
    if (b.dst < a.dst + a.bytes)
      throw InvalidArgument(range_text(b, by_dst[k], names) + " and " + range_text(a, by_dst[k - 1], names) +
                            " write overlapping destination bytes");
  }
}

std::vector<Segment> cut_at_windows(std::span<const FileRange> ranges, uint64_t window, uint64_t* total) {
  std::vector<Segment> segs;
  segs.reserve(ranges.size());
  for (const FileRange& r : ranges) {
    *total += r.bytes;
    uint64_t done = 0;
    while (done < r.bytes) {
      uint64_t off = r.offset + done;
      uint64_t n = std::min(r.bytes - done, (off / window + 1) * window - off);
      segs.push_back({r.file, off, n, r.dst + static_cast<uintptr_t>(done)});
      done += n;
    }
  }
  std::sort(segs.begin(), segs.end(), [](const Segment& a, const Segment& b) {
    if (a.file != b.file) return a.file < b.file;
    if (a.offset != b.offset) return a.offset < b.offset;
    return a.dst < b.dst;
  });
  return segs;
}

}  // namespace

ReadPlan plan_reads(std::span<const FileRange> ranges, std::span<const uint64_t> file_bytes,
                    std::span<const std::string> file_names, const PlanOptions& options) {
  check_options(options);
  check_ranges(ranges, file_bytes, file_names);
  ReadPlan plan;
  const uint64_t w = options.window_bytes;
  std::vector<Segment> segs = cut_at_windows(ranges, w, &plan.range_bytes);
  plan.copies.reserve(segs.size());
  for (const Segment& s : segs) {
    PlannedRead* cur = plan.reads.empty() ? nullptr : &plan.reads.back();
    const bool joins = cur && cur->file == s.file && cur->offset / w == s.offset / w &&
                       s.offset <= cur->offset + cur->bytes + options.merge_gap_bytes;
    if (!joins) {
      plan.reads.push_back({s.file, s.offset, 0, plan.copies.size(), 0});
      cur = &plan.reads.back();
    }
    cur->bytes = std::max(cur->bytes, s.offset + s.bytes - cur->offset);
    // One copy per segment, even where the next tensor continues this one at
    // the destination: two tensors back to back may lie in two allocations,
    // and one cudaMemcpyAsync across them fails (cudaErrorInvalidValue).
    plan.copies.push_back({s.offset - cur->offset, s.bytes, s.dst});
    ++cur->copy_count;
  }
  for (const PlannedRead& r : plan.reads) plan.read_bytes += r.bytes;
  return plan;
}

}  // namespace ferry::load
