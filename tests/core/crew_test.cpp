// crew_test.cpp — every piece of every job runs exactly once, whatever the
// number of workers (none too), however pieces are published, with several
// posters at once; retire() returns only when no worker touches the job.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "core/crew.h"

namespace ferry {
namespace {

struct Counting {
  std::unique_ptr<std::atomic<int>[]> runs;
  std::atomic<int> inside{0};
  explicit Counting(uint32_t n) : runs(new std::atomic<int>[n]) {
    for (uint32_t i = 0; i < n; ++i) runs[i] = 0;
  }
  static void run(void* c, uint32_t i) noexcept {
    auto& self = *static_cast<Counting*>(c);
    self.inside.fetch_add(1);
    self.runs[i].fetch_add(1);
    volatile int spin = 0;
    for (int k = 0; k < 200; ++k) spin = spin + k;  // a little work, so threads overlap
    self.inside.fetch_sub(1);
  }
};

// Publishes a job in random steps while helping, like the eager copy's caller.
void run_job(Crew& crew, uint32_t pieces, uint64_t seed) {
  Counting c(pieces);
  CrewJob job(&Counting::run, &c, pieces);
  std::mt19937_64 rng(seed);
  uint32_t published = pieces ? static_cast<uint32_t>(rng() % (pieces + 1)) : 0;
  crew.post(job, published);
  while (published < pieces) {
    published = std::min<uint32_t>(pieces, published + 1 + static_cast<uint32_t>(rng() % 8));
    crew.publish(job, published);
    job.work_one();
  }
  job.work();
  // Every piece is taken; wait until every one ran (workers may still be in one).
  for (uint32_t i = 0; i < pieces; ++i)
    while (c.runs[i].load() == 0) std::this_thread::yield();
  crew.retire(job);
  EXPECT_EQ(c.inside.load(), 0) << "a worker still ran a piece after retire()";
  for (uint32_t i = 0; i < pieces; ++i) ASSERT_EQ(c.runs[i].load(), 1) << "piece " << i;
}

TEST(Crew, EveryPieceRunsOnceWithAnyNumberOfWorkers) {
  for (int threads : {0, 1, 3, 8}) {
    for (int spin_us : {0, 50}) {
      Crew crew(threads, spin_us);
      for (uint32_t pieces : {0u, 1u, 2u, 17u, 1000u}) run_job(crew, pieces, pieces * 31 + threads);
    }
  }
}

TEST(Crew, SeveralPostersShareTheCrew) {
  Crew crew(4, 20);
  std::vector<std::thread> posters;
  for (int t = 0; t < 6; ++t)
    posters.emplace_back([&, t] {
      for (int round = 0; round < 40; ++round) run_job(crew, 1 + (round * 7 + t) % 300, t * 1000 + round);
    });
  for (auto& p : posters) p.join();
}

TEST(Crew, RetireWithoutRunningTheRestLeavesUntakenPieces) {
  // An error path: the poster stops publishing and retires; pieces never
  // published are never run, and nothing runs after retire() returns.
  Crew crew(3, 10);
  Counting c(100);
  CrewJob job(&Counting::run, &c, 100);
  crew.post(job, 40);
  job.work();
  crew.retire(job);
  int ran = 0;
  for (int i = 0; i < 100; ++i) ran += c.runs[i].load();
  EXPECT_EQ(ran, 40);
  for (int i = 40; i < 100; ++i) EXPECT_EQ(c.runs[i].load(), 0);
  EXPECT_EQ(c.inside.load(), 0);
}

TEST(Crew, SleepingWorkersWakeForNewWork) {
  Crew crew(2, 0);  // no spin: workers sleep at once
  for (int round = 0; round < 50; ++round) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    Counting c(64);
    CrewJob job(&Counting::run, &c, 64);
    crew.post(job, 64);
    // Do not help: the workers alone must finish it.
    for (int i = 0; i < 64; ++i)
      while (c.runs[i].load() == 0) std::this_thread::yield();
    crew.retire(job);
  }
}

}  // namespace
}  // namespace ferry
