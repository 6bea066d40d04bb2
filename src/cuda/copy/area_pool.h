// area_pool.h — the copy engine's staging areas (cuda/staging_area.h) for
// eager staged copies (cuda/copy/eager_copy.h): a copy holds one area for its
// whole run.
//
// Why areas rather than one shared ring: a copy stages its chunks in order and
// frees them in order, so one copy per area needs no bookkeeping between
// copies beyond each slot's event; concurrent copies take different areas. An
// area is small enough (32 MiB by default) to stay in the CPU's caches, which is
// what makes staging fast (copy/host_copy.h).
//
// Locking: the Lender's mutex (core/lender.h) guards which areas are free and
// each area's `pending`; it is never held across a CUDA call (areas and their
// events are created, and pending work is waited for, outside it).
#pragma once

#include <memory>

#include "copy/staging_plan.h"
#include "core/lender.h"
#include "cuda/staging_area.h"

namespace ferry {
class Pool;
}

namespace ferry::cuda {

struct PooledArea : StagingArea {
  using StagingArea::StagingArea;
  // An async copy left DMAs in flight (their slots' events say which); others
  // prefer an area without.
  bool pending = false;  // the lender's lock
};

class AreaPool {
 public:
  // Areas come from `memory` (a pinned pool), at most `max_areas` at once.
  AreaPool(Pool& memory, StagingGeometry geometry, int max_areas);
  ~AreaPool();  // the device's work on the areas must be over (the engine synchronizes first)
  AreaPool(const AreaPool&) = delete;
  AreaPool& operator=(const AreaPool&) = delete;

  // An area for one copy: a free one without pending DMAs if any, else a new
  // one while fewer than max_areas exist, else a free one with pending DMAs,
  // else waits until one is given back. Throws if a new area cannot be made.
  PooledArea* acquire();
  // pending: DMAs of the copy may still use the area.
  void release(PooledArea* area, bool pending) noexcept;

  const StagingGeometry& geometry() const { return geometry_; }

 private:
  Pool& memory_;
  const StagingGeometry geometry_;
  Lender<PooledArea> lent_;
};

}  // namespace ferry::cuda
