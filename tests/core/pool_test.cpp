// pool_test.cpp — Pool on real memory: exact sizes and alignments with
// patterns and no overlap, accounting invariants after every step, recycling,
// coalescing, huge/small separation, dedicated chunks, zeroing, trim, hooks,
// the hard limit, bad input, fault injection, memfd sharing, options, speed.
#include "pool/pool.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <latch>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/fault.h"
#include "core/options.h"
#include "os/mapping.h"
#include "pool/stats.h"

namespace ferry {
namespace {

constexpr size_t KiB = size_t{1} << 10, MiB = size_t{1} << 20, GiB = size_t{1} << 30;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

class PoolTest : public ::testing::Test {
 protected:
  void TearDown() override { set_fault_injection(""); }
};

PoolOptions small_chunks(size_t chunk = 8 * MiB) {
  PoolOptions o;
  o.chunk_bytes = chunk;
  o.touch_threads = 2;
  return o;
}

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

#define EXPECT_CONSISTENT(pool)                                          \
  do {                                                                   \
    const PoolStats s_ = (pool).stats();                                 \
    EXPECT_EQ(accounting_violation(s_), "") << describe(s_);             \
  } while (0)

uint64_t in_use(const PoolStats& s) { return s.kind[0].in_use.current + s.kind[1].in_use.current; }
uint64_t reserved(const PoolStats& s) { return s.kind[0].reserved.current + s.kind[1].reserved.current; }
uint64_t cached(const PoolStats& s) { return s.kind[0].cached.current + s.kind[1].cached.current; }
uint64_t released(const PoolStats& s) { return s.kind[0].released.current + s.kind[1].released.current; }

// A pattern: every byte of the first and last 8 KiB, every 4093rd in between.
template <class F>
void for_each_checked_offset(size_t n, F f) {
  constexpr size_t kDense = 8 * KiB;
  if (n <= 3 * kDense) {
    for (size_t i = 0; i < n; ++i) f(i);
    return;
  }
  for (size_t i = 0; i < kDense; ++i) f(i);
  for (size_t i = kDense; i < n - kDense; i += 4093) f(i);
  for (size_t i = n - kDense; i < n; ++i) f(i);
}

uint8_t pattern_byte(uint64_t seed, size_t i) {
  uint64_t x = seed ^ (i * 0x9E3779B97F4A7C15ull);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  return static_cast<uint8_t>(x >> 32);
}

void write_pattern(void* p, size_t n, uint64_t seed) {
  auto* b = static_cast<uint8_t*>(p);
  for_each_checked_offset(n, [&](size_t i) { b[i] = pattern_byte(seed, i); });
}

// Offset of the first wrong byte, or SIZE_MAX.
size_t check_pattern(const void* p, size_t n, uint64_t seed) {
  const auto* b = static_cast<const uint8_t*>(p);
  size_t bad = SIZE_MAX;
  for_each_checked_offset(n, [&](size_t i) {
    if (bad == SIZE_MAX && b[i] != pattern_byte(seed, i)) bad = i;
  });
  return bad;
}

bool all_zero(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  return std::all_of(b, b + n, [](uint8_t v) { return v == 0; });
}

struct Live {
  uintptr_t begin;
  size_t size;   // rounded: what the pool holds for it
  size_t bytes;  // asked for: what the pattern covers
  uint64_t seed;
  PageKind kind;
};

PageKind kind_of(HugeWant want, size_t rounded) {
  if (want == HugeWant::yes) return PageKind::huge;
  if (want == HugeWant::no) return PageKind::small;
  return rounded >= 2 * MiB ? PageKind::huge : PageKind::small;
}

void expect_no_overlap(std::vector<Live> live) {
  std::sort(live.begin(), live.end(), [](const Live& a, const Live& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < live.size(); ++i)
    EXPECT_LE(live[i - 1].begin + live[i - 1].size, live[i].begin)
        << "allocations at " << std::hex << live[i - 1].begin << " and " << live[i].begin << " overlap";
}

void expect_same_stats(const PoolStats& a, const PoolStats& b) {
  for (int k = 0; k < 2; ++k) {
    const Counter* ca[] = {&a.kind[k].reserved, &a.kind[k].committed, &a.kind[k].in_use, &a.kind[k].cached,
                           &a.kind[k].released};
    const Counter* cb[] = {&b.kind[k].reserved, &b.kind[k].committed, &b.kind[k].in_use, &b.kind[k].cached,
                           &b.kind[k].released};
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(ca[i]->current, cb[i]->current) << "kind " << k << " counter " << i;
      EXPECT_EQ(ca[i]->peak, cb[i]->peak) << "kind " << k << " counter " << i;
      EXPECT_EQ(ca[i]->total, cb[i]->total) << "kind " << k << " counter " << i;
    }
  }
  EXPECT_EQ(a.allocations, b.allocations);
  EXPECT_EQ(a.frees, b.frees);
  EXPECT_EQ(a.recycles, b.recycles);
  EXPECT_EQ(a.chunk_reservations, b.chunk_reservations);
  EXPECT_EQ(a.chunk_releases, b.chunk_releases);
  EXPECT_EQ(a.fallbacks, b.fallbacks);
  EXPECT_EQ(a.notes, b.notes);
}

// Records every hook call; optionally throws on chosen on_chunk_ready calls.
class RecordingHooks : public ChunkHooks {
 public:
  struct Event {
    bool ready;
    uintptr_t base;
    size_t bytes;
    bool threw = false;  // a ready call that refused the chunk
  };
  void on_chunk_ready(void* base, size_t bytes) override {
    std::lock_guard lock(mu_);
    const int n = ready_calls_++;
    const bool refuse = throw_on_call_ == n;
    events_.push_back({true, reinterpret_cast<uintptr_t>(base), bytes, refuse});
    if (refuse) throw CudaError("injected registration failure", 2);
  }
  void on_chunk_release(void* base, size_t bytes) noexcept override {
    std::lock_guard lock(mu_);
    events_.push_back({false, reinterpret_cast<uintptr_t>(base), bytes});
  }
  std::vector<Event> events() const {
    std::lock_guard lock(mu_);
    return events_;
  }
  void throw_on_call(int n) {
    std::lock_guard lock(mu_);
    throw_on_call_ = n;
  }
  // Ranges of the chunks that are ready and not released.
  std::vector<std::pair<uintptr_t, size_t>> live_chunks() const {
    std::lock_guard lock(mu_);
    std::vector<std::pair<uintptr_t, size_t>> out;
    for (const Event& e : events_) {
      if (e.threw) continue;
      if (e.ready)
        out.emplace_back(e.base, e.bytes);
      else
        out.erase(std::find(out.begin(), out.end(), std::make_pair(e.base, e.bytes)));
    }
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::vector<Event> events_;
  int ready_calls_ = 0;
  int throw_on_call_ = -1;
};

// Every ready is followed by exactly one release of the same chunk; a ready
// that threw needs none.
void expect_paired(const std::vector<RecordingHooks::Event>& events, int failed_ready_calls = 0) {
  std::multiset<std::pair<uintptr_t, size_t>> open;
  int readies = 0, releases = 0, refused = 0;
  for (const auto& e : events) {
    if (e.threw) {
      ++refused;
    } else if (e.ready) {
      EXPECT_EQ(open.count({e.base, e.bytes}), 0u) << "chunk readied twice";
      open.insert({e.base, e.bytes});
      ++readies;
    } else {
      auto it = open.find({e.base, e.bytes});
      ASSERT_NE(it, open.end()) << "release without ready";
      open.erase(it);
      ++releases;
    }
  }
  EXPECT_TRUE(open.empty()) << open.size() << " chunks were never released";
  EXPECT_EQ(readies, releases);
  EXPECT_EQ(refused, failed_ready_calls);
}

// ---- sizes, alignments, patterns ---------------------------------------------

TEST_F(PoolTest, ExactSizesAndAlignmentsKeepTheirPatternsAndNeverOverlap) {
  Pool pool(small_chunks(16 * MiB));
  const size_t sizes[] = {1,       3,         255,          256,         257,     4095,
                          4097,    65537,     MiB + 13,     2 * MiB - 1, 2 * MiB, 2 * MiB + 1,
                          7 * MiB + 5, 16 * MiB, 16 * MiB + 1, 64 * MiB + 3};
  const size_t alignments[] = {1, 2, 8, 64, 256, 4096, 64 * KiB, 2 * MiB};
  std::mt19937_64 rng(1);
  std::vector<Live> live;
  uint64_t expected_in_use = 0;
  for (size_t size : sizes) {
    for (size_t alignment : alignments) {
      const HugeWant want = static_cast<HugeWant>(rng() % 3);
      void* p = pool.allocate(size, alignment, want);
      ASSERT_NE(p, nullptr);
      const uintptr_t a = reinterpret_cast<uintptr_t>(p);
      EXPECT_EQ(a % alignment, 0u) << size << " at " << alignment;
      const size_t rounded = round_up(size, alignment);
      EXPECT_EQ(pool.allocation_size(p), rounded) << size << " at " << alignment;
      const uint64_t seed = rng();
      write_pattern(p, size, seed);
      live.push_back({a, rounded, size, seed, kind_of(want, rounded)});
      expected_in_use += rounded;
      const PoolStats s = pool.stats();
      ASSERT_EQ(accounting_violation(s), "") << describe(s);
      ASSERT_EQ(in_use(s), expected_in_use);
    }
  }
  expect_no_overlap(live);
  std::shuffle(live.begin(), live.end(), rng);
  for (const Live& l : live) {
    ASSERT_EQ(check_pattern(reinterpret_cast<void*>(l.begin), l.bytes, l.seed), SIZE_MAX)
        << "pattern of the allocation at " << std::hex << l.begin << " was overwritten";
    pool.deallocate(reinterpret_cast<void*>(l.begin));
    expected_in_use -= l.size;
    const PoolStats t = pool.stats();
    ASSERT_EQ(accounting_violation(t), "") << describe(t);
    ASSERT_EQ(in_use(t), expected_in_use);
  }
  const PoolStats end = pool.stats();
  EXPECT_EQ(in_use(end), 0u);
  EXPECT_EQ(end.allocations, live.size());
  EXPECT_EQ(end.frees, live.size());
}

TEST_F(PoolTest, HugeAndSmallNeverShareAChunk) {
  auto hooks = std::make_shared<RecordingHooks>();
  Pool pool(small_chunks(4 * MiB), hooks);
  std::mt19937_64 rng(2);
  std::vector<Live> live;
  uint64_t by_kind[2] = {};
  for (int i = 0; i < 300; ++i) {
    const size_t size = 1 + rng() % (3 * MiB);
    const HugeWant want = static_cast<HugeWant>(rng() % 3);
    void* p = pool.allocate(size, 256, want);
    const size_t rounded = round_up(size, 256);
    const PageKind kind = kind_of(want, rounded);
    live.push_back({reinterpret_cast<uintptr_t>(p), rounded, size, 0, kind});
    by_kind[static_cast<int>(kind)] += rounded;
    if (rng() % 3 == 0) {  // free a random one
      const size_t k = rng() % live.size();
      pool.deallocate(reinterpret_cast<void*>(live[k].begin));
      by_kind[static_cast<int>(live[k].kind)] -= live[k].size;
      live.erase(live.begin() + static_cast<long>(k));
    }
  }
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.kind[0].in_use.current, by_kind[0]);
  EXPECT_EQ(s.kind[1].in_use.current, by_kind[1]);
  for (const auto& [base, bytes] : hooks->live_chunks()) {
    std::set<PageKind> kinds;
    for (const Live& l : live)
      if (l.begin >= base && l.begin < base + bytes) {
        EXPECT_LE(l.begin + l.size, base + bytes) << "an allocation crosses its chunk's end";
        kinds.insert(l.kind);
      }
    EXPECT_LE(kinds.size(), 1u) << "huge and small allocations share the chunk at " << std::hex << base;
  }
  expect_no_overlap(live);
}

// ---- recycling and coalescing -------------------------------------------------

TEST_F(PoolTest, FreedMemoryIsRecycledBeforeANewChunk) {
  Pool pool(small_chunks(8 * MiB));
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(pool.allocate(MiB, 4096, HugeWant::no));
  const PoolStats full = pool.stats();
  EXPECT_EQ(full.chunk_reservations, 1u);
  EXPECT_EQ(full.recycles, 0u);
  for (int round = 0; round < 20; ++round) {
    const size_t k = static_cast<size_t>(round) % blocks.size();
    void* old = blocks[k];
    pool.deallocate(old);
    blocks[k] = pool.allocate(MiB, 4096, HugeWant::no);
    EXPECT_EQ(blocks[k], old) << "the only free range is the one just freed";
    EXPECT_CONSISTENT(pool);
  }
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.chunk_reservations, 1u) << "a new chunk was reserved although freed memory fit";
  EXPECT_EQ(s.recycles, 20u);
  for (void* b : blocks) pool.deallocate(b);
}

TEST_F(PoolTest, NeighboursCoalesce) {
  Pool pool(small_chunks(4 * MiB));
  void* q[4];
  for (auto& p : q) p = pool.allocate(MiB, 4096, HugeWant::no);
  for (int i = 1; i < 4; ++i)
    EXPECT_EQ(static_cast<char*>(q[i]), static_cast<char*>(q[0]) + i * MiB) << "carved in address order";
  pool.deallocate(q[1]);
  pool.deallocate(q[2]);
  void* both = pool.allocate(2 * MiB, 4096, HugeWant::no);
  EXPECT_EQ(both, q[1]) << "two freed neighbours did not coalesce";
  pool.deallocate(both);
  pool.deallocate(q[0]);
  pool.deallocate(q[3]);
  void* all = pool.allocate(4 * MiB, 4096, HugeWant::no);
  EXPECT_EQ(all, q[0]);
  EXPECT_EQ(pool.stats().chunk_reservations, 1u);
  pool.deallocate(all);
  EXPECT_CONSISTENT(pool);
}

TEST_F(PoolTest, BestFitPrefersTheSmallestHole) {
  Pool pool(small_chunks(8 * MiB));
  void* a = pool.allocate(MiB, 4096, HugeWant::no);      // [0, 1)
  void* hole3 = pool.allocate(3 * MiB, 4096, HugeWant::no);  // [1, 4)
  void* b = pool.allocate(MiB, 4096, HugeWant::no);      // [4, 5)
  void* hole2 = pool.allocate(2 * MiB, 4096, HugeWant::no);  // [5, 7)
  void* c = pool.allocate(MiB, 4096, HugeWant::no);      // [7, 8)
  pool.deallocate(hole3);
  pool.deallocate(hole2);
  EXPECT_EQ(pool.allocate(2 * MiB, 4096, HugeWant::no), hole2);
  EXPECT_EQ(pool.allocate(3 * MiB, 4096, HugeWant::no), hole3);
  EXPECT_EQ(pool.stats().chunk_reservations, 1u);
  for (void* p : {a, b, c, hole2, hole3}) pool.deallocate(p);
}

// ---- large requests --------------------------------------------------------------

TEST_F(PoolTest, ALargerRequestGetsADedicatedChunkThatIsThenRecycled) {
  Pool pool(small_chunks(8 * MiB));
  const size_t request = 8 * MiB * 21 / 10;  // 2.1 chunks
  void* p = pool.allocate(request, 4096, HugeWant::yes);
  write_pattern(p, request, 3);
  PoolStats s = pool.stats();
  EXPECT_EQ(s.chunk_reservations, 1u);
  EXPECT_EQ(reserved(s), round_up(request, 2 * MiB)) << "a 2.1-chunk request reserved more than it needs";
  EXPECT_LE(reserved(s), request + 8 * MiB);
  EXPECT_EQ(check_pattern(p, request, 3), SIZE_MAX);
  pool.deallocate(p);
  void* again = pool.allocate(request - 4096, 4096, HugeWant::yes);
  EXPECT_EQ(again, p);
  s = pool.stats();
  EXPECT_EQ(s.chunk_reservations, 1u);
  EXPECT_EQ(s.recycles, 1u);
  pool.deallocate(again);
  EXPECT_CONSISTENT(pool);
}

TEST_F(PoolTest, A2Point1GiBRequestReservesAtMostItsSizePlusOneChunk) {
  PoolOptions o;  // default 64 MiB chunks
  Pool pool(o);
  const size_t request = GiB * 21 / 10;
  void* p = pool.allocate(request);
  write_pattern(p, request, 4);
  const PoolStats s = pool.stats();
  EXPECT_LE(reserved(s), request + o.chunk_bytes);
  EXPECT_EQ(s.kind[1].in_use.current, round_up(request, 256));
  EXPECT_EQ(check_pattern(p, request, 4), SIZE_MAX);
  pool.deallocate(p);
  EXPECT_GE(pool.trim(0), request);
  EXPECT_EQ(reserved(pool.stats()), 0u);
}

// ---- zeroing -------------------------------------------------------------------

TEST_F(PoolTest, ZeroRecycledZeroesDirtyMemoryOnlyWhenAsked) {
  for (bool zero : {true, false}) {
    PoolOptions o = small_chunks(4 * MiB);
    o.zero_recycled = zero;
    Pool pool(o);
    void* p = pool.allocate(MiB + 100, 64, HugeWant::no);
    EXPECT_TRUE(all_zero(p, MiB + 100)) << "fresh memory is not zero";
    std::memset(p, 0xAB, MiB + 100);
    pool.deallocate(p);
    std::memset(p, 0xCD, MiB + 100);  // poison the freed block
    void* q = pool.allocate(MiB + 100, 64, HugeWant::no);
    ASSERT_EQ(q, p);
    EXPECT_EQ(pool.stats().recycles, 1u);
    if (zero)
      EXPECT_TRUE(all_zero(q, MiB + 100)) << "zero_recycled is on but recycled memory is dirty";
    else
      EXPECT_EQ(static_cast<uint8_t*>(q)[MiB], 0xCD) << "zero_recycled is off but the memory was zeroed";
    pool.deallocate(q);
  }
}

TEST_F(PoolTest, ZeroOnRequestClearsOnlyThatAllocationsRecycledBytes) {
  Pool pool(small_chunks(8 * MiB));  // zero_recycled off: the default
  std::mt19937_64 rng(21);
  const size_t n = 3 * MiB + 77;
  void* p = pool.allocate(n, 64, HugeWant::yes);
  ASSERT_TRUE(all_zero(p, n)) << "fresh memory is not zero";
  auto* b = static_cast<uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(rng() | 1);  // random, never zero
  pool.deallocate(p);
  void* q = pool.allocate(n, 64, HugeWant::yes, /*zero=*/true);
  ASSERT_EQ(q, p);
  EXPECT_TRUE(all_zero(q, n)) << "zero=true handed out another allocation's bytes";
  PoolStats s = pool.stats();
  EXPECT_EQ(s.zeroed_bytes, round_up(n, 64)) << "only the recycled bytes are cleared";
  std::memset(q, 0x5A, n);
  pool.deallocate(q);
  void* r = pool.allocate(n, 64, HugeWant::yes);  // no zero asked: the old bytes stay
  ASSERT_EQ(r, p);
  EXPECT_EQ(static_cast<uint8_t*>(r)[n / 2], 0x5A);
  EXPECT_EQ(pool.stats().zeroed_bytes, s.zeroed_bytes);
  // Part recycled, part fresh: only the recycled part counts.
  void* fresh_too = pool.allocate(5 * MiB, 64, HugeWant::yes, true);
  EXPECT_TRUE(all_zero(fresh_too, 5 * MiB));
  pool.deallocate(r);
  pool.deallocate(fresh_too);
  EXPECT_CONSISTENT(pool);
}

TEST_F(PoolTest, ZeroRecycledClearsABigRangeInParallel) {
  PoolOptions o = small_chunks(8 * MiB);
  o.zero_recycled = true;
  o.touch_threads = 3;
  Pool pool(o);
  const size_t n = 80 * MiB + 4096;  // above the parallel threshold, odd shares
  auto* p = static_cast<uint8_t*>(pool.allocate(n, 4096));
  std::mt19937_64 rng(22);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t v = rng() | 0x0101010101010101ull;
    std::memcpy(p + i, &v, 8);
  }
  pool.deallocate(p);
  auto* q = static_cast<uint8_t*>(pool.allocate(n, 4096));
  ASSERT_EQ(q, p);
  EXPECT_TRUE(all_zero(q, n)) << "a recycled byte survived";
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.zeroed_bytes, n);
  EXPECT_GT(s.zero_ns, 0u);
  pool.deallocate(q);
}

