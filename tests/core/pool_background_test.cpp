// pool_background_test.cpp — the pool's background threads: the throttled
// releaser (delay, capped batches, never on the free path, keeps the target)
// and the target pipeline (reserve+touch chunk i+1 while chunk i registers,
// allocations wait for it, wait_ready, errors, limit, early destruction).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "core/error.h"
#include "pool/pool.h"
#include "pool/stats.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
constexpr size_t MiB = size_t{1} << 20;

// Records hook calls with their time and thread; on_chunk_ready sleeps
// `register_delay` (a driver registering memory) and may throw on one call.
class SlowHooks : public ChunkHooks {
 public:
  explicit SlowHooks(std::chrono::milliseconds register_delay = 0ms, int throw_on_call = -1)
      : delay_(register_delay), throw_on_call_(throw_on_call) {}

  void on_chunk_ready(void* base, size_t bytes) override {
    std::this_thread::sleep_for(delay_);
    std::lock_guard lock(mu_);
    const int n = ready_calls_++;
    ready_threads_.insert(std::this_thread::get_id());
    if (n == throw_on_call_) throw CudaError("registration " + std::to_string(n) + " refused", 2);
    live_.insert({reinterpret_cast<uintptr_t>(base), bytes});
  }
  void on_chunk_release(void* base, size_t bytes) noexcept override {
    std::lock_guard lock(mu_);
    release_times_.push_back(Clock::now());
    if (live_.erase({reinterpret_cast<uintptr_t>(base), bytes}) != 1) ++unpaired_releases_;
  }

  int ready_calls() const {
    std::lock_guard lock(mu_);
    return ready_calls_;
  }
  std::set<std::thread::id> ready_threads() const {
    std::lock_guard lock(mu_);
    return ready_threads_;
  }
  std::vector<Clock::time_point> release_times() const {
    std::lock_guard lock(mu_);
    return release_times_;
  }
  // Chunks readied and not released, and releases of chunks never readied.
  size_t live_chunks() const {
    std::lock_guard lock(mu_);
    return live_.size();
  }
  int unpaired_releases() const {
    std::lock_guard lock(mu_);
    return unpaired_releases_;
  }

 private:
  const std::chrono::milliseconds delay_;
  const int throw_on_call_;
  mutable std::mutex mu_;
  int ready_calls_ = 0;
  int unpaired_releases_ = 0;
  std::set<std::thread::id> ready_threads_;
  std::set<std::pair<uintptr_t, size_t>> live_;
  std::vector<Clock::time_point> release_times_;
};

PoolOptions options(size_t chunk = 4 * MiB) {
  PoolOptions o;
  o.chunk_bytes = chunk;
  o.touch_threads = 2;
  return o;
}

uint64_t reserved(const PoolStats& s) { return s.kind[0].reserved.current + s.kind[1].reserved.current; }

// Polls until pred() or the deadline; true if pred() held.
template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds deadline = 10s) {
  const auto end = Clock::now() + deadline;
  while (Clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(2ms);
  }
  return pred();
}

void expect_consistent(const Pool& pool) {
  const PoolStats s = pool.stats();
  EXPECT_EQ(accounting_violation(s), "") << describe(s);
}

// ---- releaser -----------------------------------------------------------------

TEST(PoolReleaser, IdleChunksGoBackAfterTheDelayInCappedBatches) {
  auto hooks = std::make_shared<SlowHooks>();
  PoolOptions o = options();
  o.release_delay_ms = 100;
  o.release_batch_bytes = 4 * MiB;  // one chunk per round
  Pool pool(o, hooks);
  std::vector<void*> v;
  for (int i = 0; i < 3; ++i) v.push_back(pool.allocate(3 * MiB, 256, HugeWant::no));
  const auto freed_at = Clock::now();
  for (void* p : v) pool.deallocate(p);
  PoolStats s = pool.stats();
  EXPECT_EQ(reserved(s), 12 * MiB) << "the free path released memory";
  EXPECT_EQ(s.chunk_releases, 0u);

  ASSERT_TRUE(eventually([&] { return pool.stats().chunk_releases == 3; })) << describe(pool.stats());
  auto times = hooks->release_times();
  ASSERT_EQ(times.size(), 3u);
  std::sort(times.begin(), times.end());
  EXPECT_GE(times[0] - freed_at, 90ms) << "released before the delay";
  EXPECT_GE(times[2] - times[0], 150ms) << "three chunks in batches of one need three rounds 100 ms apart";
  s = pool.stats();
  EXPECT_EQ(reserved(s), 0u);
  expect_consistent(pool);
  // The pool works on, and reserves again.
  pool.deallocate(pool.allocate(MiB));
  EXPECT_EQ(pool.stats().chunk_reservations, 4u);
}

