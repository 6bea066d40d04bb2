// pool_limit_test.cpp — Pool's hard limit: refused requests say why, idle
// chunks are released to make room, and concurrent reservations never map
// more than the limit.
#include "pool/pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <latch>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../support/pool_fixture.h"

namespace ferry {
namespace {

using namespace test_support;

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

}  // namespace
}  // namespace ferry
