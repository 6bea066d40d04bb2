// pool_options_test.cpp — PoolOptions: bad values are refused with the
// value quoted, and the FERRY_* environment table fills them in.
#include "pool/pool.h"

#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "core/options.h"
#include "../support/pool_fixture.h"

namespace ferry {
namespace {

using namespace test_support;

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

}  // namespace
}  // namespace ferry
