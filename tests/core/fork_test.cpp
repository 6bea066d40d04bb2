// fork_test.cpp — what a pool (and the worker pool) does across fork(), each
// case in a forked child (gdrcopy_sanity style): an inherited pool refuses
// every call with a clear error, its destruction neither joins threads that
// do not exist nor hangs, a pool the child creates works, and the parent's
// pool is unaffected. Before: 8 of 10 children of a pool with a background
// thread hung at exit, and a child creating its own pool died of SIGABRT.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../common/child.h"
#include "../common/fresh_process.h"
#include "copy/copy_crew.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/fork.h"
#include "core/worker_pool.h"
#include "pool/pool.h"

namespace ferry {
namespace {

constexpr size_t MiB = size_t{1} << 20;
using Say = std::function<void(const std::string&)>;

PoolOptions small_pool(int64_t release_delay_ms = 0) {
  PoolOptions o;
  o.chunk_bytes = 2 * MiB;
  o.touch_threads = 1;
  o.huge_pages = HugePolicy::off;
  o.release_delay_ms = release_delay_ms;
  return o;
}

// A call on an inherited pool must throw NotSupported that says "fork".
template <class F>
bool refuses(F&& call, const char* what, const Say& say) {
  try {
    call();
  } catch (const NotSupported& e) {
    if (std::string(e.what()).find("fork") != std::string::npos) return true;
    say(std::string(what) + ": unclear message: " + e.what());
    return false;
  } catch (const std::exception& e) {
    say(std::string(what) + ": wrong error: " + e.what());
    return false;
  }
  say(std::string(what) + ": accepted in the child");
  return false;
}

std::vector<unsigned char> random_bytes(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

// The child's checks of a pool it inherited: every call refused, free a no-op,
// the memory still its own copy, destruction returns.
int check_inherited(std::unique_ptr<Pool>& pool, void* p, const std::vector<unsigned char>& data, const Say& say) {
  int bad = 0;
  bad += !refuses([&] { pool->allocate(100); }, "allocate", say);
  bad += !refuses([&] { pool->trim(); }, "trim", say);
  bad += !refuses([&] { pool->stats(); }, "stats", say);
  bad += !refuses([&] { pool->wait_ready(); }, "wait_ready", say);
  if (std::memcmp(p, data.data(), data.size()) != 0) {
    say("the child's copy of an allocation differs");
    ++bad;
  }
  std::memset(p, 0xee, data.size());  // the child's copy: the parent must not see it
  pool->deallocate(p);                 // a no-op, never an exception
  pool.reset();                        // no join, no hang
  return bad;
}

TEST(Fork, InheritedPoolWithReleaserRefusesAndTheChildExits) {
  FERRYTEST_SKIP_IF_ASAN_FORK();
  auto pool = std::make_unique<Pool>(small_pool(50));
  const auto data = random_bytes(3 * MiB + 5, 1);
  void* p = pool->allocate(data.size());
  std::memcpy(p, data.data(), data.size());
  for (int round = 0; round < 10; ++round) {  // 8 of 10 such children hung before
    const ferrytest::ChildEnd end =
        ferrytest::run_in_child([&](const Say& say) { return check_inherited(pool, p, data, say); });
    ASSERT_TRUE(end.clean()) << "round " << round << ": " << end.describe();
  }
  // The parent is unaffected: its data, its accounting, its releaser.
  EXPECT_EQ(std::memcmp(p, data.data(), data.size()), 0);
  EXPECT_EQ(pool->stats().kind[1].in_use.current, data.size() + 251);  // rounded to 256
  pool->deallocate(p);
  void* q = pool->allocate(MiB);
  pool->deallocate(q);
  for (int i = 0; i < 400 && pool->stats().chunk_releases == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_GT(pool->stats().chunk_releases, 0u) << "the parent's releaser stopped";
}

TEST(Fork, InheritedPoolWithATargetPipelineRefusesAndTheChildExits) {
  FERRYTEST_SKIP_IF_ASAN_FORK();
  PoolOptions o = small_pool();
  o.target_bytes = 16 * MiB;
  auto pool = std::make_unique<Pool>(o);  // the toucher and registrar may be running at the fork
  const auto data = random_bytes(4096, 2);
  void* p = pool->allocate(data.size(), 256, HugeWant::no);
  std::memcpy(p, data.data(), data.size());
  const ferrytest::ChildEnd end =
      ferrytest::run_in_child([&](const Say& say) { return check_inherited(pool, p, data, say); });
  EXPECT_TRUE(end.clean()) << end.describe();
  pool->wait_ready();
  EXPECT_GE(pool->stats().kind[1].reserved.current, 16 * MiB);
  EXPECT_EQ(std::memcmp(p, data.data(), data.size()), 0);
  pool->deallocate(p);
}

// The flaky case above, made certain (issue 21, item 10): the target chunk is
// in before the fork, so the target pipeline's thread has finished. A finished
// thread that nobody joined was inherited by the child, and ThreadSanitizer
// ended the child with "thread leak" (exit 66) in 2 of 30 runs, when the fork
// came after the target. The pool leaves no finished thread behind.
TEST(Fork, APoolWhoseTargetIsInLeavesNoFinishedThreadToTheChild) {
  FERRYTEST_SKIP_IF_ASAN_FORK();
  for (int round = 0; round < 3; ++round) {
    PoolOptions o = small_pool();
    o.target_bytes = 4 * MiB;
    auto pool = std::make_unique<Pool>(o);
    pool->wait_ready();  // the target worker has done its work
    const auto data = random_bytes(4096, 10 + round);
    void* p = pool->allocate(data.size(), 256, HugeWant::no);
    std::memcpy(p, data.data(), data.size());
    const ferrytest::ChildEnd end =
        ferrytest::run_in_child([&](const Say& say) { return check_inherited(pool, p, data, say); });
    ASSERT_TRUE(end.clean()) << "round " << round << ": " << end.describe();
    pool->deallocate(p);
  }
}

TEST(Fork, TheChildCreatesAndUsesItsOwnPool) {
  FERRYTEST_SKIP_IF_ASAN_FORK();
  FERRYTEST_SKIP_IF_TSAN_CHILD_THREADS();
  auto inherited = std::make_unique<Pool>(small_pool(20));
  void* kept = inherited->allocate(1000);
  const ferrytest::ChildEnd end = ferrytest::run_in_child([&](const Say& say) {
    Pool own(small_pool(20));
    const auto data = random_bytes(5 * MiB + 3, 3);
    void* p = own.allocate(data.size());
    std::memcpy(p, data.data(), data.size());
    int bad = std::memcmp(p, data.data(), data.size()) != 0;
    own.deallocate(p);
    set_fault_injection("mmap:0");  // the fault state's lock was held across the fork
    try {
      own.allocate(64 * MiB);
      say("the injected mmap failure did not surface");
      ++bad;
    } catch (const OsError&) {
    }
    set_fault_injection("");
    own.trim();
    if (own.stats().kind[0].in_use.current + own.stats().kind[1].in_use.current != 0) {
      say("the child's pool does not account to zero");
      ++bad;
    }
    inherited.reset();
    return bad;
  });
  EXPECT_TRUE(end.clean()) << end.describe();
  inherited->deallocate(kept);
}

TEST(Fork, ForkWhileOtherThreadsUseThePool) {
  FERRYTEST_SKIP_IF_ASAN_FORK();
  FERRYTEST_SKIP_IF_TSAN_CHILD_THREADS();
  // Threads inside the pool (its lock held, chunks half mapped) at the fork:
  // the child still refuses cleanly and can make a pool of its own.
  Pool pool(small_pool(1));
  std::atomic<bool> stop{false};
  std::vector<std::thread> users;
  for (int t = 0; t < 3; ++t)
    users.emplace_back([&, t] {
      std::mt19937 rng(t);
      while (!stop.load()) {
        void* a = pool.allocate(1 + rng() % (3 * MiB));
        pool.deallocate(a);
        if (rng() % 8 == 0) pool.trim();
      }
    });
  std::string failure;  // asserted after the threads are joined
  for (int round = 0; round < 20 && failure.empty(); ++round) {
    const ferrytest::ChildEnd end = ferrytest::run_in_child([&](const Say& say) {
      int bad = !refuses([&] { pool.allocate(10); }, "allocate", say);
      Pool own(small_pool());
      own.deallocate(own.allocate(3 * MiB));
      return bad;
    });
    if (!end.clean()) failure = "round " + std::to_string(round) + ": " + end.describe();
  }
  stop = true;
  for (auto& t : users) t.join();
  ASSERT_TRUE(failure.empty()) << failure;
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.kind[0].in_use.current + s.kind[1].in_use.current, 0u);
  EXPECT_EQ(s.allocations, s.frees);
}

// A thread's first call into ferry racing a fork() in another thread: the
// child's own first call must not hang. Each try is a fresh process, since
// first use happens once per process. Registering the fault state's and the
// crews' locks on first use (in a function-local static) made this hang: the
// thread inside that initializer waited for the fork registry, which the
// forking thread held across fork(), and the child inherited the
// initialization "in progress" (Fork.ForkWhileOtherThreadsUseThePool hung
// that way in CI). They are registered at load now (core/fork.h).
TEST(Fork, FirstUseRacingForkInAnotherThreadLeavesTheChildWorking) {
  FERRYTEST_SKIP_IF_ASAN_FORK();
  FERRYTEST_SKIP_IF_TSAN_CHILD_THREADS();
  constexpr const char* kTry = "FERRYTEST_FIRST_USE_TRY";
  if (std::getenv(kTry)) {  // the fresh process: one race
    std::atomic<bool> go{false};
    std::thread first([&] {
      while (!go.load()) {
      }
      (void)fault_injected(FaultPoint::mmap);
      (void)copy_crew();
    });
    go = true;
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::alarm(10);  // a hang ends as SIGALRM
      (void)fault_injected(FaultPoint::mmap);
      (void)copy_crew();
      ::_exit(0);
    }
    first.join();
    int status = 0;
    ::waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "the child " << (WIFSIGNALED(status) ? "hung (ended by signal " + std::to_string(WTERMSIG(status)) + ")"
                                                 : "failed");
    return;
  }
  for (int i = 0; i < 60; ++i) {
    const auto [status, out] = ferrytest::run_test_fresh(kTry, std::to_string(i));
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "try " << i << ":\n" << out;
  }
}

TEST(Fork, InheritedWorkerPoolIsAbandonedNotJoined) {
  auto workers = std::make_unique<WorkerPool>(4);
  TaskGroup group(8);
  std::atomic<int> ran{0};
  for (int i = 0; i < 8; ++i) workers->submit([&] {
      ++ran;
      group.done();
    });
  group.wait();
  const ferrytest::ChildEnd end = ferrytest::run_in_child([&](const Say&) {
    workers.reset();  // its threads are the parent's: joining them hung
    return 0;
  });
  EXPECT_TRUE(end.clean()) << end.describe();
  EXPECT_EQ(ran.load(), 8);
  workers.reset();
}

TEST(Fork, GenerationGrowsInTheChildOnly) {
  const uint64_t before = fork_generation();
  const ferrytest::ChildEnd end =
      ferrytest::run_in_child([&](const Say& say) {
        if (fork_generation() == before + 1) return 0;
        say("child generation " + std::to_string(fork_generation()));
        return 1;
      });
  EXPECT_TRUE(end.clean()) << end.describe();
  EXPECT_EQ(fork_generation(), before);
}

}  // namespace
}  // namespace ferry
