// managed_pool_doubles.h — test doubles shared by the core tests of
// ManagedPool (tests/core/managed_pool_*_test.cpp): fences whose readiness and
// waits a test controls, a chunk source of plain host memory that counts what
// is outstanding and can be told to fail, small-chunk options and three streams.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "managed/managed_pool.h"

namespace ferry::test_support::managed {

inline constexpr size_t KiB = 1024, MiB = 1024 * 1024;

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

inline std::unique_ptr<Fence> fence_of(const std::shared_ptr<FenceState>& s) {
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

inline ManagedPoolOptions small_opts() {
  ManagedPoolOptions o;
  o.chunk_bytes = 8 * MiB;
  return o;
}

inline constexpr StreamId s1 = 0x1001, s2 = 0x2002, s3 = 0x3003;

}  // namespace ferry::test_support::managed
