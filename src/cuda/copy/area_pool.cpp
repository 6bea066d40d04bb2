// area_pool.cpp — the engine's staging areas, lent one per eager copy.
#include "cuda/copy/area_pool.h"

namespace ferry::cuda {

AreaPool::AreaPool(Pool& memory, StagingGeometry geometry, int max_areas)
    : memory_(memory), geometry_(geometry), lent_(max_areas) {}

AreaPool::~AreaPool() = default;  // each area waits for its slots' last DMAs (staging_area.h)

PooledArea* AreaPool::acquire() {
  // An area whose DMAs are over first; a new one next (its CUDA calls run
  // outside the lender's lock); else the longest-free one: its slots' events
  // hold back whatever still uses it.
  return &lent_.acquire([&] { return std::make_unique<PooledArea>(memory_, geometry_, SlotWait::poll); },
                        [](const PooledArea& a) { return !a.pending; });
}

void AreaPool::release(PooledArea* area, bool pending) noexcept {
  lent_.release(*area, [pending](PooledArea& a) { a.pending = pending; });
}

}  // namespace ferry::cuda
