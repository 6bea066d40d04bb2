// misuse_test.cpp — the C API refuses bad options and misused handles with a
// status and a message, never a hang or a crash.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "../common/child.h"
#include "ferry/ferry.h"

namespace {

std::string last() { return ferry_last_error(); }

ferry_pool_options_t defaults() {
  ferry_pool_options_t o;
  EXPECT_EQ(ferry_pool_options_init(&o), FERRY_SUCCESS);
  o.chunk_bytes = size_t{2} << 20;
  return o;
}

TEST(CApiMisuse, OutOfRangePoolOptionsAreRefusedQuoted) {
  struct Case {
    void (*set)(ferry_pool_options_t&);
    ferry_status_t status;
    const char* message;
  };
  const Case cases[] = {
      {[](ferry_pool_options_t& o) { o.release_delay_ms = 10'000'000'000'000; }, FERRY_ERROR_INVALID_ARGUMENT,
       "release_delay_ms=10000000000000"},
      {[](ferry_pool_options_t& o) { o.release_delay_ms = INT64_MAX; }, FERRY_ERROR_INVALID_ARGUMENT,
       "release_delay_ms=9223372036854775807"},
      {[](ferry_pool_options_t& o) { o.touch_threads = -1; }, FERRY_ERROR_INVALID_ARGUMENT, "touch_threads=-1"},
      {[](ferry_pool_options_t& o) { o.numa_node = -3; }, FERRY_ERROR_INVALID_ARGUMENT, "numa_node=-3"},
      {[](ferry_pool_options_t& o) { o.chunk_bytes = 3; }, FERRY_ERROR_INVALID_ARGUMENT, "chunk_bytes=3"},
      {[](ferry_pool_options_t& o) { o.target_bytes = SIZE_MAX; }, FERRY_ERROR_OUT_OF_MEMORY,
       "target_bytes=18446744073709551615"},
  };
  for (const Case& c : cases) {
    ferry_pool_options_t o = defaults();
    c.set(o);
    ferry_pool_t pool = reinterpret_cast<ferry_pool_t>(uintptr_t{1});
    EXPECT_EQ(ferry_pool_create(&o, &pool), c.status) << c.message << ": " << last();
    EXPECT_EQ(pool, nullptr);
    EXPECT_NE(last().find(c.message), std::string::npos) << last();
  }
}

TEST(CApiMisuse, TheLongestReleaseDelayWorks) {
  ferry_pool_options_t o = defaults();
  o.release_delay_ms = 86'400'000;
  ferry_pool_t pool = nullptr;
  ASSERT_EQ(ferry_pool_create(&o, &pool), FERRY_SUCCESS) << last();
  void* p = nullptr;
  ASSERT_EQ(ferry_pool_alloc(pool, 3u << 20, 0, FERRY_HUGE_AUTO, &p), FERRY_SUCCESS) << last();
  EXPECT_EQ(ferry_pool_free(pool, p), FERRY_SUCCESS);
  EXPECT_EQ(ferry_pool_destroy(pool), FERRY_SUCCESS);  // returns at once: the releaser is woken
}

ferry_pool_t make_pool() {
  ferry_pool_options_t o = defaults();
  ferry_pool_t pool = nullptr;
  EXPECT_EQ(ferry_pool_create(&o, &pool), FERRY_SUCCESS) << last();
  return pool;
}

TEST(CApiMisuse, DoubleDestroyAndUseAfterDestroyAreErrors) {
  // Before: double destroy segfaulted, alloc after destroy hung, free after
  // destroy aborted in glibc.
  ferry_pool_t pool = make_pool();
  void* p = nullptr;
  ASSERT_EQ(ferry_pool_alloc(pool, 4097, 0, FERRY_HUGE_AUTO, &p), FERRY_SUCCESS) << last();
  ASSERT_EQ(ferry_pool_destroy(pool), FERRY_SUCCESS) << last();
  struct Call {
    const char* name;
    ferry_status_t status;
  };
  void* out = reinterpret_cast<void*>(uintptr_t{1});
  size_t released = 0;
  ferry_pool_stats_t stats;
  const char* note = nullptr;
  const Call calls[] = {
      {"destroy", ferry_pool_destroy(pool)},
      {"alloc", ferry_pool_alloc(pool, 100, 0, FERRY_HUGE_AUTO, &out)},
      {"free", ferry_pool_free(pool, p)},
      {"trim", ferry_pool_trim(pool, 0, &released)},
      {"wait_ready", ferry_pool_wait_ready(pool)},
      {"get_stats", ferry_pool_get_stats(pool, &stats)},
      {"get_note", ferry_pool_get_note(pool, 0, &note)},
  };
  for (const Call& c : calls) {
    EXPECT_EQ(c.status, FERRY_ERROR_INVALID_ARGUMENT) << c.name;
  }
  EXPECT_NE(last().find("was destroyed"), std::string::npos) << last();
  EXPECT_NE(last().find("ferry_pool_t"), std::string::npos) << last();
}

TEST(CApiMisuse, AHandleOfAnotherKindIsNamed) {
  ferry_pool_t pool = make_pool();
  double us = 0;
  EXPECT_EQ(ferry_channel_ping(reinterpret_cast<ferry_channel_t>(pool), &us), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("is a ferry_pool_t, not a ferry_channel_t"), std::string::npos) << last();
  EXPECT_EQ(ferry_copy_wait(reinterpret_cast<ferry_copy_t>(pool)), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ferry_engine_destroy(reinterpret_cast<ferry_engine_t>(pool)), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("not a ferry_engine_t"), std::string::npos) << last();
  EXPECT_EQ(ferry_pool_destroy(pool), FERRY_SUCCESS) << last();  // the wrong-kind destroy changed nothing
}

TEST(CApiMisuse, OfConcurrentDestroysExactlyOneWins) {
  for (int round = 0; round < 20; ++round) {
    ferry_pool_t pool = make_pool();
    void* p = nullptr;
    ASSERT_EQ(ferry_pool_alloc(pool, 1000, 0, FERRY_HUGE_AUTO, &p), FERRY_SUCCESS);
    std::atomic<int> go{0}, ok{0}, refused{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 6; ++t)
      threads.emplace_back([&] {
        while (go.load() == 0) {
        }
        const ferry_status_t s = ferry_pool_destroy(pool);
        (s == FERRY_SUCCESS ? ok : refused).fetch_add(1);
      });
    go = 1;
    for (auto& t : threads) t.join();
    EXPECT_EQ(ok.load(), 1);
    EXPECT_EQ(refused.load(), 5);
  }
}

TEST(CApiMisuse, DestroyedHandlesAreRecognizedAfterManyOthers) {
  ferry_pool_t first = make_pool();
  ASSERT_EQ(ferry_pool_destroy(first), FERRY_SUCCESS);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(ferry_pool_destroy(make_pool()), FERRY_SUCCESS);
  size_t released = 0;
  EXPECT_EQ(ferry_pool_trim(first, 0, &released), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("was destroyed"), std::string::npos) << last();
}

TEST(CApiMisuse, AForkedChildRefusesAnInheritedPoolAndExits) {
  ferry_pool_options_t o = defaults();
  o.release_delay_ms = 20;  // a background thread the child does not have
  ferry_pool_t pool = nullptr;
  ASSERT_EQ(ferry_pool_create(&o, &pool), FERRY_SUCCESS) << last();
  void* p = nullptr;
  ASSERT_EQ(ferry_pool_alloc(pool, 3u << 20, 0, FERRY_HUGE_AUTO, &p), FERRY_SUCCESS);
  std::memset(p, 0x5a, 3u << 20);
  const ferrytest::ChildEnd end = ferrytest::run_in_child([&](const auto& say) {
    int bad = 0;
    void* q = nullptr;
    if (ferry_pool_alloc(pool, 100, 0, FERRY_HUGE_AUTO, &q) != FERRY_ERROR_NOT_SUPPORTED ||
        last().find("fork") == std::string::npos) {
      say("alloc in the child: " + last());
      ++bad;
    }
    if (ferry_pool_free(pool, p) != FERRY_SUCCESS) {  // a no-op there
      say("free in the child: " + last());
      ++bad;
    }
    ferry_pool_t own = make_pool();
    void* r = nullptr;
    if (ferry_pool_alloc(own, 5000, 0, FERRY_HUGE_AUTO, &r) != FERRY_SUCCESS || ferry_pool_free(own, r) != 0 ||
        ferry_pool_destroy(own) != FERRY_SUCCESS) {
      say("a pool of the child's own: " + last());
      ++bad;
    }
    if (ferry_pool_destroy(pool) != FERRY_SUCCESS) {
      say("destroy in the child: " + last());
      ++bad;
    }
    return bad;
  });
  EXPECT_TRUE(end.clean()) << end.describe();
  EXPECT_EQ(static_cast<unsigned char*>(p)[12345], 0x5a);
  EXPECT_EQ(ferry_pool_free(pool, p), FERRY_SUCCESS) << last();
  EXPECT_EQ(ferry_pool_destroy(pool), FERRY_SUCCESS) << last();
}

}  // namespace
