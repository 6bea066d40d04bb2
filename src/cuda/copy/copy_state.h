// copy_state.h — the state one copy (or batch) shares between the caller's
// Completion and the engine's threads: its event, its worker tasks, its first
// error and the parts a batch or a pin-in-place copy waits on.
//
// Lifecycle: the engine makes it (begin_copy), records `done` once every DMA
// of the copy is enqueued, and hands it to a Completion; worker and pinner
// tasks hold a shared_ptr until they finish. `abort` only ever goes false ->
// true: once set, no task of the copy touches the caller's buffers again.
//
// Locking: CopyState::mu guards `error` only; it is a leaf and no CUDA call
// runs under it. `parts` is written by the one thread that builds the copy,
// before the Completion is returned, and read only after.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <vector>

#include "core/fork.h"
#include "core/worker_pool.h"
#include "cuda/copy/copy_engine.h"

namespace ferry::cuda {

struct CopyState {
  using Clock = std::chrono::steady_clock;
  Strategy strategy = Strategy::automatic;
  size_t bytes = 0;
  Clock::time_point started = Clock::now();
  std::atomic<int64_t> finished_ns{-1};  // since `started`, set by the first wait/query that sees it done
  cudaEvent_t done = nullptr;            // recorded after the whole copy
  TaskGroup host_tasks;                  // worker tasks of this copy
  std::atomic<bool> abort{false};
  std::mutex mu;
  std::exception_ptr error;              // mu
  std::vector<Completion> parts;         // a batch's pageable copies; set before it is returned
  const uint64_t generation = fork_generation();

  bool forked() const noexcept { return generation != fork_generation(); }
  void fail(std::exception_ptr e) noexcept {
    std::lock_guard lock(mu);
    if (!error) error = e;
    abort = true;
  }
  ~CopyState();
};

// A new copy's state with its completion event (a CUDA call: throws CudaError).
// Preconditions: the engine's device is current.
std::shared_ptr<CopyState> begin_copy(Strategy s, size_t bytes);

}  // namespace ferry::cuda