TEST(PoolReleaser, ChunksInUseStay) {
  PoolOptions o = options();
  o.release_delay_ms = 10;
  Pool pool(o);
  void* p = pool.allocate(MiB, 256, HugeWant::no);
  void* q = pool.allocate(MiB, 256, HugeWant::yes);
  pool.deallocate(q);  // the huge chunk becomes idle, the small one is in use
  ASSERT_TRUE(eventually([&] { return pool.stats().chunk_releases == 1; }));
  std::this_thread::sleep_for(100ms);
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.kind[0].reserved.current, 4 * MiB);
  EXPECT_EQ(s.kind[1].reserved.current, 0u);
  pool.deallocate(p);
  expect_consistent(pool);
}

TEST(PoolReleaser, NoBackgroundReleaseWithoutADelay) {
  Pool pool(options());
  pool.deallocate(pool.allocate(MiB));
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(reserved(pool.stats()), 4 * MiB);
}

TEST(PoolReleaser, KeepsTheTargetReserved) {
  PoolOptions o = options();
  o.release_delay_ms = 10;
  o.target_bytes = 8 * MiB;
  Pool pool(o);
  pool.wait_ready();
  std::vector<void*> v;
  for (int i = 0; i < 4; ++i) v.push_back(pool.allocate(4 * MiB, 256, HugeWant::yes));
  EXPECT_EQ(reserved(pool.stats()), 16 * MiB);
  for (void* p : v) pool.deallocate(p);
  ASSERT_TRUE(eventually([&] { return reserved(pool.stats()) == 8 * MiB; }));
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(reserved(pool.stats()), 8 * MiB) << "the releaser went below target_bytes";
}

// ---- target pipeline ---------------------------------------------------------------

TEST(PoolTarget, ReservesAndRegistersTheTargetInTheBackground) {
  auto hooks = std::make_shared<SlowHooks>(20ms);
  PoolOptions o = options();
  o.target_bytes = 17 * MiB;  // five 4 MiB chunks
  {
    Pool pool(o, hooks);
    pool.wait_ready();
    const PoolStats s = pool.stats();
    EXPECT_EQ(s.chunk_reservations, 5u);
    EXPECT_EQ(s.kind[1].reserved.current, 20 * MiB);
    EXPECT_EQ(s.kind[0].reserved.current, 0u);
    EXPECT_GT(s.touch_ns, 0u);
    EXPECT_GE(s.register_ns, 5 * 20'000'000u);
    EXPECT_EQ(hooks->ready_calls(), 5);
    const auto threads = hooks->ready_threads();
    EXPECT_EQ(threads.size(), 1u) << "registrations are serialized on one thread";
    EXPECT_EQ(threads.count(std::this_thread::get_id()), 0u);
    std::vector<void*> v;
    for (int i = 0; i < 5; ++i) v.push_back(pool.allocate(4 * MiB, 256, HugeWant::yes));
    EXPECT_EQ(pool.stats().chunk_reservations, 5u) << "the target chunks were not used";
    for (void* p : v) pool.deallocate(p);
    pool.wait_ready();  // again: returns at once
    expect_consistent(pool);
  }
  EXPECT_EQ(hooks->live_chunks(), 0u);
  EXPECT_EQ(hooks->unpaired_releases(), 0);
}

