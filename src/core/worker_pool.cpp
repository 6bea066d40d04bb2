// worker_pool.cpp — FIFO thread pool and TaskGroup.
#include "core/worker_pool.h"

namespace ferry {

WorkerPool::WorkerPool(int threads) {
  if (threads < 1) threads = 1;
  threads_.reserve(threads);
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void WorkerPool::submit(std::function<void()> task) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void WorkerPool::run() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
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
