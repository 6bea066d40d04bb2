// pool_background_test.cpp — the pool's background threads: the throttled
// releaser (delay, capped batches, never on the free path, keeps the target)
// and the target (one chunk, one registration overlapping the touch; it
// serves one allocation of its size or many smaller ones; allocations wait
// for it; wait_ready, errors, limit, early destruction).
#include <gtest/gtest.h>

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/fault.h"
#include "pool/pool.h"
#include "pool/stats.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
constexpr size_t KiB = size_t{1} << 10, MiB = size_t{1} << 20;

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

// Records hook calls with their time and thread; on_chunk_ready sleeps
// `register_delay` (a driver registering memory) and may throw on one call.
class SlowHooks : public ChunkHooks {
 public:
  explicit SlowHooks(std::chrono::milliseconds register_delay = 0ms, int throw_on_call = -1)
      : delay_(register_delay), throw_on_call_(throw_on_call) {}

  void on_chunk_ready(void* base, size_t bytes) override {
    ++entered;
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
  std::atomic<int> entered{0};  // calls of on_chunk_ready begun

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

// ---- target ------------------------------------------------------------------------

// Bytes of [p, p + n) resident in memory (mincore), in 4 KiB pages.
size_t resident_bytes(uintptr_t p, size_t n) {
  std::vector<unsigned char> v(n / 4096);
  if (mincore(reinterpret_cast<void*>(p), n, v.data()) != 0) return SIZE_MAX;
  size_t pages = 0;
  for (unsigned char c : v) pages += c & 1;
  return pages * 4096;
}

// Writes seeded bytes at a sparse set of offsets (every byte of the ends) and
// checks them; for buffers of up to a few hundred MiB.
void write_seeded(void* p, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto* b = static_cast<unsigned char*>(p);
  for (size_t i = 0; i < n; i += (i < 4096 || n - i <= 4096) ? 1 : 4093) b[i] = static_cast<unsigned char>(rng());
}
bool check_seeded(const void* p, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; i += (i < 4096 || n - i <= 4096) ? 1 : 4093)
    if (b[i] != static_cast<unsigned char>(rng())) return false;
  return true;
}

// Hooks that look at the chunk when they are called: how much of it was
// touched then, and a little later (a registration walking behind the touch).
class ResidencyHooks : public ChunkHooks {
 public:
  void on_chunk_ready(void* base, size_t bytes) override {
    const uintptr_t b = reinterpret_cast<uintptr_t>(base);
    at_call = resident_bytes(b, bytes);
    std::this_thread::sleep_for(30ms);
    after_30ms = resident_bytes(b, bytes);
    chunk_bytes = bytes;
  }
  void on_chunk_release(void*, size_t) noexcept override {}
  std::atomic<size_t> at_call{0}, after_30ms{0}, chunk_bytes{0};
};

// A target whose touch is slow enough to watch: 512 MiB of small pages
// touched by one thread (hundreds of ms), registered after `lead` bytes.
PoolOptions slow_target(size_t lead) {
  PoolOptions o = options();
  o.touch_threads = 1;
  o.target_bytes = 512 * MiB;
  o.target_kind = HugeWant::no;
  o.register_lead_bytes = lead;
  return o;
}

TEST(PoolTarget, IsOneChunkWithOneRegistration) {
  auto hooks = std::make_shared<SlowHooks>(20ms);
  PoolOptions o = options();
  o.target_bytes = 17 * MiB;  // one chunk of 18 MiB (rounded up to 2 MiB)
  {
    Pool pool(o, hooks);
    pool.wait_ready();
    const PoolStats s = pool.stats();
    EXPECT_EQ(s.chunk_reservations, 1u);
    EXPECT_EQ(s.kind[1].reserved.current, 18 * MiB);
    EXPECT_EQ(s.kind[0].reserved.current, 0u);
    EXPECT_GT(s.touch_ns, 0u);
    EXPECT_GE(s.register_ns, 20'000'000u);
    EXPECT_GE(s.target_ns, s.register_ns) << "target_ns counts from creation until the chunk was in";
    EXPECT_EQ(hooks->ready_calls(), 1) << "one registration over the whole target";
    EXPECT_EQ(hooks->ready_threads().count(std::this_thread::get_id()), 0u) << "registered in the background";
    pool.wait_ready();  // again: returns at once
    expect_consistent(pool);
  }
  EXPECT_EQ(hooks->live_chunks(), 0u);
  EXPECT_EQ(hooks->unpaired_releases(), 0);
}

TEST(PoolTarget, ServesOneAllocationOfItsWholeSize) {
  for (const size_t target : {16 * MiB, 13 * MiB + 5}) {
    auto hooks = std::make_shared<SlowHooks>(30ms);
    PoolOptions o = options();
    o.target_bytes = target;
    Pool pool(o, hooks);
    // At once, before the target is ready: the allocation waits for it.
    void* p = pool.allocate(target, 256, HugeWant::automatic);
    const PoolStats s = pool.stats();
    EXPECT_EQ(s.chunk_reservations, 1u) << "the allocation reserved a chunk of its own";
    EXPECT_EQ(reserved(s), round_up(target, 2 * MiB)) << "reserved in all";
    EXPECT_EQ(s.kind[1].in_use.current, round_up(target, 256));
    EXPECT_EQ(hooks->ready_calls(), 1);
    write_seeded(p, target, target);
    EXPECT_TRUE(check_seeded(p, target, target));
    pool.deallocate(p);
    // And again, recycled: still nothing new.
    void* q = pool.allocate(target);
    EXPECT_EQ(q, p);
    EXPECT_EQ(pool.stats().chunk_reservations, 1u);
    pool.deallocate(q);
    expect_consistent(pool);
  }
}

TEST(PoolTarget, ServesManySmallerAllocationsOfAnySize) {
  PoolOptions o = options();
  o.target_bytes = 16 * MiB;
  Pool pool(o);
  pool.wait_ready();
  std::mt19937_64 rng(12);
  struct Live {
    void* p;
    size_t n;
    uint64_t seed;
  };
  std::vector<Live> live;
  size_t used = 0;
  while (used < 12 * MiB) {
    // 1 B .. 3 MiB, below and above 2 MiB, automatic kind: all from the target.
    const size_t n = 1 + rng() % (rng() % 4 == 0 ? 3 * MiB : 64 * KiB);
    const size_t align = size_t{1} << (rng() % 13);
    void* p = pool.allocate(n, align);
    ASSERT_EQ(reinterpret_cast<uintptr_t>(p) % align, 0u);
    live.push_back({p, n, rng()});
    write_seeded(p, n, live.back().seed);
    used += round_up(n, align) + align;
  }
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.chunk_reservations, 1u) << describe(s);
  EXPECT_EQ(reserved(s), 16 * MiB);
  EXPECT_EQ(s.kind[0].reserved.current, 0u) << "small requests went to small chunks, not the target";
  for (const Live& l : live) {
    EXPECT_TRUE(check_seeded(l.p, l.n, l.seed)) << "allocations overlap";
    pool.deallocate(l.p);
  }
  expect_consistent(pool);
}

