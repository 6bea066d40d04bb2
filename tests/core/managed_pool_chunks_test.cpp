// managed_pool_chunks_test.cpp — the managed pool's size classes and chunks,
// with plain host memory as chunks: the table of classes and its waste bound,
// refused sizes and options, small and large requests in their own chunks,
// each prefetch granule claimed once, every chunk released by the destructor,
// foreign and double frees, and the out-of-memory trim and single retry.
#include "managed/managed_pool.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <string>

#include "core/error.h"
#include "../support/managed_pool_doubles.h"

namespace ferry {
namespace {

using namespace test_support::managed;

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

}  // namespace
}  // namespace ferry
