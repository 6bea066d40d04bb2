// many_plan.h — the items of one copy_many call, checked, merged where both
// sides are adjacent, routed (copy/strategy.h's choose_route) and sorted by
// the path that moves them.
//
// Pinned<->device items are checked by allocation range (batch_ranges.h) and
// merged with the item before them when both their sides continue it in the
// same allocations (a block table of consecutive blocks becomes one copy);
// the rest are checked one by one (check_copy_pair) and routed one by one.
#pragma once

#include <algorithm>
#include <span>
#include <utility>
#include <vector>

#include "copy/split_at_ends.h"
#include "copy/strategy.h"
#include "cuda/copy/block_copy.h"
#include "cuda/copy/copy_engine.h"
#include "cuda/copy/eager_copy.h"
#include "cuda/copy/pointer_checks.h"
#include "cuda/pointer_lookup.h"  // split_at_registrations calls into it

namespace ferry::cuda {


// Calls emit(dst, src, n) for the pieces of one DMA copy, cut where either
// side's pinned registration ends (PointerLookup::pinned_bytes_after).
template <class Emit>
void split_at_registrations(void* dst, const void* src, size_t bytes, PointerLookup& lookup, Emit&& emit) {
  split_at_ends(dst, src, bytes, [&](const void* p) { return lookup.pinned_bytes_after(p); },
                std::forward<Emit>(emit));
}

struct ManyPlan {
  std::vector<void*> dsts;  // dma: one cudaMemcpyBatchAsync
  std::vector<const void*> srcs;
  std::vector<size_t> sizes;
  std::vector<BlockCopy> kernel_ops;   // sm_kernel: the block-copy kernel (device views, not yet cut in pieces)
  std::vector<EagerItem> eager[2];     // eager, by direction: one eager run each
  std::vector<std::pair<size_t, Route>> single;  // ops index and route: one copy each (streamed, pin-in-place, cuda)
  size_t total = 0, largest = 0;
  size_t items = 0, merged = 0;        // ops given; ops merged into the one before them
  Strategy main = Strategy::direct;    // the strategy of the largest item
  bool directions[2] = {false, false}; // which directions the call has (device<->device counts as h2d)
};

// Checks every op (InvalidArgument naming "item i of n" before any work),
// merges and routes them. The mean size of the pinned and device<->device
// items, after merging, is what sends a batch of small ones to the SM kernel
// (choose_route). `device`: the engine's.
ManyPlan plan_many(std::span<const CopyOp> ops, CallKind call, const MachineProfile& profile, Strategy requested,
                   PointerLookup& lookup, int device);

}  // namespace ferry::cuda
