// staging_area.h — pinned memory for eager staged copies (cuda/copy/eager_copy.h):
// an area is `slots` chunks of pinned memory, each with the event of the last
// DMA that read or wrote it, and a copy holds one area for its whole run.
//
// Why areas rather than one shared ring: a copy stages its chunks in order and
// frees them in order, so one copy per area needs no bookkeeping between
// copies beyond each slot's event; concurrent copies take different areas. An
// area is small enough (32 MiB by default) to stay in the CPU's caches, which is
// what makes staging fast (copy/host_copy.h).
//
// A slot may be written (by the CPU for host->device, by a DMA for
// device->host) only once its event is complete: the event says the last DMA
// that used the slot, possibly of an earlier copy on another stream, is over.
//
// Locking: the Lender's mutex (core/lender.h) guards which areas are free and
// each area's `pending`; it is never held across a CUDA call (areas and their
// events are created, and pending work is waited for, outside it).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "copy/staging_plan.h"
#include "core/lender.h"

namespace ferry {
class Pool;
}

namespace ferry::cuda {

struct StagingArea {
  unsigned char* base = nullptr;
  StagingGeometry geometry;             // chunk_bytes and slots; piece_bytes is per copy
  std::vector<cudaEvent_t> slot_done;   // one per slot: the last DMA that used it
  // An async copy left DMAs in flight (their slots' events say which); others
  // prefer an area without.
  bool pending = false;                 // AreaPool::lent_'s lock
  size_t bytes() const { return geometry.chunk_bytes * geometry.slots; }
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
  StagingArea* acquire();
  // pending: DMAs of the copy may still use the area.
  void release(StagingArea* area, bool pending) noexcept;

  const StagingGeometry& geometry() const { return geometry_; }

 private:
  std::unique_ptr<StagingArea> make_area();  // CUDA calls: outside the lender's lock

  Pool& memory_;
  const StagingGeometry geometry_;
  Lender<StagingArea> lent_;
};

}  // namespace ferry::cuda
