// misuse_test.cpp — the C API refuses bad options and misused handles with a
// status and a message, never a hang or a crash.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

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

}  // namespace
