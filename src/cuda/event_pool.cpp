// event_pool.cpp — reused CUDA events.
#include "cuda/event_pool.h"

#include "cuda/cuda_check.h"

namespace ferry::cuda {

EventPool::~EventPool() {
  for (cudaEvent_t e : free_) cudaEventDestroy(e);
  cudaGetLastError();
}

cudaEvent_t EventPool::take() {
  {
    std::lock_guard lock(mu_);
    if (!free_.empty()) {
      cudaEvent_t e = free_.back();
      free_.pop_back();
      return e;
    }
  }
  cudaEvent_t e = nullptr;
  check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  return e;
}

void EventPool::give(cudaEvent_t e) noexcept {
  std::lock_guard lock(mu_);
  try {
    free_.push_back(e);
  } catch (...) {  // no memory for the list: let the event go
    cudaEventDestroy(e);
  }
}

}  // namespace ferry::cuda