TEST_F(PoolTest, AllocateCachedNeverReservesNorWaits) {
  Pool pool(small_chunks(8 * MiB));
  EXPECT_EQ(pool.allocate_cached(MiB), nullptr) << "an empty pool has nothing cached";
  EXPECT_EQ(pool.stats().chunk_reservations, 0u);
  void* p = pool.allocate(MiB, 256, HugeWant::no);
  std::memset(p, 0x77, MiB);
  pool.deallocate(p);
  void* q = pool.allocate_cached(MiB, 256, HugeWant::no, /*zero=*/true);
  ASSERT_EQ(q, p);
  EXPECT_TRUE(all_zero(q, MiB));
  void* r = pool.allocate_cached(2 * MiB, 4096, HugeWant::no);  // the rest of the chunk
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(pool.allocate_cached(7 * MiB, 256, HugeWant::no), nullptr) << "does not fit what is cached";
  EXPECT_THROW(pool.allocate_cached(0), InvalidArgument);
  EXPECT_EQ(pool.stats().chunk_reservations, 1u);
  pool.deallocate(q);
  pool.deallocate(r);
  EXPECT_CONSISTENT(pool);
}

TEST_F(PoolTest, AllocateCachedDoesNotWaitForTheTarget) {
  class Slow : public ChunkHooks {
   public:
    void on_chunk_ready(void*, size_t) override { std::this_thread::sleep_for(std::chrono::milliseconds(300)); }
    void on_chunk_release(void*, size_t) noexcept override {}
  };
  PoolOptions o = small_chunks(4 * MiB);
  o.target_bytes = 8 * MiB;
  Pool pool(o, std::make_shared<Slow>());
  // Had it waited for the target (300 ms of registration), the target would have served it.
  EXPECT_EQ(pool.allocate_cached(MiB), nullptr);
  pool.wait_ready();
  void* p = pool.allocate_cached(8 * MiB);
  EXPECT_NE(p, nullptr) << "the target is in: it serves from it";
  pool.deallocate(p);
}

