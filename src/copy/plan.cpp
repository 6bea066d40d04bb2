// plan.cpp — chunking arithmetic for the copy engine.
#include "copy/plan.h"

#include <algorithm>
#include <cmath>

namespace ferry {

std::vector<Piece> split_even(size_t n, size_t chunk) {
  std::vector<Piece> out;
  out.reserve(n / chunk + 1);
  for (size_t off = 0; off < n; off += chunk) out.push_back({off, std::min(chunk, n - off)});
  return out;
}

PinPlan plan_pin_in_place(uintptr_t host_address, size_t n, size_t piece_bytes, size_t boundary) {
  PinPlan p;
  const uintptr_t begin = host_address, end = host_address + n;
  const uintptr_t body_begin = (begin + boundary - 1) & ~(uintptr_t(boundary) - 1);
  const uintptr_t body_end = end & ~(uintptr_t(boundary) - 1);
  if (body_begin >= body_end) {  // no whole boundary-aligned block inside: all staged
    p.head = {0, n};
    return p;
  }
  p.head = {0, body_begin - begin};
  for (uintptr_t a = body_begin; a < body_end; a += piece_bytes)
    p.body.push_back({a - begin, std::min<size_t>(piece_bytes, body_end - a)});
  p.tail = {body_end - begin, end - body_end};
  return p;
}

void split_hybrid(PinPlan& plan, double pinned_share, std::vector<Piece>& staged) {
  size_t body_bytes = 0;
  for (const auto& piece : plan.body) body_bytes += piece.bytes;
  const double share = std::clamp(pinned_share, 0.0, 1.0);
  const size_t keep_bytes = static_cast<size_t>(std::llround(share * static_cast<double>(body_bytes)));
  size_t kept = 0, keep = 0;
  while (keep < plan.body.size() && kept + plan.body[keep].bytes / 2 < keep_bytes)
    kept += plan.body[keep++].bytes;
  staged.insert(staged.end(), plan.body.begin() + keep, plan.body.end());
  plan.body.resize(keep);
}

}  // namespace ferry
