// managed_pool_test.cpp — the managed pool's bookkeeping with plain host memory
// as chunks and test fences: size classes; stream-ordered reuse (same stream at
// once, another stream only after the fence is ready or after it was made to
// wait); coalescing; trim; the out-of-memory retry; foreign pointers; and a
// random multi-stream run (single- and multi-threaded) that fills every live
// allocation with its own byte and checks it on free (an overlap would show),
// checks every reuse against the rules, and ends with all stats back at zero.
#include "managed/managed_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "core/error.h"

namespace ferry {
namespace {

constexpr size_t KiB = 1024, MiB = 1024 * 1024;

// ---- test doubles -----------------------------------------------------------

struct FenceState {
  std::atomic<bool> ready{false};
  bool allow_wait = true;
  std::mutex mu;
  std::vector<StreamId> waited_by;  // streams order_before was granted to
  std::atomic<int> destroyed{0};

  bool waited(StreamId s) {
    std::lock_guard lk(mu);
    for (StreamId w : waited_by)
      if (w == s) return true;
    return false;
  }
};

class TestFence : public Fence {
 public:
  explicit TestFence(std::shared_ptr<FenceState> s) : s_(std::move(s)) {}
  ~TestFence() override { ++s_->destroyed; }
  bool ready() noexcept override { return s_->ready.load(); }
  bool order_before(StreamId stream) noexcept override {
    if (!s_->allow_wait) return false;
    std::lock_guard lk(s_->mu);
    s_->waited_by.push_back(stream);
    return true;
  }

 private:
  std::shared_ptr<FenceState> s_;
};

std::unique_ptr<Fence> fence_of(const std::shared_ptr<FenceState>& s) {
  return std::make_unique<TestFence>(s);
}

// Host memory chunks; counts what is outstanding; can be told to fail.
struct HostSource {
  std::mutex mu;
  std::map<void*, size_t> live;
  size_t obtains = 0, releases = 0;
  int fail_next = 0;       // throw OutOfMemory this many times
  size_t limit = SIZE_MAX;  // throw OutOfMemory beyond this many bytes outstanding
  std::vector<size_t> sizes;