TEST(PoolTarget, AnAllocationWaitsForTheNextTargetChunk) {
  auto hooks = std::make_shared<SlowHooks>(80ms);
  PoolOptions o = options();
  o.target_bytes = 16 * MiB;
  Pool pool(o, hooks);
  const auto start = Clock::now();
  void* p = pool.allocate(MiB, 256, HugeWant::yes);  // waits for the first chunk
  EXPECT_GE(Clock::now() - start, 60ms) << "did not wait for a target chunk";
  void* big = pool.allocate(6 * MiB, 256, HugeWant::yes);  // larger than a chunk: its own
  void* small = pool.allocate(MiB, 256, HugeWant::no);     // another kind: its own
  pool.wait_ready();
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.chunk_reservations, 4u + 2u) << "the waiting allocation reserved a chunk of its own";
  EXPECT_EQ(s.kind[1].reserved.current, 16 * MiB + 6 * MiB);
  EXPECT_EQ(s.kind[0].reserved.current, 4 * MiB);
  for (void* q : {p, big, small}) pool.deallocate(q);
  expect_consistent(pool);
}

TEST(PoolTarget, WaitReadyRethrowsTheFirstBackgroundError) {
  auto hooks = std::make_shared<SlowHooks>(0ms, /*throw_on_call=*/1);
  PoolOptions o = options();
  o.target_bytes = 16 * MiB;
  {
    Pool pool(o, hooks);
    try {
      pool.wait_ready();
      FAIL() << "no exception";
    } catch (const CudaError& e) {
      EXPECT_STREQ(e.what(), "registration 1 refused");
    }
    EXPECT_THROW(pool.wait_ready(), CudaError);  // every time
    const PoolStats s = pool.stats();
    EXPECT_EQ(s.chunk_reservations, 1u);
    EXPECT_EQ(reserved(s), 4 * MiB);
    // The pool still works; allocations no longer wait for the failed pipeline.
    void* a = pool.allocate(3 * MiB, 256, HugeWant::yes);
    void* b = pool.allocate(3 * MiB, 256, HugeWant::yes);
    pool.deallocate(a);
    pool.deallocate(b);
    expect_consistent(pool);
  }
  EXPECT_EQ(hooks->live_chunks(), 0u);
  EXPECT_EQ(hooks->unpaired_releases(), 0);
}

TEST(PoolTarget, ATargetBeyondTheLimitFailsWithTheLimitMessage) {
  PoolOptions o = options();
  o.limit_bytes = 8 * MiB;
  o.target_bytes = 16 * MiB;
  Pool pool(o);
  try {
    pool.wait_ready();
    FAIL() << "no exception";
  } catch (const OutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("ferry pool limit of 8 MiB reached"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("background target of 16 MiB (chunk 3 of 4)"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(reserved(pool.stats()), 8 * MiB);
}

TEST(PoolTarget, DestroyingThePoolStopsThePipeline) {
  auto hooks = std::make_shared<SlowHooks>(50ms);
  PoolOptions o = options(2 * MiB);
  o.target_bytes = 40 * MiB;  // 20 chunks, a second of registrations
  const auto start = Clock::now();
  {
    Pool pool(o, hooks);
    std::this_thread::sleep_for(60ms);
  }
  EXPECT_LT(Clock::now() - start, 600ms) << "the destructor waited for the whole target";
  EXPECT_LT(hooks->ready_calls(), 20);
  EXPECT_EQ(hooks->live_chunks(), 0u) << "registered chunks were not released";
  EXPECT_EQ(hooks->unpaired_releases(), 0);
}

TEST(PoolTarget, SmallTargetKind) {
  PoolOptions o = options();
  o.target_bytes = 8 * MiB;
  o.target_kind = HugeWant::no;
  Pool pool(o);
  pool.wait_ready();
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.kind[0].reserved.current, 8 * MiB);
  EXPECT_EQ(s.kind[1].reserved.current, 0u);
  EXPECT_EQ(s.chunks_by_backing[static_cast<int>(Backing::small_pages)], 2u);
}

}  // namespace
}  // namespace ferry