// ---- trim ------------------------------------------------------------------------

TEST_F(PoolTest, TrimReleasesIdleChunksAndFreePartsOfUsedOnes) {
  Pool pool(small_chunks(8 * MiB));
  void* kept = pool.allocate(3 * MiB, 4096, HugeWant::yes);  // huge chunk [0, 3) used
  void* gone = pool.allocate(4 * MiB, 2 * MiB, HugeWant::yes);  // [4, 8)
  write_pattern(kept, 3 * MiB, 5);
  std::memset(gone, 0xEE, 4 * MiB);
  pool.deallocate(gone);
  void* small = pool.allocate(MiB, 4096, HugeWant::no);  // a small chunk, then idle
  pool.deallocate(small);
  PoolStats before = pool.stats();
  EXPECT_EQ(cached(before), 5 * MiB + 8 * MiB) << describe(before);

  // The huge chunk has huge pages unless this kernel refused them (then
  // 4 KiB pages and a 4 KiB release granule).
  const bool huge_pages = before.chunks_by_backing[static_cast<int>(Backing::small_pages)] == 1;
  const size_t part = huge_pages ? 4 * MiB : 5 * MiB;

  const size_t n = pool.trim(0);
  PoolStats after = pool.stats();
  EXPECT_EQ(accounting_violation(after), "") << describe(after);
  // The idle small chunk is unmapped; in the huge chunk the 2 MiB-aligned
  // free part [4, 8) MiB goes back, [3, 4) stays cached.
  EXPECT_EQ(n, 8 * MiB + part);
  EXPECT_EQ(after.chunk_releases, 1u);
  EXPECT_EQ(after.kind[0].reserved.current, 0u);
  EXPECT_EQ(after.kind[1].released.current, part);
  EXPECT_EQ(after.kind[1].cached.current, 5 * MiB - part);
  EXPECT_EQ(check_pattern(kept, 3 * MiB, 5), SIZE_MAX) << "trim touched live memory";

  // Released memory comes back zero and committed.
  void* back = pool.allocate(4 * MiB, 2 * MiB, HugeWant::yes);
  EXPECT_EQ(back, gone);
  EXPECT_TRUE(all_zero(back, 4 * MiB));
  PoolStats reused = pool.stats();
  EXPECT_EQ(reused.kind[1].released.current, 0u);
  EXPECT_EQ(reused.kind[1].committed.current, 8 * MiB);
  EXPECT_EQ(reused.recycles, 0u) << "released memory is not dirty, so not a recycle";
  EXPECT_CONSISTENT(pool);
  pool.deallocate(back);
  pool.deallocate(kept);
  EXPECT_EQ(pool.trim(100 * MiB), 0u) << "keep_bytes above what is cached releases nothing";
  EXPECT_EQ(pool.trim(0), 8 * MiB);
  const PoolStats empty = pool.stats();
  EXPECT_EQ(reserved(empty), 0u);
  EXPECT_EQ(released(empty), 0u);
  EXPECT_CONSISTENT(pool);
}