  ChunkSource source() {
    return ChunkSource{
        [this](size_t n, StreamId) -> void* {
          std::lock_guard lk(mu);
          size_t held = 0;
          for (auto& [p, s] : live) held += s;
          if (fail_next > 0 || held + n > limit) {
            if (fail_next > 0) --fail_next;
            throw OutOfMemory("test source: no chunk of " + std::to_string(n));
          }
          void* p = std::aligned_alloc(4096, n);
          if (!p) throw OutOfMemory("aligned_alloc");
          live[p] = n;
          sizes.push_back(n);
          ++obtains;
          return p;
        },
        [this](void* p, size_t n) {
          std::lock_guard lk(mu);
          auto it = live.find(p);
          EXPECT_NE(it, live.end()) << "release of a chunk never obtained";
          if (it != live.end()) {
            EXPECT_EQ(it->second, n) << "released with another size";
            live.erase(it);
          }
          ++releases;
          std::free(p);
        }};
  }
  size_t outstanding() {
    std::lock_guard lk(mu);
    return live.size();
  }
};

ManagedPoolOptions small_opts() {
  ManagedPoolOptions o;
  o.chunk_bytes = 8 * MiB;
  return o;
}

constexpr StreamId s1 = 0x1001, s2 = 0x2002, s3 = 0x3003;

// Four 512 KiB blocks allocated on `stream`, in address order of allocation.
std::vector<void*> four_blocks(ManagedPool& pool, StreamId stream) {
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(pool.allocate(512 * KiB, stream).ptr);
  return blocks;
}

// ---- size classes -------------------------------------------------------------

TEST(ManagedPoolClasses, TableOfClasses) {
  struct Row {
    size_t n, cls;
  } rows[] = {
      {1, 512},
      {512, 512},
      {513, 1024},
      {1025, 1536},
      {2049, 2560},
      {4097, 5120},
      {MiB, MiB},
      {MiB + 1, MiB + 256 * KiB},
      {2 * MiB, 2 * MiB},
      {2 * MiB + 1, 2 * MiB + 512 * KiB},  // grid beats the next 2 MiB multiple
      {17 * MiB, 18 * MiB},                // the 2 MiB multiple beats the grid (20 MiB)
      {100 * MiB, 100 * MiB},
      {(4600ull << 20) + 1, (4602ull << 20)},
  };
  for (const Row& r : rows) EXPECT_EQ(ManagedPool::size_class(r.n), r.cls) << "n=" << r.n;
}

TEST(ManagedPoolClasses, ClassesCoverBoundWasteAndAreStable) {
  std::mt19937_64 rng(1);
  for (int i = 0; i < 200000; ++i) {
    size_t n = 1 + rng() % (1ull << (1 + rng() % 36));
    size_t c = ManagedPool::size_class(n);
    ASSERT_GE(c, n);
    ASSERT_EQ(c % 512, 0u);
    ASSERT_EQ(ManagedPool::size_class(c), c) << n;  // a class is its own class
    ASSERT_TRUE(n <= 512 || c - n <= n / 4 || c - n < 2 * MiB) << n << " -> " << c;
    ASSERT_LE(ManagedPool::size_class(n - (n > 1)), c) << "not monotone at " << n;
  }
  // monotone on a dense range
  size_t last = 0;
  for (size_t n = 1; n < 3 * MiB; n += 97) {
    size_t c = ManagedPool::size_class(n);
    ASSERT_GE(c, last);
    last = c;
  }
}

TEST(ManagedPoolClasses, ZeroAndAbsurdSizesAreRefused) {
  EXPECT_THROW(ManagedPool::size_class(0), InvalidArgument);
  EXPECT_THROW(ManagedPool::size_class(SIZE_MAX), InvalidArgument);
  HostSource src;
  ManagedPool pool(small_opts(), src.source());
  EXPECT_THROW(pool.allocate(0, s1), InvalidArgument);
  EXPECT_EQ(src.obtains, 0u);
}

TEST(ManagedPoolClasses, BadOptionsAndSourcesAreRefused) {
  HostSource src;
  ManagedPoolOptions o;
  o.chunk_bytes = 3 * MiB;
  EXPECT_THROW(ManagedPool(o, src.source()), InvalidArgument);
  o = ManagedPoolOptions{};
  o.small_chunk_bytes = 0;
  EXPECT_THROW(ManagedPool(o, src.source()), InvalidArgument);
  EXPECT_THROW(ManagedPool(ManagedPoolOptions{}, ChunkSource{}), InvalidArgument);
  ManagedPool pool(ManagedPoolOptions{}, src.source());
  o = ManagedPoolOptions{};
  o.chunk_bytes = 1;
  EXPECT_THROW(pool.set_options(o), InvalidArgument);
  EXPECT_EQ(pool.options().chunk_bytes, ManagedPoolOptions{}.chunk_bytes);
}

// ---- chunks -----------------------------------------------------------------

TEST(ManagedPoolChunks, SmallAndLargeRequestsUseTheirOwnChunks) {
  HostSource src;
  ManagedPool pool(small_opts(), src.source());
  auto a = pool.allocate(100, s1);
  EXPECT_TRUE(a.new_chunk);
  EXPECT_EQ(a.size, 512u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.ptr) % 512, 0u);
  auto b = pool.allocate(3 * MiB, s1);  // large: its own 8 MiB chunk
  EXPECT_TRUE(b.new_chunk);
  auto c = pool.allocate(20 * MiB, s1);  // larger than chunk_bytes: a chunk of its size
  EXPECT_TRUE(c.new_chunk);
  auto d = pool.allocate(700, s1);  // fits the small chunk
  EXPECT_FALSE(d.new_chunk);
  ASSERT_EQ(src.sizes.size(), 3u);
  EXPECT_EQ(src.sizes[0], 2 * MiB);
  EXPECT_EQ(src.sizes[1], 8 * MiB);
  EXPECT_EQ(src.sizes[2], 20 * MiB);
  EXPECT_EQ(pool.allocation_size(d.ptr), 1024u);
  EXPECT_EQ(pool.allocation_size(static_cast<char*>(d.ptr) + 1), 0u);
  ManagedPoolStats s = pool.stats();
  EXPECT_EQ(s.reserved.current, 30 * MiB);
  EXPECT_EQ(s.allocated.current, 512 + 3 * MiB + 20 * MiB + 1024);
  EXPECT_EQ(s.requested.current, 100 + 3 * MiB + 20 * MiB + 700);
  EXPECT_EQ(s.chunks, 3u);
  EXPECT_EQ(pool.check(), "");
  for (void* p : {a.ptr, b.ptr, c.ptr, d.ptr}) pool.deallocate(p, s1, nullptr);
  EXPECT_EQ(pool.check(), "");
  EXPECT_EQ(pool.stats().idle_blocks, 3u);  // each chunk one idle block again
  EXPECT_EQ(pool.trim(), 30 * MiB);
  EXPECT_EQ(src.outstanding(), 0u);
  s = pool.stats();
  EXPECT_EQ(s.reserved.current, 0u);
  EXPECT_EQ(s.reserved.peak, 30 * MiB);
  EXPECT_EQ(s.allocated.current, 0u);
  EXPECT_EQ(s.requested.current, 0u);
  EXPECT_EQ(s.allocations, 4u);
  EXPECT_EQ(s.frees, 4u);
  EXPECT_EQ(s.chunk_obtains, 3u);
  EXPECT_EQ(s.chunk_releases, 3u);
}

TEST(ManagedPoolChunks, EachGranuleIsClaimedForPrefetchOnce) {
  HostSource src;
  ManagedPool pool(small_opts(), src.source());  // large chunks of 8 MiB
  auto offset = [](const ManagedPool::Block& b, const ManagedPool::Block& base) {
    return static_cast<char*>(b.prefetch_ptr) - static_cast<char*>(base.ptr);
  };
  auto a = pool.allocate(3 * MiB, s1);  // [0, 3 MiB) of a fresh chunk: granules 0 and 1
  ASSERT_TRUE(a.new_chunk);
  EXPECT_EQ(a.prefetch_ptr, a.ptr);
  EXPECT_EQ(a.prefetch_bytes, 4 * MiB);
  auto b = pool.allocate(3 * MiB - 5, s1);  // [3, 6 MiB): granule 1 is taken, 2 is new
  ASSERT_EQ(static_cast<char*>(b.ptr) - static_cast<char*>(a.ptr), static_cast<ptrdiff_t>(3 * MiB));
  EXPECT_EQ(offset(b, a), static_cast<ptrdiff_t>(4 * MiB));
  EXPECT_EQ(b.prefetch_bytes, 2 * MiB);
  pool.deallocate(a.ptr, s1, nullptr);
  auto again = pool.allocate(3 * MiB, s1);  // the same memory again: nothing to prefetch
  EXPECT_EQ(again.ptr, a.ptr);
  EXPECT_EQ(again.prefetch_ptr, nullptr);
  EXPECT_EQ(again.prefetch_bytes, 0u);
  auto c = pool.allocate(2 * MiB, s1);  // [6, 8 MiB): the last granule, clipped to the chunk
  EXPECT_EQ(offset(c, a), static_cast<ptrdiff_t>(6 * MiB));
  EXPECT_EQ(c.prefetch_bytes, 2 * MiB);
  auto small = pool.allocate(700, s2);  // a small chunk is one granule
  EXPECT_EQ(small.prefetch_ptr, small.ptr);
  EXPECT_EQ(small.prefetch_bytes, 2 * MiB);
  auto small2 = pool.allocate(100, s2);
  EXPECT_EQ(small2.prefetch_bytes, 0u);
  for (void* p : {again.ptr, b.ptr, c.ptr}) pool.deallocate(p, s1, nullptr);
  for (void* p : {small.ptr, small2.ptr}) pool.deallocate(p, s2, nullptr);
  EXPECT_EQ(pool.trim(), 10 * MiB);
  auto fresh = pool.allocate(3 * MiB, s1);  // a new chunk (maybe at the same address) starts unclaimed
  EXPECT_TRUE(fresh.new_chunk);
  EXPECT_EQ(fresh.prefetch_bytes, 4 * MiB);
  pool.deallocate(fresh.ptr, s1, nullptr);
  EXPECT_EQ(pool.check(), "");
}

TEST(ManagedPoolChunks, DestructorReleasesEveryChunk) {
  HostSource src;
  {
    ManagedPool pool(small_opts(), src.source());
    pool.allocate(5000, s1);
    auto b = pool.allocate(5 * MiB, s2);
    auto st = std::make_shared<FenceState>();
    pool.deallocate(b.ptr, s2, fence_of(st));
    EXPECT_EQ(src.outstanding(), 2u);
  }
  EXPECT_EQ(src.outstanding(), 0u);
  EXPECT_EQ(src.releases, 2u);
}

TEST(ManagedPoolChunks, ForeignInteriorAndDoubleFreesChangeNothing) {
  HostSource src;
  ManagedPool pool(small_opts(), src.source());
  auto a = pool.allocate(4096, s1);
  int local = 0;
  auto st = std::make_shared<FenceState>();
  EXPECT_THROW(pool.deallocate(&local, s1, fence_of(st)), InvalidArgument);
  EXPECT_THROW(pool.deallocate(static_cast<char*>(a.ptr) + 512, s1, nullptr), InvalidArgument);
  EXPECT_EQ(st->destroyed, 1);  // the refused fence is not kept
  pool.deallocate(a.ptr, s1, nullptr);
  try {
    pool.deallocate(a.ptr, s1, nullptr);
    FAIL() << "double free accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("double free"), std::string::npos) << e.what();
  }
  EXPECT_EQ(pool.check(), "");
  EXPECT_EQ(pool.stats().frees, 1u);
}

TEST(ManagedPoolChunks, OutOfMemoryTrimsIdleChunksAndRetriesOnce) {
  HostSource src;
  src.limit = 20 * MiB;
  ManagedPool pool(small_opts(), src.source());
  auto a = pool.allocate(6 * MiB, s1);  // chunk 8 MiB
  auto b = pool.allocate(6 * MiB, s1);  // chunk 8 MiB: 16 of 20 MiB outstanding
  pool.deallocate(a.ptr, s1, nullptr);  // its chunk is idle now
  auto c = pool.allocate(7 * MiB, s1);  // fits a's idle chunk: no new chunk
  EXPECT_FALSE(c.new_chunk);
  pool.deallocate(c.ptr, s1, nullptr);
  // 12 MiB needs a new 12 MiB chunk (16 + 12 > 20): the source refuses, the
  // pool trims a's idle chunk and the retry succeeds (8 + 12 <= 20).
  auto d = pool.allocate(12 * MiB, s1);
  EXPECT_TRUE(d.new_chunk);
  EXPECT_EQ(pool.stats().chunk_failures, 1u);
  EXPECT_EQ(pool.stats().chunk_releases, 1u);
  // Nothing left to trim: the second failure reaches the caller, pool intact.
  EXPECT_THROW(pool.allocate(9 * MiB, s1), OutOfMemory);
  EXPECT_EQ(pool.check(), "");
  pool.deallocate(b.ptr, s1, nullptr);
  pool.deallocate(d.ptr, s1, nullptr);
  EXPECT_EQ(pool.trim(), 20 * MiB);
  EXPECT_EQ(src.outstanding(), 0u);
}

TEST(ManagedPoolChunks, OtherSourceErrorsPropagateWithoutRetry) {
  ChunkSource bad{[](size_t, StreamId) -> void* { throw CudaError("cudaMallocManaged failed", 1); },
                  [](void*, size_t) {}};
  ManagedPool pool(small_opts(), bad);
  EXPECT_THROW(pool.allocate(1000, s1), CudaError);
  ChunkSource misaligned{[](size_t, StreamId) -> void* { return reinterpret_cast<void*>(0x1001); },
                         [](void*, size_t) {}};
  ManagedPool pool2(small_opts(), misaligned);
  EXPECT_THROW(pool2.allocate(1000, s1), InvalidArgument);
  EXPECT_EQ(pool2.stats().chunks, 0u);
}

// ---- stream-ordered reuse ---------------------------------------------------------

TEST(ManagedPoolStreams, SameStreamReusesAtOnceOtherStreamsDoNot) {
  HostSource src;
  ManagedPoolOptions o = small_opts();
  o.stream_wait = false;
  ManagedPool pool(o, src.source());
  auto a = pool.allocate(64 * KiB, s1);
  auto keep = pool.allocate(64 * KiB, s1);  // so that a's block does not merge into the chunk's rest
  auto st = std::make_shared<FenceState>();  // never ready in this test
  pool.deallocate(a.ptr, s1, fence_of(st));
  auto on_s2 = pool.allocate(64 * KiB, s2);
  EXPECT_NE(on_s2.ptr, a.ptr) << "another stream took a block whose work may still run";
  auto on_s1 = pool.allocate(64 * KiB, s1);
  EXPECT_EQ(on_s1.ptr, a.ptr) << "the freeing stream must get its block back at once";
  EXPECT_EQ(pool.stats().reuse_same_stream, 1u);
  EXPECT_EQ(st->destroyed, 1);  // the fence went with the reuse
  EXPECT_EQ(pool.check(), "");
  for (void* p : {on_s1.ptr, on_s2.ptr, keep.ptr}) pool.deallocate(p, s1, nullptr);
}

TEST(ManagedPoolStreams, AnotherStreamReusesOnceTheFenceIsReady) {
  HostSource src;
  ManagedPoolOptions o = small_opts();
  o.stream_wait = false;
  ManagedPool pool(o, src.source());
  // Fill a whole small chunk with 4 blocks of 512 KiB so that there is no
  // other room: the only block to take is the freed one.
  std::vector<void*> blocks = four_blocks(pool, s1);
  EXPECT_EQ(src.obtains, 1u);
  auto st = std::make_shared<FenceState>();
  pool.deallocate(blocks[1], s1, fence_of(st));
  auto x = pool.allocate(512 * KiB, s2);  // fence not ready: a new chunk
  EXPECT_TRUE(x.new_chunk);
  st->ready = true;
  // Now blocks[1] is idle, usable by any stream, and the best fit (x's chunk
  // has a 1.5 MiB rest).
  auto y = pool.allocate(512 * KiB, s3);
  EXPECT_EQ(y.ptr, blocks[1]) << "ready block not reused";
  EXPECT_FALSE(y.new_chunk);
  EXPECT_EQ(pool.stats().reuse_after_fence, 1u);
  EXPECT_EQ(st->destroyed, 1);
  EXPECT_EQ(pool.check(), "");
}

TEST(ManagedPoolStreams, AFreeOnAnotherStreamBelongsToTheFreeingStream) {
  HostSource src;
  ManagedPoolOptions o = small_opts();
  o.stream_wait = false;
  ManagedPool pool(o, src.source());
  std::vector<void*> blocks = four_blocks(pool, s1);
  auto st = std::make_shared<FenceState>();
  pool.deallocate(blocks[0], s2, fence_of(st));  // allocated on s1, freed on s2
  auto on_s1 = pool.allocate(512 * KiB, s1);
  EXPECT_NE(on_s1.ptr, blocks[0]) << "the allocating stream is not the one whose work the fence covers";
  auto on_s2 = pool.allocate(512 * KiB, s2);
  EXPECT_EQ(on_s2.ptr, blocks[0]);
  EXPECT_EQ(pool.check(), "");
}

TEST(ManagedPoolStreams, StreamWaitTakesAnotherStreamsBlockAfterOrderingIt) {
  HostSource src;
  ManagedPool pool(small_opts(), src.source());  // stream_wait on
  std::vector<void*> blocks = four_blocks(pool, s1);
  auto st = std::make_shared<FenceState>();
  pool.deallocate(blocks[2], s1, fence_of(st));
  auto x = pool.allocate(512 * KiB, s2);
  EXPECT_EQ(x.ptr, blocks[2]);
  EXPECT_FALSE(x.new_chunk);
  EXPECT_TRUE(st->waited(s2)) << "taken without making s2 wait";
  EXPECT_EQ(pool.stats().reuse_by_wait, 1u);
  // A fence that cannot be waited on is not taken.
  auto st2 = std::make_shared<FenceState>();
  st2->allow_wait = false;
  pool.deallocate(blocks[3], s1, fence_of(st2));
  auto y = pool.allocate(512 * KiB, s3);
  EXPECT_NE(y.ptr, blocks[3]);
  EXPECT_TRUE(y.new_chunk);
  EXPECT_EQ(pool.check(), "");
}

TEST(ManagedPoolStreams, SameStreamNeighboursMergeKeepingTheLaterFence) {
  HostSource src;
  ManagedPoolOptions o = small_opts();
  o.stream_wait = false;
  ManagedPool pool(o, src.source());
  std::vector<void*> b = four_blocks(pool, s1);
  auto f0 = std::make_shared<FenceState>(), f1 = std::make_shared<FenceState>(),
       f2 = std::make_shared<FenceState>(), f3 = std::make_shared<FenceState>();
  pool.deallocate(b[0], s1, fence_of(f0));
  pool.deallocate(b[1], s1, fence_of(f1));  // merges with b[0], keeps f1
  EXPECT_EQ(f0->destroyed, 1);
  EXPECT_EQ(pool.stats().pending_blocks, 1u);
  pool.deallocate(b[3], s2, fence_of(f3));  // another stream: no merge across streams
  pool.deallocate(b[2], s1, fence_of(f2));  // merges with [b0,b1], keeps f2 (later)
  EXPECT_EQ(f1->destroyed, 1);
  EXPECT_EQ(f2->destroyed, 0);
  ManagedPoolStats s = pool.stats();
  EXPECT_EQ(s.pending_blocks, 2u);
  EXPECT_EQ(pool.check(), "");
  // Only the later fence decides: f2 ready makes the merged 1.5 MiB idle.
  f2->ready = true;
  EXPECT_EQ(pool.trim(), 0u);  // b[3] is still pending: the chunk stays
  s = pool.stats();
  EXPECT_EQ(s.idle_blocks, 1u);
  EXPECT_EQ(s.pending_blocks, 1u);
  f3->ready = true;
  EXPECT_EQ(pool.trim(), 2 * MiB);
  EXPECT_EQ(f2->destroyed, 1);
  EXPECT_EQ(f3->destroyed, 1);
  EXPECT_EQ(src.outstanding(), 0u);
}

TEST(ManagedPoolStreams, SplittingAPendingBlockKeepsTheRestPending) {
  HostSource src;
  ManagedPoolOptions o = small_opts();
  o.stream_wait = false;
  ManagedPool pool(o, src.source());
  auto big = pool.allocate(1 * MiB, s1);
  auto keep = pool.allocate(1 * MiB, s1);
  auto st = std::make_shared<FenceState>();
  pool.deallocate(big.ptr, s1, fence_of(st));
  auto part = pool.allocate(256 * KiB, s1);  // same stream: splits the pending block
  EXPECT_EQ(part.ptr, big.ptr);
  EXPECT_EQ(st->destroyed, 0);  // the rest still holds the fence
  auto other = pool.allocate(256 * KiB, s2);  // must not get the pending rest
  const auto lo = reinterpret_cast<uintptr_t>(big.ptr), hi = lo + MiB;
  const auto op = reinterpret_cast<uintptr_t>(other.ptr);
  EXPECT_FALSE(op >= lo && op < hi) << "s2 got part of s1's pending block";
  EXPECT_EQ(pool.check(), "");
  pool.deallocate(keep.ptr, s1, nullptr);
  pool.deallocate(part.ptr, s1, nullptr);
  pool.deallocate(other.ptr, s2, nullptr);
}

TEST(ManagedPoolStats, PrefetchNotesAndPeaks) {
  HostSource src;
  ManagedPool pool(small_opts(), src.source());
  auto a = pool.allocate(3 * MiB, s1);
  pool.note_prefetch(3 * MiB);
  pool.note_prefetch(100);
  auto b = pool.allocate(3 * MiB, s1);
  pool.deallocate(a.ptr, s1, nullptr);
  pool.deallocate(b.ptr, s1, nullptr);
  ManagedPoolStats s = pool.stats();
  EXPECT_EQ(s.prefetched_bytes, 3 * MiB + 100);
  EXPECT_EQ(s.prefetches, 2u);
  EXPECT_EQ(s.allocated.current, 0u);
  EXPECT_EQ(s.allocated.peak, 6 * MiB);
  EXPECT_EQ(s.allocated.total, 6 * MiB);
  EXPECT_EQ(s.requested.peak, 6 * MiB);
}

// ---- random runs ----------------------------------------------------------------

// The rule every reuse must keep: memory freed on stream S with fence F may be
// handed to stream T != S only if F's work is done, or T was made to wait on F
// (or on a later fence of S). The model of "done" follows CUDA: the fences of
// one stream complete in order; a fence of T completes only after everything T
// waited on before it; a free with no fence on T says all of T's work is done.
struct Model {
  struct F {
    std::shared_ptr<FenceState> state;
    StreamId stream;
    size_t index;                    // among the fences of its stream
    std::vector<size_t> implies;     // fences (ids) that T had waited on when this was made
  };
  std::vector<F> fences;                           // by id
  std::map<StreamId, std::vector<size_t>> by_stream;  // ids in order
  struct InFlight {
    uintptr_t lo, hi;
    size_t id;
  };
  std::vector<InFlight> in_flight;

