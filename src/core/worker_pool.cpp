// worker_pool.cpp — FIFO thread pool and TaskGroup.
#include "core/worker_pool.h"

#include "core/fork.h"

namespace ferry {

WorkerPool::WorkerPool(int threads, ThreadAffinity affinity)
    : state_(std::make_unique<State>()), size_(threads < 1 ? 1 : threads), generation_(fork_generation()) {
  state_->affinity = std::move(affinity);
  state_->threads.reserve(size_);
  for (int i = 0; i < size_; ++i)
    state_->threads.emplace_back([s = state_.get()] {
      s->affinity.apply();
      run(*s);
    });
}

WorkerPool::~WorkerPool() {
  if (generation_ != fork_generation()) {
    abandon_in_child(state_);
    return;
  }
  {
    std::lock_guard lock(state_->mu);
    state_->stopping = true;
  }
  state_->cv.notify_all();
  for (auto& t : state_->threads) t.join();
}

void WorkerPool::submit(std::function<void()> task) {
  {
    std::lock_guard lock(state_->mu);
    state_->queue.push_back(std::move(task));
  }
  state_->cv.notify_one();
}

void WorkerPool::run(State& s) {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(s.mu);
      s.cv.wait(lock, [&] { return s.stopping || !s.queue.empty(); });
      if (s.queue.empty()) return;  // stopping and drained
      task = std::move(s.queue.front());
      s.queue.pop_front();
    }
    task();  // tasks report their own errors (TaskGroup); they must not throw
  }
}

void TaskGroup::add(size_t n) {
  std::lock_guard lock(mu_);
  pending_ += n;
}

void TaskGroup::done(std::exception_ptr error) noexcept {
  std::lock_guard lock(mu_);
  if (error && !error_) error_ = error;
  if (--pending_ == 0) cv_.notify_all();
}

void TaskGroup::wait() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return pending_ == 0; });
  if (error_) std::rethrow_exception(error_);
}

bool TaskGroup::finished() {
  std::lock_guard lock(mu_);
  return pending_ == 0;
}

bool TaskGroup::failed() {
  std::lock_guard lock(mu_);
  return error_ != nullptr;
}

}  // namespace ferry
