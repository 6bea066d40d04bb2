// worker_pool.h — persistent threads that run submitted tasks in FIFO order,
// and TaskGroup, a countdown a submitter waits on that keeps the first error.
//
// The copy engine keeps one WorkerPool for its whole life: spawning threads per
// copy costs tens of microseconds each and was the naive staged copy's weakness.
// Locking: one mutex guards the queue; tasks run without it.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ferry {

class WorkerPool {
 public:
  explicit WorkerPool(int threads);
  ~WorkerPool();  // runs what is queued, then joins
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  void submit(std::function<void()> task);
  int size() const noexcept { return static_cast<int>(threads_.size()); }

 private:
  void run();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  bool stopping_ = false;                    // guarded by mu_
  std::vector<std::thread> threads_;
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
