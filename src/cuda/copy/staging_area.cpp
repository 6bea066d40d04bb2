// staging_area.cpp — areas of pinned staging memory with per-slot events.
#include "cuda/copy/staging_area.h"

#include <algorithm>

#include "cuda/cuda_check.h"
#include "pool/pool.h"

namespace ferry::cuda {

AreaPool::AreaPool(Pool& memory, StagingGeometry geometry, int max_areas)
    : memory_(memory), geometry_(geometry), max_areas_(std::max(1, max_areas)) {}

AreaPool::~AreaPool() {
  for (auto& a : all_) {
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
  std::unique_lock lock(mu_);
  for (;;) {
    auto idle = std::find_if(free_.begin(), free_.end(), [](StagingArea* a) { return !a->pending; });
    if (idle != free_.end()) {
      StagingArea* a = *idle;
      free_.erase(idle);
      return a;
    }
    if (count_ < max_areas_) {
      ++count_;
      lock.unlock();
      std::unique_ptr<StagingArea> made;
      try {
        made = make_area();
      } catch (...) {
        lock.lock();
        --count_;
        throw;
      }
      lock.lock();
      all_.push_back(std::move(made));
      return all_.back().get();
    }
    if (!free_.empty()) {  // its slots' events hold back whatever still uses it
      StagingArea* a = free_.front();
      free_.erase(free_.begin());
      return a;
    }
    returned_.wait(lock);
  }
}

void AreaPool::release(StagingArea* area, bool pending) noexcept {
  {
    std::lock_guard lock(mu_);
    area->pending = pending;
    free_.push_back(area);
  }
  returned_.notify_one();
}

}  // namespace ferry::cuda