TEST_F(PoolTest, TrimKeepsWhatItIsAskedToKeep) {
  Pool pool(small_chunks(4 * MiB));
  std::vector<void*> v;
  for (int i = 0; i < 4; ++i) v.push_back(pool.allocate(4 * MiB, 4096, HugeWant::no));
  for (void* p : v) pool.deallocate(p);
  EXPECT_EQ(pool.trim(8 * MiB), 8 * MiB);
  EXPECT_EQ(cached(pool.stats()), 8 * MiB);
  EXPECT_EQ(pool.stats().chunk_releases, 2u);
}

// ---- hooks -------------------------------------------------------------------

TEST_F(PoolTest, HooksAreCalledOncePerChunkInPairs) {
  auto hooks = std::make_shared<RecordingHooks>();
  {
    Pool pool(small_chunks(4 * MiB), hooks);
    void* a = pool.allocate(3 * MiB, 256, HugeWant::no);
    void* b = pool.allocate(3 * MiB, 256, HugeWant::no);
    void* c = pool.allocate(9 * MiB, 256, HugeWant::yes);  // dedicated 10 MiB chunk
    EXPECT_EQ(hooks->events().size(), 3u);
    pool.deallocate(b);
    pool.deallocate(c);
    void* d = pool.allocate(MiB, 256, HugeWant::no);  // from a's chunk: no new chunk
    EXPECT_EQ(hooks->events().size(), 3u);
    // With hooks (pinned memory) trim releases whole chunks only: never MADV_DONTNEED.
    EXPECT_EQ(pool.trim(0), 4 * MiB + 10 * MiB);
    const PoolStats s = pool.stats();
    EXPECT_EQ(released(s), 0u);
    EXPECT_EQ(s.chunk_releases, 2u);
    EXPECT_GT(s.register_ns, 0u);
    EXPECT_EQ(hooks->events().size(), 5u);
    pool.deallocate(a);
    pool.deallocate(d);
  }
  expect_paired(hooks->events());
  EXPECT_EQ(hooks->events().size(), 6u);
}

