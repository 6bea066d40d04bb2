// plan.h — how a copy is cut into pieces. Pure arithmetic, no memory behind it,
// so it is tested table-driven on any machine.
//
// Staging cuts [0, n) into chunks that fit a staging slot. Pin-in-place cuts a
// host range at huge-page boundaries: a registration never covers part of a
// 2 MiB page (a partial pin splits a THP), so the unaligned head and tail go
// through staging instead and the aligned body is registered piece by piece.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "os/memory.h"

namespace ferry {

struct Piece {
  size_t offset = 0;  // from the start of the copy
  size_t bytes = 0;
  bool operator==(const Piece&) const = default;
};

// [0, n) in pieces of at most `chunk` bytes (the last may be shorter).
// Preconditions: chunk > 0.
std::vector<Piece> split_even(size_t n, size_t chunk);

struct PinPlan {
  Piece head;               // before the first boundary: staged
  std::vector<Piece> body;  // boundary-aligned, multiples of `boundary`: pinned in place
  Piece tail;               // after the last boundary: staged
};

// Preconditions: boundary is a power of two; piece_bytes is a multiple of it.
PinPlan plan_pin_in_place(uintptr_t host_address, size_t n, size_t piece_bytes,
                          size_t boundary = os::kHugePage2MBytes);

// Splits the body of a pin plan: the first `pinned_share` of its bytes (rounded
// to whole pieces) stay pinned in place, the rest is moved to `staged`.
// Used by the hybrid strategy, which runs both engines at once.
void split_hybrid(PinPlan& plan, double pinned_share, std::vector<Piece>& staged);

}  // namespace ferry
