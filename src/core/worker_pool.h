// worker_pool.h — persistent threads that run submitted tasks in FIFO order,
// and TaskGroup, a countdown a submitter waits on that keeps the first error.
//
// The copy engine keeps one WorkerPool for its whole life: spawning threads per
// copy costs tens of microseconds each and was the naive staged copy's weakness.
// Locking: one mutex guards the queue; tasks run without it.
// fork(): in a forked child the workers do not exist; ~WorkerPool there
// abandons the queue instead of joining them (core/fork.h).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/thread_affinity.h"

namespace ferry {

class WorkerPool {
 public:
  // Each thread applies `affinity` as it starts.
  explicit WorkerPool(int threads, ThreadAffinity affinity = {});
  ~WorkerPool();  // runs what is queued, then joins
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  void submit(std::function<void()> task);
  int size() const noexcept { return size_; }

 private:
  // On the heap so that a forked child can abandon it whole: destroying a
  // condition variable the parent's workers waited on hangs there.
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> queue;  // guarded by mu
    bool stopping = false;                    // guarded by mu
    std::vector<std::thread> threads;
    ThreadAffinity affinity;  // read-only once the threads start
  };
  static void run(State& s);
  std::unique_ptr<State> state_;
  int size_ = 0;
  uint64_t generation_ = 0;  // fork_generation() at creation
};

// Counts outstanding tasks; wait() blocks until all called done() and rethrows
// the first error any of them reported.
class TaskGroup {
 public:
  explicit TaskGroup(size_t count = 0) : pending_(count) {}
  void add(size_t n);
  void done(std::exception_ptr error = nullptr) noexcept;
  void wait();
  bool finished();
  bool failed();  // an error was reported (tasks may still be running)

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  size_t pending_;              // guarded by mu_
  std::exception_ptr error_;    // guarded by mu_
};

}  // namespace ferry