TEST_F(PoolTest, AThrowingHookFailsTheAllocationWithoutALeak) {
  auto hooks = std::make_shared<RecordingHooks>();
  hooks->throw_on_call(0);
  {
    Pool pool(small_chunks(4 * MiB), hooks);
    try {
      pool.allocate(MiB);
      FAIL() << "no exception";
    } catch (const CudaError& e) {
      EXPECT_STREQ(e.what(), "injected registration failure");
    }
    const PoolStats s = pool.stats();
    EXPECT_EQ(reserved(s), 0u);
    EXPECT_EQ(s.chunk_reservations, 0u);
    EXPECT_EQ(s.allocations, 0u);
    // The refused chunk is unmapped.
    const auto refused = hooks->events().at(0);
    EXPECT_EQ(os::range_is_mapped(reinterpret_cast<void*>(refused.base), refused.bytes), ENOMEM)
        << "the chunk refused by the hook is still mapped";
    void* p = pool.allocate(MiB);  // the next chunk is accepted
    pool.deallocate(p);
    EXPECT_CONSISTENT(pool);
  }
  expect_paired(hooks->events(), /*failed_ready_calls=*/1);
}

// ---- chunks() and chunk_generation(): what a registrar (NIXL) follows ---------

// chunks() is sorted and disjoint, and every allocation given lies in one chunk.
void expect_chunks_cover(const std::vector<Pool::ChunkView>& v,
                         const std::vector<std::pair<void*, size_t>>& allocations) {
  for (size_t i = 1; i < v.size(); ++i) EXPECT_LE(v[i - 1].base + v[i - 1].bytes, v[i].base);
  for (const auto& [p, n] : allocations) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    const bool inside = std::any_of(v.begin(), v.end(), [&](const Pool::ChunkView& c) {
      return c.base <= a && a + n <= c.base + c.bytes;
    });
    EXPECT_TRUE(inside) << "allocation at " << std::hex << a << " is in no listed chunk";
  }
}

TEST_F(PoolTest, ChunksAndTheirGenerationFollowInsertionTrimAndPartRelease) {
  Pool pool(small_chunks(8 * MiB));
  EXPECT_TRUE(pool.chunks().empty());
  EXPECT_EQ(pool.chunk_generation(), 0u);
  void* kept = pool.allocate(3 * MiB, 4096, HugeWant::yes);
  const uint64_t g1 = pool.chunk_generation();
  EXPECT_GT(g1, 0u);
  std::vector<Pool::ChunkView> v = pool.chunks();
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].bytes, 8 * MiB);
  EXPECT_EQ(v[0].generation, g1);
  expect_chunks_cover(v, {{kept, 3 * MiB}});
  const uintptr_t huge_base = v[0].base;

  // Recycling and freeing inside a chunk change nothing a registrar sees.
  pool.deallocate(pool.allocate(MiB, 256, HugeWant::yes));
  EXPECT_EQ(pool.chunk_generation(), g1);

  void* small = pool.allocate(MiB + 3, 64, HugeWant::no);  // a second (small) chunk
  const uint64_t g2 = pool.chunk_generation();
  EXPECT_GT(g2, g1);
  v = pool.chunks();
  ASSERT_EQ(v.size(), 2u);
  expect_chunks_cover(v, {{kept, 3 * MiB}, {small, MiB + 3}});
  for (const Pool::ChunkView& c : v) EXPECT_EQ(c.generation, c.base == huge_base ? g1 : g2);
  pool.deallocate(small);
  EXPECT_EQ(pool.chunk_generation(), g2);

  // trim: the idle small chunk leaves the list; the huge chunk stays, but its
  // free tail went back to the OS, so its generation moves (register it again).
  ASSERT_GT(pool.trim(0), 8 * MiB);
  const uint64_t g3 = pool.chunk_generation();
  EXPECT_GT(g3, g2);
  v = pool.chunks();
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].base, huge_base);
  EXPECT_EQ(v[0].generation, g3);
  EXPECT_EQ(pool.trim(0), 0u);
  EXPECT_EQ(pool.chunk_generation(), g3) << "a trim that releases nothing moves nothing";
  pool.deallocate(kept);
  EXPECT_GT(pool.trim(0), 0u);
  EXPECT_TRUE(pool.chunks().empty());
  EXPECT_GT(pool.chunk_generation(), g3);
  EXPECT_CONSISTENT(pool);
}

TEST_F(PoolTest, ChunksOfAHookedPoolAreTheChunksItsHooksHold) {
  auto hooks = std::make_shared<RecordingHooks>();
  Pool pool(small_chunks(4 * MiB), hooks);
  auto listed = [&] {
    std::vector<std::pair<uintptr_t, size_t>> out;
    for (const Pool::ChunkView& c : pool.chunks()) out.emplace_back(c.base, c.bytes);
    return out;
  };
  auto held = [&] {
    auto h = hooks->live_chunks();
    std::sort(h.begin(), h.end());
    return h;
  };
  void* a = pool.allocate(3 * MiB, 256, HugeWant::no);
  void* b = pool.allocate(3 * MiB, 256, HugeWant::no);
  void* c = pool.allocate(9 * MiB, 256, HugeWant::yes);  // a dedicated 10 MiB chunk
  EXPECT_EQ(listed(), held());
  EXPECT_EQ(listed().size(), 3u);
  auto generation_of = [&](void* p) {
    for (const Pool::ChunkView& c : pool.chunks())
      if (c.base <= reinterpret_cast<uintptr_t>(p) && reinterpret_cast<uintptr_t>(p) < c.base + c.bytes)
        return c.generation;
    ADD_FAILURE() << "no chunk holds " << p;
    return uint64_t{0};
  };
  const uint64_t a_generation = generation_of(a);
  pool.deallocate(b);
  pool.deallocate(c);
  pool.trim(0);  // whole chunks only (never MADV_DONTNEED pinned memory)
  EXPECT_EQ(listed(), held());
  ASSERT_EQ(listed().size(), 1u);
  EXPECT_EQ(generation_of(a), a_generation) << "a's chunk kept its pages";
  pool.deallocate(a);
}

