// many_plan.h — the items of one copy_many call, checked, routed (one
// choose_route each, copy/strategy.h) and sorted by the path that moves them.
#pragma once

#include <algorithm>

#include <span>
#include <vector>

#include "copy/split_at_ends.h"
#include "copy/strategy.h"
#include "cuda/copy/block_copy.h"
#include "cuda/copy/copy_engine.h"
#include "cuda/copy/eager_copy.h"
#include "cuda/copy/pointer_checks.h"

namespace ferry::cuda {

class PointerLookup;

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
  std::vector<BlockCopy> kernel_ops;   // sm_kernel: the block-copy kernel
  std::vector<EagerItem> eager[2];     // eager, by direction: one eager run each
  std::vector<size_t> single;          // indices: one copy each (streamed, pin-in-place, cuda)
  std::vector<Route> routes;           // per item
  size_t total = 0, largest = 0;
  Strategy main = Strategy::direct;    // the strategy of the largest item
};

// `pairs[i]` is ops[i] checked (check_copy_pair). The mean size of the pinned
// and device<->device items is what sends a batch of small ones to the SM
// kernel (choose_route).
ManyPlan plan_many(std::span<const CopyOp> ops, std::span<const CopyPair> pairs, CallKind call,
                   const MachineProfile& profile, Strategy requested, PointerLookup& lookup);

}  // namespace ferry::cuda