TEST(PoolTarget, TheRegistrationOverlapsTheTouch) {
  // 512 MiB of small pages touched by one thread (hundreds of ms); the hook
  // starts after 4 MiB, while the rest is still being touched.
  auto hooks = std::make_shared<ResidencyHooks>();
  Pool pool(slow_target(4 * MiB), hooks);
  pool.wait_ready();
  ASSERT_EQ(hooks->chunk_bytes, 512 * MiB);
  EXPECT_GE(hooks->at_call, 4 * MiB) << "the hook started before its lead was touched";
  EXPECT_LT(hooks->at_call, 512 * MiB) << "the hook waited for the whole touch";
  EXPECT_GT(hooks->after_30ms, hooks->at_call) << "the touch did not go on during the hook";
  const PoolStats s = pool.stats();
  EXPECT_GE(s.touch_ns, 30'000'000u);
  void* p = pool.allocate(512 * MiB, 4096, HugeWant::no);
  EXPECT_EQ(resident_bytes(reinterpret_cast<uintptr_t>(p), 512 * MiB), 512 * MiB) << "not all touched";
  pool.deallocate(p);
}

TEST(PoolTarget, ALeadOfTheWholeChunkRegistersAfterTheTouch) {
  auto hooks = std::make_shared<ResidencyHooks>();
  PoolOptions o = options();
  o.target_bytes = 64 * MiB;
  o.register_lead_bytes = 64 * MiB;
  Pool pool(o, hooks);
  pool.wait_ready();
  EXPECT_EQ(hooks->at_call, 64 * MiB);
}

TEST(PoolTarget, AllocationsOfAnotherKindOrLargerDoNotWait) {
  auto hooks = std::make_shared<SlowHooks>(80ms);
  PoolOptions o = options();
  o.target_bytes = 16 * MiB;
  Pool pool(o, hooks);
  const auto start = Clock::now();
  void* p = pool.allocate(MiB, 256, HugeWant::yes);  // waits for the target
  EXPECT_GE(Clock::now() - start, 60ms) << "did not wait for the target";
  void* big = pool.allocate(18 * MiB, 256, HugeWant::yes);  // larger than the target: its own
  void* small = pool.allocate(MiB, 256, HugeWant::no);      // another kind: its own
  pool.wait_ready();
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.chunk_reservations, 3u);
  EXPECT_EQ(s.kind[1].reserved.current, 16 * MiB + 18 * MiB);
  EXPECT_EQ(s.kind[0].reserved.current, 4 * MiB);
  for (void* q : {p, big, small}) pool.deallocate(q);
  expect_consistent(pool);
}