TEST_F(PoolTest, ChunkSnapshotsStayConsistentWhileThePoolChanges) {
  Pool pool(small_chunks(2 * MiB));
  std::atomic<bool> done{false};
  std::thread churn([&] {
    std::mt19937_64 rng(7);
    std::vector<void*> live;
    for (int i = 0; i < 400; ++i) {
      if (live.size() < 6 && rng() % 3 != 0) {
        live.push_back(pool.allocate(size_t{1} << (12 + rng() % 10), 4096, HugeWant::no));
      } else if (!live.empty()) {
        const size_t k = rng() % live.size();
        pool.deallocate(live[k]);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
      }
      if (i % 50 == 49) pool.trim(0);
    }
    for (void* p : live) pool.deallocate(p);
    done = true;
  });
  uint64_t last = 0;
  int snapshots = 0;
  while (!done || snapshots == 0) {
    const uint64_t before = pool.chunk_generation();
    EXPECT_GE(before, last) << "the generation never goes back";
    last = before;
    const std::vector<Pool::ChunkView> v = pool.chunks();
    const uint64_t after = pool.chunk_generation();
    expect_chunks_cover(v, {});
    for (const Pool::ChunkView& c : v) {
      EXPECT_EQ(c.bytes % (2 * MiB), 0u);
      EXPECT_LE(c.generation, after) << "a chunk's generation is one the pool has reached";
    }
    ++snapshots;
  }
  churn.join();
  EXPECT_GT(pool.chunk_generation(), 0u);
  pool.trim(0);
  EXPECT_TRUE(pool.chunks().empty());
  EXPECT_CONSISTENT(pool);
}

// ---- limit -----------------------------------------------------------------------

TEST_F(PoolTest, TheLimitIsHardAndItsMessageSaysWhy) {
  PoolOptions o = small_chunks(8 * MiB);
  o.limit_bytes = 32 * MiB;
  Pool pool(o);
  std::vector<void*> v;
  for (int i = 0; i < 4; ++i) v.push_back(pool.allocate(6 * MiB, 256, HugeWant::no));
  try {
    pool.allocate(4 * MiB, 256, HugeWant::no);
    FAIL() << "the limit was not enforced";
  } catch (const OutOfMemory& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("ferry pool limit of 32 MiB reached: 32 MiB reserved (24 MiB in use)"), std::string::npos) << m;
    EXPECT_NE(m.find("request of 4 MiB needs a new 8 MiB chunk"), std::string::npos) << m;
    EXPECT_EQ(e.status(), FERRY_ERROR_OUT_OF_MEMORY);
  }
  EXPECT_EQ(reserved(pool.stats()), 32 * MiB);
  // Still works: the free remainders of chunks serve small requests.
  void* small = pool.allocate(MiB, 256, HugeWant::no);
  pool.deallocate(small);
  // Idle chunks are released to make room for a request that needs a new chunk.
  pool.deallocate(v[0]);
  pool.deallocate(v[1]);
  void* big = pool.allocate(16 * MiB, 256, HugeWant::yes);
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.chunk_releases, 2u);
  EXPECT_EQ(reserved(s), 32 * MiB);
  EXPECT_CONSISTENT(pool);
  pool.deallocate(big);
  pool.deallocate(v[2]);
  pool.deallocate(v[3]);
}

// Tracks the bytes of chunks that are mapped and ready, and their maximum.
class MappedBytesHooks : public ChunkHooks {
 public:
  void on_chunk_ready(void*, size_t bytes) override {
    std::lock_guard lock(mu_);
    current_ += bytes;
    peak_ = std::max(peak_, current_);
  }
  void on_chunk_release(void*, size_t bytes) noexcept override {
    std::lock_guard lock(mu_);
    current_ -= bytes;
  }
  size_t peak() const {
    std::lock_guard lock(mu_);
    return peak_;
  }

 private:
  mutable std::mutex mu_;
  size_t current_ = 0, peak_ = 0;
};

TEST_F(PoolTest, ConcurrentReservationsNeverExceedTheLimit) {
  PoolOptions o = small_chunks(4 * MiB);
  o.limit_bytes = 20 * MiB;
  auto hooks = std::make_shared<MappedBytesHooks>();
  Pool pool(o, hooks);
  std::atomic<int> failures{0};
  std::latch all_allocated(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::vector<void*> mine;
      for (int i = 0; i < 3; ++i) {
        try {  // 3 MiB: each needs a 4 MiB chunk of its own
          mine.push_back(pool.allocate(3 * MiB, 256, t % 2 ? HugeWant::yes : HugeWant::no));
        } catch (const OutOfMemory& e) {
          EXPECT_NE(std::string(e.what()).find("limit of 20 MiB"), std::string::npos) << e.what();
          ++failures;
        }
      }
      all_allocated.arrive_and_wait();  // everyone holds what they got
      for (void* p : mine) pool.deallocate(p);
    });
  for (auto& th : threads) th.join();
  EXPECT_LE(hooks->peak(), 20 * MiB) << "more memory was mapped than the limit allows";
  EXPECT_EQ(failures.load(), 12 - 5) << "twelve 4 MiB chunks wanted, five fit in 20 MiB";
  EXPECT_LE(reserved(pool.stats()), 20 * MiB);
  EXPECT_CONSISTENT(pool);
}

// ---- bad input -------------------------------------------------------------------

