// staging_area.cpp — a ring of pinned slots with an event each.
#include "cuda/staging_area.h"

#include "cuda/cuda_check.h"
#include "pool/pool.h"

namespace ferry::cuda {

StagingArea::StagingArea(Pool& memory, const StagingGeometry& geometry, SlotWait wait)
    : memory_(memory), geometry_(geometry) {
  const unsigned flags = cudaEventDisableTiming | (wait == SlotWait::sleep ? cudaEventBlockingSync : 0);
  base_ = static_cast<unsigned char*>(memory_.allocate(bytes(), 4096, HugeWant::yes));
  try {
    slot_done_.reserve(geometry_.slots);
    for (uint32_t i = 0; i < geometry_.slots; ++i) {
      cudaEvent_t e = nullptr;
      check(cudaEventCreateWithFlags(&e, flags), "cudaEventCreate (staging slot)");
      slot_done_.push_back(e);
    }
  } catch (...) {
    release();
    throw;
  }
}

StagingArea::~StagingArea() { release(); }

void StagingArea::release() noexcept {
  for (cudaEvent_t e : slot_done_) {
    cudaEventSynchronize(e);  // an async copy's DMA may still use the slot
    cudaEventDestroy(e);
  }
  slot_done_.clear();
  try {
    if (base_) memory_.deallocate(base_);
  } catch (...) {  // cannot happen: the pool handed out base_
  }
  base_ = nullptr;
  cudaGetLastError();
}

}  // namespace ferry::cuda
