// range_cache.h — address ranges already looked up, each with a value, so that
// a batch of many blocks in a few allocations asks the driver once per
// allocation instead of once per pointer. Pure bookkeeping, no CUDA: the CUDA
// layer's PointerLookup fills it with what cuPointerGetAttributes reported.
//
// Ranges are kept sorted by start and never overlap (an overlapping add is
// refused: allocations do not overlap, so it would be a stale answer). find()
// tries the last hit first: consecutive ops of a batch mostly hit the same
// allocation.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace ferry {

template <class Value>
class RangeCache {
 public:
  struct Range {
    uintptr_t start = 0;
    size_t size = 0;
    Value value{};
    bool contains(uintptr_t a) const { return a - start < size; }  // wraps below start
  };

  // The range that holds address a, or nullptr.
  const Range* find(uintptr_t a) const {
    if (last_ < ranges_.size() && ranges_[last_].contains(a)) return &ranges_[last_];
    auto it = std::upper_bound(ranges_.begin(), ranges_.end(), a,
                               [](uintptr_t x, const Range& r) { return x < r.start; });
    if (it == ranges_.begin() || !std::prev(it)->contains(a)) return nullptr;
    last_ = static_cast<size_t>(std::prev(it) - ranges_.begin());
    return &ranges_[last_];
  }

  // Adds [start, start + size); false (and nothing added) when size is 0, the
  // range wraps, or it overlaps a range already held.
  bool add(uintptr_t start, size_t size, const Value& value) {
    if (size == 0 || start + size < start) return false;
    auto it = std::upper_bound(ranges_.begin(), ranges_.end(), start,
                               [](uintptr_t x, const Range& r) { return x < r.start; });
    if (it != ranges_.end() && it->start < start + size) return false;
    if (it != ranges_.begin() && std::prev(it)->start + std::prev(it)->size > start) return false;
    last_ = static_cast<size_t>(it - ranges_.begin());
    ranges_.insert(it, Range{start, size, value});
    return true;
  }

  size_t size() const { return ranges_.size(); }

 private:
  std::vector<Range> ranges_;  // sorted by start, disjoint
  mutable size_t last_ = 0;    // index of the last hit
};

}  // namespace ferry