TEST_F(PoolTest, BadInputIsRejectedAndChangesNothing) {
  Pool pool(small_chunks(4 * MiB));
  void* live = pool.allocate(4096, 256, HugeWant::no);
  void* freed = pool.allocate(8192, 256, HugeWant::no);
  pool.deallocate(freed);
  int on_stack = 0;
  void* from_malloc = std::malloc(64);

  struct Bad {
    const char* what;
    std::function<void()> call;
    const char* message;
  };
  const Bad cases[] = {
      {"double free", [&] { pool.deallocate(freed); }, "already freed (it was an allocation of 8192 bytes)"},
      {"stack pointer", [&] { pool.deallocate(&on_stack); }, "not allocated by this pool"},
      {"malloc pointer", [&] { pool.deallocate(from_malloc); }, "not allocated by this pool"},
      {"interior pointer", [&] { pool.deallocate(static_cast<char*>(live) + 100); },
       "points inside an allocation of 4096 bytes starting at 0x"},
      {"in a chunk, never allocated", [&] { pool.deallocate(static_cast<char*>(live) + 3 * MiB); },
       "not the start of a live allocation"},
      {"null", [&] { pool.deallocate(nullptr); }, "null pointer"},
      {"size 0", [&] { pool.allocate(0); }, "cannot allocate 0 bytes"},
      {"SIZE_MAX", [&] { pool.allocate(SIZE_MAX); }, "beyond the 128 TiB address space"},
      {"2^47 + 1", [&] { pool.allocate((size_t{1} << 47) + 1); }, "beyond the 128 TiB address space"},
      {"alignment 3", [&] { pool.allocate(64, 3); }, "alignment 3 is not a power of two"},
      {"alignment 0", [&] { pool.allocate(64, 0); }, "alignment 0 is not a power of two"},
      {"alignment 4 MiB", [&] { pool.allocate(64, 4 * MiB); }, "alignment 4194304 (4 MiB) is above the 2 MiB maximum"},
  };
  for (const Bad& c : cases) {
    const PoolStats before = pool.stats();
    try {
      c.call();
      ADD_FAILURE() << c.what << ": accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos) << c.what << ": " << e.what();
    }
    expect_same_stats(pool.stats(), before);
    EXPECT_EQ(pool.allocation_size(live), 4096u) << c.what;
  }
  std::free(from_malloc);
  pool.deallocate(live);
  EXPECT_CONSISTENT(pool);
}

TEST_F(PoolTest, ADoubleFreeOfMemoryHandedOutAgainNamesBoth) {
  Pool pool(small_chunks(4 * MiB));
  void* first = pool.allocate(4096, 256, HugeWant::no);
  void* second = pool.allocate(8192, 256, HugeWant::no);
  pool.deallocate(first);
  pool.deallocate(second);
  void* covering = pool.allocate(16384, 256, HugeWant::no);  // over both freed blocks
  ASSERT_EQ(covering, first);
  const PoolStats before = pool.stats();
  try {
    pool.deallocate(second);
    FAIL() << "double free accepted";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("already freed (it was an allocation of 8192 bytes); the memory now belongs to an "
                     "allocation of 16384 bytes starting at 0x"),
              std::string::npos)
        << m;
  }
  expect_same_stats(pool.stats(), before);
  EXPECT_EQ(pool.allocation_size(covering), 16384u);
  pool.deallocate(covering);
}

TEST_F(PoolTest, AllocationSizeIsForStartsOfLiveAllocationsOnly) {
  Pool pool(small_chunks(4 * MiB));
  void* p = pool.allocate(1000, 64);
  EXPECT_EQ(pool.allocation_size(p), 1024u);
  EXPECT_EQ(pool.allocation_size(static_cast<char*>(p) + 1), 0u);
  int x = 0;
  EXPECT_EQ(pool.allocation_size(&x), 0u);
  pool.deallocate(p);
  EXPECT_EQ(pool.allocation_size(p), 0u);
}

TEST_F(PoolTest, OptionsAreChecked) {
  const struct {
    const char* what;
    PoolOptions options;
    const char* message;
  } cases[] = {
      {"chunk 3 MiB", [] { PoolOptions o; o.chunk_bytes = 3 * MiB; return o; }(),
       "chunk_bytes=3145728 (3 MiB): expected a nonzero multiple of 2 MiB"},
      {"chunk 0", [] { PoolOptions o; o.chunk_bytes = 0; return o; }(), "chunk_bytes=0"},
      {"touch threads", [] { PoolOptions o; o.touch_threads = -1; return o; }(), "touch_threads=-1"},
      {"delay", [] { PoolOptions o; o.release_delay_ms = -5; return o; }(), "release_delay_ms=-5"},
  };
  for (const auto& c : cases) {
    try {
      Pool pool(c.options);
      ADD_FAILURE() << c.what << ": accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos) << c.what << ": " << e.what();
    }
  }
}

TEST_F(PoolTest, OptionsFromTheEnvironmentTable) {
  const PoolOptions d = PoolOptions::from_options(Options::parse({}));
  EXPECT_EQ(d.chunk_bytes, 64 * MiB);
  EXPECT_EQ(d.huge_pages, HugePolicy::automatic);
  EXPECT_EQ(d.release_batch_bytes, 128 * MiB);
  EXPECT_FALSE(d.zero_recycled);
  const PoolOptions o = PoolOptions::from_options(Options::parse({{"FERRY_CHUNK_SIZE", "32MiB"},
                                                                  {"FERRY_HUGE_PAGES", "thp"},
                                                                  {"FERRY_POOL_LIMIT", "1G"},
                                                                  {"FERRY_RELEASE_BATCH", "64MiB"},
                                                                  {"FERRY_RELEASE_DELAY_MS", "250"},
                                                                  {"FERRY_TOUCH_THREADS", "3"},
                                                                  {"FERRY_ZERO_RECYCLED", "yes"}}));
  EXPECT_EQ(o.chunk_bytes, 32 * MiB);
  EXPECT_EQ(o.huge_pages, HugePolicy::thp);
  EXPECT_EQ(o.limit_bytes, GiB);
  EXPECT_EQ(o.release_batch_bytes, 64 * MiB);
  EXPECT_EQ(o.release_delay_ms, 250);
  EXPECT_EQ(o.touch_threads, 3);
  EXPECT_TRUE(o.zero_recycled);
  for (const auto& [name, value, message] :
       std::vector<std::tuple<const char*, const char*, const char*>>{
           {"FERRY_CHUNK_SIZE", "3MiB", "FERRY_CHUNK_SIZE='3MiB': expected a nonzero multiple of 2 MiB"},
           {"FERRY_TOUCH_THREADS", "-2", "FERRY_TOUCH_THREADS='-2'"},
           {"FERRY_RELEASE_DELAY_MS", "-1", "FERRY_RELEASE_DELAY_MS='-1'"},
           {"FERRY_HUGE_PAGES", "maybe", "maybe"}}) {
    try {
      PoolOptions::from_options(Options::parse({{name, value}}));
      ADD_FAILURE() << name << "=" << value << " accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
}

// ---- fault injection -------------------------------------------------------------

TEST_F(PoolTest, FailedMmapFailsTheAllocationAndThePoolRecovers) {
  Pool pool(small_chunks(4 * MiB));
  set_fault_injection("mmap:0");
  const PoolStats before = pool.stats();
  try {
    pool.allocate(MiB);
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), FERRY_ERROR_OUT_OF_MEMORY);
    EXPECT_NE(std::string(e.what()).find("mmap of a 4 MiB pool chunk failed"), std::string::npos) << e.what();
  }
  expect_same_stats(pool.stats(), before);
  set_fault_injection("");
  void* p = pool.allocate(MiB);
  pool.deallocate(p);
  EXPECT_CONSISTENT(pool);
}

