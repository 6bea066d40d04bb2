// batch_ranges.cpp — items checked by allocation range (batch_ranges.h).
#include "cuda/copy/batch_ranges.h"

#include <algorithm>

namespace ferry::cuda {

namespace {

bool holds(const PointerInfo& r, uintptr_t a, size_t bytes) {
  const uintptr_t off = a - r.start;  // wraps above r.size when a < r.start
  return off < r.size && bytes <= r.size - off;
}

}  // namespace

uint32_t BatchRanges::add(uintptr_t a) {
  const PointerInfo info = lookup_.find(reinterpret_cast<const void*>(a));
  if (info.size == 0 || info.kind == Memory::pageable_host) return kNone;
  const auto r = static_cast<uint32_t>(ranges_.size());
  ranges_.push_back(info);
  auto at = std::upper_bound(by_start_.begin(), by_start_.end(), info.start,
                             [&](uintptr_t s, uint32_t i) { return s < ranges_[i].start; });
  by_start_.insert(at, r);
  return r;
}

uint32_t BatchRanges::find(uintptr_t a) {
  for (uint32_t r : recent_)
    if (r != kNone && a - ranges_[r].start < ranges_[r].size) return r;
  uint32_t found = kNone;
  auto it = std::upper_bound(by_start_.begin(), by_start_.end(), a,
                             [&](uintptr_t x, uint32_t i) { return x < ranges_[i].start; });
  if (it != by_start_.begin() && a - ranges_[*std::prev(it)].start < ranges_[*std::prev(it)].size)
    found = *std::prev(it);
  else
    found = add(a);
  if (found != kNone && found != recent_[0]) recent_[1] = recent_[0], recent_[0] = found;
  return found;
}

bool BatchRanges::check(const CopyOp& op, RangedItem& out) {
  const auto d = reinterpret_cast<uintptr_t>(op.dst), s = reinterpret_cast<uintptr_t>(op.src);
  if (!d || !s || op.bytes == 0) return false;
  const uint32_t rd = find(d);
  if (rd == kNone) return false;
  const uint32_t rs = find(s);
  if (rs == kNone || rs == rd) return false;
  const PointerInfo &id = ranges_[rd], &is = ranges_[rs];
  if (!holds(id, d, op.bytes) || !holds(is, s, op.bytes)) return false;
  auto ours = [&](const PointerInfo& i) { return i.kind == Memory::device && (i.device < 0 || i.device == device_); };
  Direction dir;
  if (ours(id) && is.kind == Memory::pinned_host)
    dir = Direction::h2d;
  else if (id.kind == Memory::pinned_host && ours(is))
    dir = Direction::d2h;
  else
    return false;
  out = {op.dst, op.src, op.bytes, rd, rs, dir};
  return true;
}

}  // namespace ferry::cuda
