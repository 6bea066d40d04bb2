// worker_pool_test.cpp — tasks all run, errors reach the waiter, destruction drains.
#include "core/worker_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>

namespace ferry {
namespace {

TEST(WorkerPool, RunsEveryTaskAndWaitReturnsAfterAll) {
  WorkerPool pool(4);
  std::atomic<long> sum{0};
  TaskGroup group(1000);
  for (int i = 1; i <= 1000; ++i)
    pool.submit([&, i] {
      sum += i;
      group.done();
    });
  group.wait();
  EXPECT_EQ(sum.load(), 500500);
  EXPECT_TRUE(group.finished());
}

TEST(WorkerPool, FirstErrorIsRethrownAfterEveryTaskFinished) {
  WorkerPool pool(3);
  std::atomic<int> ran{0};
  TaskGroup group(10);
  for (int i = 0; i < 10; ++i)
    pool.submit([&, i] {
      ++ran;
      group.done(i == 4 ? std::make_exception_ptr(std::runtime_error("task 4 failed")) : nullptr);
    });
  EXPECT_THROW(group.wait(), std::runtime_error);
  EXPECT_EQ(ran.load(), 10);
  EXPECT_TRUE(group.failed());
}

TEST(WorkerPool, DestructorRunsQueuedTasks) {
  std::atomic<int> ran{0};
  {
    WorkerPool pool(1);
    for (int i = 0; i < 50; ++i) pool.submit([&] { ++ran; });
  }
  EXPECT_EQ(ran.load(), 50);
}

}  // namespace
}  // namespace ferry
