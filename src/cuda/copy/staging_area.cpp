// staging_area.cpp — areas of pinned staging memory with per-slot events.
#include "cuda/copy/staging_area.h"

#include <algorithm>

#include "cuda/cuda_check.h"
#include "pool/pool.h"

namespace ferry::cuda {

AreaPool::AreaPool(Pool& memory, StagingGeometry geometry, int max_areas)
    : memory_(memory), geometry_(geometry), lent_(max_areas) {}

AreaPool::~AreaPool() {
  for (auto& a : lent_.all_unlocked()) {
    for (cudaEvent_t e : a->slot_done) {
      cudaEventSynchronize(e);  // an async copy's DMA may still read the slot
      cudaEventDestroy(e);
    }
    memory_.deallocate(a->base);
  }
  cudaGetLastError();
}

std::unique_ptr<StagingArea> AreaPool::make_area() {
  auto a = std::make_unique<StagingArea>();
  a->geometry = geometry_;
  a->base = static_cast<unsigned char*>(memory_.allocate(a->bytes(), 4096, HugeWant::yes));
  a->slot_done.assign(geometry_.slots, nullptr);
  try {
    for (auto& e : a->slot_done) check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  } catch (...) {
    for (cudaEvent_t e : a->slot_done)
      if (e) cudaEventDestroy(e);
    memory_.deallocate(a->base);
    throw;
  }
  return a;
}

StagingArea* AreaPool::acquire() {
  // An area whose DMAs are over first; a new one next; else the longest-free
  // one: its slots' events hold back whatever still uses it.
  return &lent_.acquire([&] { return make_area(); }, [](const StagingArea& a) { return !a.pending; });
}

void AreaPool::release(StagingArea* area, bool pending) noexcept {
  lent_.release(*area, [pending](StagingArea& a) { a.pending = pending; });
}

}  // namespace ferry::cuda
