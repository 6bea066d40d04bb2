// managed_pool_streams_test.cpp — the managed pool's stream-ordered reuse,
// with test fences: the same stream reuses at once, another stream only after
// the fence is ready or after it was made to wait; a free belongs to the
// freeing stream; same-stream neighbours merge keeping the later fence; a
// split pending block stays pending. And the prefetch notes and peaks.
#include "managed/managed_pool.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "../support/managed_pool_doubles.h"

namespace ferry {
namespace {

using namespace test_support::managed;

// Four 512 KiB blocks allocated on `stream`, in address order of allocation.
std::vector<void*> four_blocks(ManagedPool& pool, StreamId stream) {
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(pool.allocate(512 * KiB, stream).ptr);
  return blocks;
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

// ---- stats ---------------------------------------------------------------------

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

}  // namespace
}  // namespace ferry
