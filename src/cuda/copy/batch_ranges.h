// batch_ranges.h — a copy_many call's items checked by allocation range: the
// common item (a KV block: one side inside a device allocation of the
// engine's device, the other inside one pinned registration) costs two
// range look-ups and four compares, no driver call and no copy of the
// driver's answer. Anything else (pageable memory, a range the driver reports
// no size for, an item past an allocation's end, device<->device, NULL,
// size 0) is left to check_copy_pair (pointer_checks.h), which names what is
// wrong; so the answers and the errors are the same as item by item.
//
// Why: checking 262,144 blocks of 4 KiB one by one (six PointerLookup::find
// calls each, plus the plan's) cost ~0.2 us a block, as much as the copy
// engine's DMA of 4 KiB; a KV connector calls with that many.
//
// Lifetime: one object per call, like its PointerLookup. Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "copy/strategy.h"
#include "cuda/copy/copy_engine.h"
#include "cuda/pointer_lookup.h"

namespace ferry::cuda {

// One checked pinned<->device item; the ranges are BatchRanges indices.
struct RangedItem {
  void* dst;
  const void* src;
  size_t bytes;
  uint32_t dst_range, src_range;
  Direction dir;
};

class BatchRanges {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;

  BatchRanges(PointerLookup& lookup, int device) : lookup_(lookup), device_(device) {}

  // True (and `out` set) for the common item described above.
  bool check(const CopyOp& op, RangedItem& out);

  // The kernel's address of p, which lies in range `r` (block_copy.h).
  void* device_view(uint32_t r, const void* p) const {
    const PointerInfo& i = ranges_[r];
    return reinterpret_cast<void*>(i.device_start + (reinterpret_cast<uintptr_t>(p) - i.start));
  }

  // b continues a (both sides adjacent, same allocations, same direction):
  // one DMA or kernel op can move both.
  static bool continues(const RangedItem& a, const RangedItem& b) {
    return a.dir == b.dir && a.dst_range == b.dst_range && a.src_range == b.src_range &&
           static_cast<char*>(a.dst) + a.bytes == b.dst && static_cast<const char*>(a.src) + a.bytes == b.src;
  }

 private:
  uint32_t find(uintptr_t a);  // the index of the range holding a, or kNone
  uint32_t add(uintptr_t a);   // asks the lookup; kNone when the answer has no range

  PointerLookup& lookup_;
  int device_;
  std::vector<PointerInfo> ranges_;   // ranges seen, in the order seen (indices stay valid)
  std::vector<uint32_t> by_start_;    // indices of ranges_, sorted by start
  uint32_t recent_[2] = {kNone, kNone};  // the last two ranges found (a batch alternates dst, src)
};

}  // namespace ferry::cuda
