// copy_state.cpp — a copy's shared state and the Completion that waits on it.
#include "cuda/copy/copy_state.h"

#include <cuda_runtime_api.h>

#include "core/error.h"
#include "cuda/cuda_check.h"

namespace ferry::cuda {

CopyState::~CopyState() {
  if (done && !forked()) cudaEventDestroy(done);  // no CUDA call in a forked child
}

std::shared_ptr<CopyState> begin_copy(Strategy s, size_t bytes) {
  auto st = std::make_shared<CopyState>();
  st->strategy = s;
  st->bytes = bytes;
  check(cudaEventCreateWithFlags(&st->done, cudaEventDisableTiming), "cudaEventCreate");
  return st;
}

void Completion::wait() {
  if (!state_) throw InvalidArgument("wait() on an empty Completion");
  if (state_->forked()) throw NotSupported(forked_child_message("this ferry copy"));
  for (auto& part : state_->parts) {
    try {
      part.wait();
    } catch (...) {
      state_->fail(std::current_exception());
    }
  }
  try {
    state_->host_tasks.wait();
  } catch (...) {
    state_->fail(std::current_exception());
  }
  cudaError_t err = cudaEventSynchronize(state_->done);
  if (err != cudaSuccess) {
    try {
      check(err, "cudaEventSynchronize (copy completion)");
    } catch (...) {
      state_->fail(std::current_exception());
    }
  }
  int64_t expected = -1;
  state_->finished_ns.compare_exchange_strong(
      expected, std::chrono::duration_cast<std::chrono::nanoseconds>(CopyState::Clock::now() - state_->started).count());
  std::lock_guard lock(state_->mu);
  if (state_->error) std::rethrow_exception(state_->error);
}

bool Completion::query() {
  if (!state_) throw InvalidArgument("query() on an empty Completion");
  if (state_->forked()) throw NotSupported(forked_child_message("this ferry copy"));
  for (auto& part : state_->parts)
    if (!part.query()) return false;
  if (!state_->host_tasks.finished()) return false;
  cudaError_t err = cudaEventQuery(state_->done);
  if (err == cudaErrorNotReady) return false;
  wait();  // done (or failed): settle the error and the time
  return true;
}

cudaEvent_t Completion::event() const { return state_ ? state_->done : nullptr; }
Strategy Completion::strategy() const { return state_ ? state_->strategy : Strategy::automatic; }
size_t Completion::bytes() const { return state_ ? state_->bytes : 0; }
double Completion::seconds() const {
  if (!state_ || state_->finished_ns < 0) return -1;
  return state_->finished_ns / 1e9;
}

}  // namespace ferry::cuda