TEST_F(PoolTest, FailedMadviseIsAFallbackNote) {
  // Documented choice: a refused madvise is a fallback (noted, remembered),
  // not an error; the allocation succeeds.
  Pool pool(small_chunks(4 * MiB));
  set_fault_injection("madvise:0+");
  void* s = pool.allocate(MiB, 256, HugeWant::no);
  void* h = pool.allocate(3 * MiB, 256, HugeWant::yes);
  const PoolStats st = pool.stats();
  std::string notes;
  for (const auto& n : st.notes) notes += n + "\n";
  EXPECT_NE(notes.find("madvise(MADV_NOHUGEPAGE) refused (Invalid argument)"), std::string::npos) << notes;
  EXPECT_GE(st.fallbacks, 1u);
  pool.deallocate(s);
  pool.deallocate(h);
  // A failing MADV_DONTNEED in trim leaves the memory cached and consistent.
  void* keep = pool.allocate(MiB, 256, HugeWant::no);
  const uint64_t cached_before = cached(pool.stats());
  pool.trim(0);  // idle huge chunk is unmapped (no madvise); the small chunk's parts fail
  EXPECT_EQ(pool.stats().kind[0].cached.current, 3 * MiB);
  EXPECT_LT(cached(pool.stats()), cached_before);
  EXPECT_CONSISTENT(pool);
  set_fault_injection("");
  EXPECT_EQ(pool.trim(0), 3 * MiB);
  pool.deallocate(keep);
  EXPECT_CONSISTENT(pool);
}

TEST_F(PoolTest, FailedTouchFailsCleanly) {
  Pool pool(small_chunks(4 * MiB));
  set_fault_injection("touch:0");
  try {
    pool.allocate(MiB);
    FAIL() << "no exception";
  } catch (const OsError& e) {
    EXPECT_NE(std::string(e.what()).find("first touch of a 4 MiB pool chunk"), std::string::npos) << e.what();
  }
  EXPECT_EQ(reserved(pool.stats()), 0u);
  set_fault_injection("");
  pool.deallocate(pool.allocate(MiB));
  EXPECT_CONSISTENT(pool);
}

TEST_F(PoolTest, FailedMemfdFailsCleanly) {
  PoolOptions o = small_chunks(4 * MiB);
  o.memfd = true;
  Pool pool(o);
  set_fault_injection("memfd:0");
  try {
    pool.allocate(MiB);
    FAIL() << "no exception";
  } catch (const OsError& e) {
    EXPECT_NE(std::string(e.what()).find("memfd_create"), std::string::npos) << e.what();
  }
  EXPECT_EQ(reserved(pool.stats()), 0u);
  set_fault_injection("");
  pool.deallocate(pool.allocate(MiB));
}

// ---- memfd -----------------------------------------------------------------------

TEST_F(PoolTest, MemfdPoolMemoryIsSharedThroughItsDescriptor) {
  PoolOptions o = small_chunks(4 * MiB);
  o.memfd = true;
  o.zero_recycled = true;
  Pool pool(o);
  std::vector<Live> live;
  std::mt19937_64 rng(6);
  for (int i = 0; i < 40; ++i) {
    const size_t size = 1 + rng() % (3 * MiB);
    void* p = pool.allocate(size, 4096, static_cast<HugeWant>(rng() % 3));
    const uint64_t seed = rng();
    write_pattern(p, size, seed);
    live.push_back({reinterpret_cast<uintptr_t>(p), round_up(size, 4096), size, seed, PageKind::small});
  }
  expect_no_overlap(live);
  // Map one allocation's pages a second time from the descriptor: same bytes.
  const Live& l = live[7];
  const Pool::SharedLocation where = pool.shared_location(reinterpret_cast<void*>(l.begin));
  ASSERT_GE(where.fd, 0);
  EXPECT_EQ(where.offset % 4096, 0u);
  void* view = mmap(nullptr, round_up(l.size, 4096), PROT_READ | PROT_WRITE, MAP_SHARED, where.fd,
                    static_cast<off_t>(where.offset));
  ASSERT_NE(view, MAP_FAILED);
  EXPECT_EQ(check_pattern(view, l.bytes, l.seed), SIZE_MAX);
  static_cast<char*>(view)[0] = static_cast<char>(~pattern_byte(l.seed, 0));
  EXPECT_EQ(reinterpret_cast<char*>(l.begin)[0], static_cast<char>(~pattern_byte(l.seed, 0)));
  static_cast<char*>(view)[0] = static_cast<char>(pattern_byte(l.seed, 0));
  munmap(view, round_up(l.size, 4096));
  for (const Live& x : live) {
    EXPECT_EQ(check_pattern(reinterpret_cast<void*>(x.begin), x.bytes, x.seed), SIZE_MAX);
    pool.deallocate(reinterpret_cast<void*>(x.begin));
  }
  int on_stack = 0;
  EXPECT_EQ(pool.shared_location(&on_stack).fd, -1);
  EXPECT_GT(pool.trim(0), 0u);
  EXPECT_CONSISTENT(pool);
}

// ---- speed -------------------------------------------------------------------------

TEST_F(PoolTest, RecycledAllocateAndFreeOf1MiBTakesMicroseconds) {
  Pool pool(small_chunks(64 * MiB));
  std::vector<void*> background;  // a few live allocations so the maps are not trivial
  for (int i = 0; i < 64; ++i) background.push_back(pool.allocate(4096 * (1 + i % 7), 256, HugeWant::no));
  pool.deallocate(pool.allocate(MiB, 256, HugeWant::no));
  std::vector<double> ns;
  for (int i = 0; i < 20000; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    void* p = pool.allocate(MiB, 256, HugeWant::no);
    pool.deallocate(p);
    ns.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(ns.begin(), ns.begin() + ns.size() / 2, ns.end());
  const double median_us = ns[ns.size() / 2] / 1000.0;
  RecordProperty("median_us", std::to_string(median_us));
  EXPECT_LE(median_us, kSanitized ? 50.0 : 2.0) << "median allocate+free of a recycled 1 MiB block";
  EXPECT_EQ(pool.stats().chunk_reservations, 1u);
  for (void* p : background) pool.deallocate(p);
}

}  // namespace
}  // namespace ferry
