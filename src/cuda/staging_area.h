// staging_area.h — the one ring of pinned staging slots: `slots` slots of
// `chunk_bytes` each, contiguous in one allocation of a pinned pool, each with
// the event of the last DMA that read or wrote it. A slot may be written (by
// the CPU, or by a DMA into it) only once its event is complete: the slot
// ring's "in flight until it lands" (core/slot_ring.h, where every ring's
// states are written down).
//
// Two users, one shape:
//   - the copy engine lends an area to each eager staged copy (copy/area_pool.h,
//     copy/eager_copy.h): 2 MiB slots, small enough to stay in the CPU's caches;
//   - the loader holds one area for its reads (load/file_loader.h): 16 MiB
//     slots, one pread each.
// They differ only in how a thread waits for a slot (SlotWait): the eager copy
// polls its events for latency; the loader's reader threads sleep on them,
// since spinning would take the cores that pread needs.
//
// Not thread-safe by itself: its owner decides who uses which slot.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "copy/staging_plan.h"

namespace ferry {
class Pool;
}

namespace ferry::cuda {

enum class SlotWait {
  poll,   // cudaEventQuery in a loop (and cudaEventSynchronize spins): the eager copy
  sleep,  // cudaEventBlockingSync: cudaEventSynchronize sleeps; the loader's readers
};

class StagingArea {
 public:
  // Allocates the slots from `memory` (4 KiB aligned, huge pages wanted) and
  // creates their events; the current device must be the pool's. Throws, with
  // nothing left allocated, when either fails.
  StagingArea(Pool& memory, const StagingGeometry& geometry, SlotWait wait);
  // Waits for every slot's last DMA, then destroys the events and gives the
  // memory back. The current device must be the pool's.
  ~StagingArea();
  StagingArea(const StagingArea&) = delete;
  StagingArea& operator=(const StagingArea&) = delete;

  unsigned char* base() const { return base_; }
  unsigned char* slot(size_t i) const { return base_ + i * geometry_.chunk_bytes; }
  // chunk_bytes and slots; piece_bytes is per copy.
  const StagingGeometry& geometry() const { return geometry_; }
  size_t bytes() const { return geometry_.chunk_bytes * geometry_.slots; }
  // Slot i's event: the last DMA that used it.
  cudaEvent_t slot_done(size_t i) const { return slot_done_[i]; }

 private:
  void release() noexcept;  // the destructor's work, also for a failed constructor

  Pool& memory_;
  const StagingGeometry geometry_;
  unsigned char* base_ = nullptr;
  std::vector<cudaEvent_t> slot_done_;
};

}  // namespace ferry::cuda