  size_t add(StreamId s, std::shared_ptr<FenceState> st) {
    F f{std::move(st), s, by_stream[s].size(), {}};
    for (size_t id = 0; id < fences.size(); ++id)
      if (!fences[id].state->ready && fences[id].state->waited(s)) f.implies.push_back(id);
    fences.push_back(std::move(f));
    by_stream[s].push_back(fences.size() - 1);
    return fences.size() - 1;
  }
  void done(size_t id) {
    F& f = fences[id];
    if (f.state->ready) return;
    f.state->ready = true;
    const auto& mine = by_stream[f.stream];
    for (size_t k = 0; k < f.index; ++k) done(mine[k]);
    for (size_t other : f.implies) done(other);
  }
  void stream_done(StreamId s) {
    for (size_t id : by_stream[s]) done(id);
    for (size_t id = 0; id < fences.size(); ++id)
      if (fences[id].state->waited(s)) done(id);
  }
  // Whether fence h's completion implies fence f's: h is f or a later fence of
  // f's stream, or h (or an earlier fence of its stream) was made after its
  // stream waited on a fence that covers f.
  bool covers(size_t h, size_t f, std::set<size_t>& seen) {
    if (!seen.insert(h).second) return false;
    const F& fh = fences[h];
    const F& ff = fences[f];
    if (h == f || (fh.stream == ff.stream && fh.index >= ff.index)) return true;
    const auto& mine = by_stream[fh.stream];
    for (size_t k = 0; k <= fh.index; ++k)
      for (size_t g : fences[mine[k]].implies)
        if (covers(g, f, seen)) return true;
    return false;
  }
  void check(void* p, size_t n, StreamId t) {
    const auto lo = reinterpret_cast<uintptr_t>(p), hi = lo + n;
    for (auto it = in_flight.begin(); it != in_flight.end();) {
      const F& f = fences[it->id];
      if (f.state->ready) {
        it = in_flight.erase(it);
        continue;
      }
      if (it->lo < hi && lo < it->hi && f.stream != t) {
        bool ordered = false;
        for (size_t h = 0; h < fences.size() && !ordered; ++h) {
          std::set<size_t> seen;
          ordered = fences[h].state->waited(t) && covers(h, it->id, seen);
        }
        ASSERT_TRUE(ordered) << "stream " << t << " got memory still in use by stream " << f.stream;
      }
      ++it;
    }
  }
};

void random_run(bool stream_wait, uint64_t seed) {
  HostSource src;
  ManagedPoolOptions o;
  o.chunk_bytes = 4 * MiB;
  o.stream_wait = stream_wait;
  ManagedPool pool(o, src.source());
  std::mt19937_64 rng(seed);
  const StreamId streams[] = {s1, s2, s3, 0};
  struct Live {
    void* p;
    size_t n;
    unsigned char tag;
    StreamId stream;
  };
  std::vector<Live> live;
  Model model;
  unsigned char next_tag = 1;
  for (int step = 0; step < 6000; ++step) {
    const int op = rng() % 100;
    if (op < 55 || live.empty()) {
      size_t n = rng() % 8 == 0 ? 1 + rng() % (6 * MiB) : 1 + rng() % (64 * KiB);
      StreamId t = streams[rng() % 4];
      auto b = pool.allocate(n, t);
      ASSERT_GE(b.size, n);
      ASSERT_EQ(reinterpret_cast<uintptr_t>(b.ptr) % 512, 0u);
      model.check(b.ptr, b.size, t);
      std::memset(b.ptr, next_tag, n);
      live.push_back({b.ptr, n, next_tag, t});
      next_tag = static_cast<unsigned char>(next_tag % 250 + 1);
    } else if (op < 95) {
      size_t i = rng() % live.size();
      Live l = live[i];
      live.erase(live.begin() + static_cast<long>(i));
      const auto* bytes = static_cast<const unsigned char*>(l.p);
      for (size_t k = 0; k < l.n; k += 1 + l.n / 64)
        ASSERT_EQ(bytes[k], l.tag) << "a live allocation was overwritten: overlap";
      ASSERT_EQ(bytes[l.n - 1], l.tag);
      // Freed on its allocation stream, as PyTorch does (a free on another
      // stream would need a cross-stream order that this model does not track).
      StreamId s = l.stream;
      size_t block = pool.allocation_size(l.p);
      ASSERT_GE(block, l.n);
      if (rng() % 20 == 0) {
        model.stream_done(s);
        pool.deallocate(l.p, s, nullptr);
      } else {
        auto st = std::make_shared<FenceState>();
        st->allow_wait = rng() % 3 != 0;
        size_t id = model.add(s, st);
        model.in_flight.push_back({reinterpret_cast<uintptr_t>(l.p), reinterpret_cast<uintptr_t>(l.p) + block, id});
        pool.deallocate(l.p, s, fence_of(st));
      }
    } else if (op < 99) {
      // Some of one stream's work completes.
      if (!model.fences.empty()) model.done(rng() % model.fences.size());
    } else {
      pool.trim();
    }
    if (step % 500 == 0) {
      ASSERT_EQ(pool.check(), "") << "step " << step;
    }
  }
  for (auto& l : live) pool.deallocate(l.p, l.stream, nullptr);
  for (size_t id = 0; id < model.fences.size(); ++id) model.done(id);
  ASSERT_EQ(pool.check(), "");
  pool.trim();
  ManagedPoolStats s = pool.stats();
  EXPECT_EQ(s.allocated.current, 0u);
  EXPECT_EQ(s.requested.current, 0u);
  EXPECT_EQ(s.reserved.current, 0u);
  EXPECT_EQ(s.chunks, 0u);
  EXPECT_EQ(s.live_blocks + s.idle_blocks + s.pending_blocks, 0u);
  EXPECT_EQ(s.allocations, s.frees);
  EXPECT_EQ(s.chunk_obtains, s.chunk_releases);
  EXPECT_EQ(src.outstanding(), 0u);
  EXPECT_GT(s.reuse_same_stream, 0u);
  EXPECT_GT(s.reuse_after_fence, 0u);
  if (stream_wait) {
    EXPECT_GT(s.reuse_by_wait, 0u);
  }
  for (auto& f : model.fences) EXPECT_EQ(f.state->destroyed, 1) << "a fence leaked or died twice";
}

TEST(ManagedPoolRandom, SeveralStreamsNoOverlapReuseRulesStatsBackToZero) {
  for (uint64_t seed : {1, 2, 3}) {
    SCOPED_TRACE(seed);
    random_run(false, seed);
    random_run(true, seed + 100);
  }
}

TEST(ManagedPoolRandom, ThreadsEachWithAStream) {
  HostSource src;
  ManagedPoolOptions o;
  o.chunk_bytes = 4 * MiB;
  ManagedPool pool(o, src.source());
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  std::mutex fences_mu;
  std::vector<std::shared_ptr<FenceState>> fences;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(42 + t);
      const StreamId stream = 0x100 * (t + 1);
      std::vector<std::pair<void*, size_t>> live;
      std::vector<std::shared_ptr<FenceState>> mine;
      const unsigned char tag = static_cast<unsigned char>(t + 1);
      for (int i = 0; i < 3000; ++i) {
        if (rng() % 2 || live.empty()) {
          size_t n = 1 + rng() % (rng() % 16 == 0 ? 3 * MiB : 16 * KiB);
          auto b = pool.allocate(n, stream);
          std::memset(b.ptr, tag, n);
          live.emplace_back(b.ptr, n);
        } else {
          size_t k = rng() % live.size();
          auto [p, n] = live[k];
          live.erase(live.begin() + static_cast<long>(k));
          const auto* bytes = static_cast<const unsigned char*>(p);
          if (bytes[0] != tag || bytes[n - 1] != tag || bytes[n / 2] != tag) ++errors;
          auto st = std::make_shared<FenceState>();
          {
            std::lock_guard lk(fences_mu);
            fences.push_back(st);
          }
          mine.push_back(st);
          // This stream's work completes in order: a prefix of its fences.
          if (rng() % 4 == 0)
            for (size_t k = 0, upto = rng() % mine.size(); k < upto; ++k) mine[k]->ready = true;
          pool.deallocate(p, stream, fence_of(st));
        }
      }
      for (auto& [p, n] : live) pool.deallocate(p, stream, nullptr);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors, 0) << "a live allocation was overwritten: overlap";
  for (auto& f : fences) f->ready = true;
  EXPECT_EQ(pool.check(), "");
  pool.trim();
  ManagedPoolStats s = pool.stats();
  EXPECT_EQ(s.allocated.current, 0u);
  EXPECT_EQ(s.reserved.current, 0u);
  EXPECT_EQ(src.outstanding(), 0u);
}

}  // namespace
}  // namespace ferry