TEST(PoolTarget, WaitReadyRethrowsTheBackgroundError) {
  auto hooks = std::make_shared<SlowHooks>(0ms, /*throw_on_call=*/0);
  PoolOptions o = options();
  o.target_bytes = 16 * MiB;
  {
    Pool pool(o, hooks);
    try {
      pool.wait_ready();
      FAIL() << "no exception";
    } catch (const CudaError& e) {
      EXPECT_STREQ(e.what(), "registration 0 refused");
    }
    EXPECT_THROW(pool.wait_ready(), CudaError);  // every time
    const PoolStats s = pool.stats();
    EXPECT_EQ(s.chunk_reservations, 0u);
    EXPECT_EQ(reserved(s), 0u) << "the refused chunk stayed mapped";
    // The pool still works; allocations no longer wait for the target.
    void* a = pool.allocate(3 * MiB, 256, HugeWant::yes);
    void* b = pool.allocate(3 * MiB, 256, HugeWant::yes);
    pool.deallocate(a);
    pool.deallocate(b);
    expect_consistent(pool);
  }
  EXPECT_EQ(hooks->live_chunks(), 0u);
  EXPECT_EQ(hooks->unpaired_releases(), 0) << "a refused chunk was released through the hook";
}

TEST(PoolTarget, ATouchFailureFailsTheTargetAndMapsNothing) {
  auto hooks = std::make_shared<SlowHooks>();
  PoolOptions o = options();
  o.target_bytes = 16 * MiB;
  set_fault_injection("touch:0");
  {
    Pool pool(o, hooks);
    try {
      pool.wait_ready();
      FAIL() << "no exception";
    } catch (const OsError& e) {
      EXPECT_NE(std::string(e.what()).find("first touch of a 16 MiB pool chunk"), std::string::npos) << e.what();
    }
    set_fault_injection("");
    EXPECT_EQ(reserved(pool.stats()), 0u);
    EXPECT_EQ(hooks->ready_calls(), 0) << "a chunk that was not touched was registered";
    pool.deallocate(pool.allocate(MiB));
  }
  set_fault_injection("");
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
    EXPECT_NE(std::string(e.what()).find("background target of 16 MiB needs a new 16 MiB chunk"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(reserved(pool.stats()), 0u);
  pool.deallocate(pool.allocate(MiB));  // within the limit: fine
}

TEST(PoolTarget, DestroyingThePoolBeforeTheRegistrationCancelsIt) {
  // One thread touches 512 MiB of small pages; the hook would start after
  // 448 MiB. The pool is destroyed at once: the touch stops, nothing is registered.
  auto hooks = std::make_shared<SlowHooks>();
  { Pool pool(slow_target(448 * MiB), hooks); }
  EXPECT_EQ(hooks->ready_calls(), 0);
  EXPECT_EQ(hooks->live_chunks(), 0u);
}

TEST(PoolTarget, DestroyingThePoolFinishesARegistrationInFlight) {
  auto hooks = std::make_shared<SlowHooks>(200ms);
  PoolOptions o = options();
  o.target_bytes = 16 * MiB;
  o.register_lead_bytes = 0;
  {
    Pool pool(o, hooks);
    ASSERT_TRUE(eventually([&] { return hooks->entered > 0; }));
  }  // while the hook sleeps
  EXPECT_EQ(hooks->ready_calls(), 1);
  EXPECT_EQ(hooks->live_chunks(), 0u) << "a registered chunk was not released";
  EXPECT_EQ(hooks->unpaired_releases(), 0);
}

TEST(PoolTarget, SmallTargetKindServesSmallAllocations) {
  PoolOptions o = options();
  o.target_bytes = 8 * MiB;
  o.target_kind = HugeWant::no;
  Pool pool(o);
  pool.wait_ready();
  PoolStats s = pool.stats();
  EXPECT_EQ(s.kind[0].reserved.current, 8 * MiB);
  EXPECT_EQ(s.kind[1].reserved.current, 0u);
  EXPECT_EQ(s.chunks_by_backing[static_cast<int>(Backing::small_pages)], 1u);
  void* p = pool.allocate(5 * MiB, 256, HugeWant::no);
  void* q = pool.allocate(100 * KiB);  // automatic, below 2 MiB: the target's kind
  s = pool.stats();
  EXPECT_EQ(s.chunk_reservations, 1u);
  pool.deallocate(p);
  pool.deallocate(q);
}

}  // namespace
}  // namespace ferry
