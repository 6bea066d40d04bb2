// pool_chunks_test.cpp — the chunks a registrar (pinning, NIXL) follows:
// hooks called once per chunk in ready/release pairs, a throwing hook failing
// the allocation without a leak, and chunks() with chunk_generation() through
// insertion, trim, part release and concurrent change.
#include "pool/pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <memory>
#include <random>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "os/mapping.h"
#include "../support/pool_fixture.h"

namespace ferry {
namespace {

using namespace test_support;

// ---- hooks -------------------------------------------------------------------

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

}  // namespace
}  // namespace ferry
