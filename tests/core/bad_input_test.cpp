// bad_input_test.cpp — every bad value of issue #14 that C++ parses or checks,
// one table per parser: FERRY_* options, PoolOptions, fault-injection specs and
// the machine profile. Each gives InvalidArgument (OutOfMemory for a target
// beyond the machine's memory) whose message names the option and quotes the
// value; none is silently clamped or defaulted.
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "copy/strategy.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/options.h"
#include "pool/pool.h"

namespace ferry {
namespace {

constexpr size_t MiB = size_t{1} << 20;

struct Case {
  std::string what;
  std::function<void()> call;
  ferry_status_t status;
  std::string message;  // must appear in what()
};

void expect_refused(const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    try {
      c.call();
      ADD_FAILURE() << c.what << ": accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), c.status) << c.what << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos) << c.what << ": " << e.what();
    }
  }
}

Case env(const std::string& name, const std::string& value) {
  return {name + "=" + value, [=] { Options::parse({{name, value}}); }, FERRY_ERROR_INVALID_ARGUMENT,
          name + "='" + printable(value) + "'"};
}

TEST(BadInput, OptionValuesAreRangeCheckedWhereTheyAreParsed) {
  expect_refused({
      env("FERRY_RELEASE_DELAY_MS", "10000000000000"),  // overflowed ms -> ns: a busy loop
      env("FERRY_RELEASE_DELAY_MS", "4611686018427387904"),
      env("FERRY_RELEASE_DELAY_MS", "9223372036854775808"),
      env("FERRY_RELEASE_DELAY_MS", "-1"),
      env("FERRY_RELEASE_DELAY_MS", "1.5"),
      env("FERRY_COPY_WORKERS", "-5"),  // was silently "the default"
      env("FERRY_COPY_WORKERS", "1025"),
      env("FERRY_TOUCH_THREADS", "2147483648"),
      env("FERRY_TOUCH_THREADS", "+"),
      env("FERRY_CHUNK_SIZE", "-1"),
      env("FERRY_CHUNK_SIZE", "1.5"),
      env("FERRY_CHUNK_SIZE", "18446744073709551616"),
      env("FERRY_CHUNK_SIZE", std::string("64MiB ") + '\0' + "x"),
      env("FERRY_POOL_LIMIT", "-1"),
      env("FERRY_RELEASE_BATCH", "-5"),
      env("FERRY_ZERO_RECYCLED", "2"),
      env("FERRY_FAULT_INJECT", "mmap:99999999999999999999999"),
      env("FERRY_FAULT_INJECT", "mmap: 5"),
      env("FERRY_FAULT_INJECT", "mmap:+5"),
  });
  // The bounds themselves are accepted.
  const Options o = Options::parse({{"FERRY_RELEASE_DELAY_MS", "86400000"}, {"FERRY_COPY_WORKERS", "1024"}});
  EXPECT_EQ(o.integer("FERRY_RELEASE_DELAY_MS"), kMaxReleaseDelayMs);
  EXPECT_EQ(o.integer("FERRY_COPY_WORKERS"), 1024);
}

Case pool(const std::string& what, std::function<void(PoolOptions&)> set, const std::string& message,
          ferry_status_t status = FERRY_ERROR_INVALID_ARGUMENT) {
  return {what,
          [set] {
            PoolOptions o;
            set(o);
            Pool p(o);
          },
          status, message};
}

TEST(BadInput, PoolOptionsOutOfRangeAreRefusedBeforeAnyThreadStarts) {
  expect_refused({
      pool("delay 10^13", [](PoolOptions& o) { o.release_delay_ms = 10'000'000'000'000; },
           "release_delay_ms=10000000000000"),
      pool("delay 2^62", [](PoolOptions& o) { o.release_delay_ms = int64_t{1} << 62; },
           "release_delay_ms=4611686018427387904"),
      pool("delay -1", [](PoolOptions& o) { o.release_delay_ms = -1; }, "release_delay_ms=-1"),
      pool("touch threads", [](PoolOptions& o) { o.touch_threads = INT_MAX; }, "touch_threads=2147483647"),
      pool("numa -3", [](PoolOptions& o) { o.numa_node = -3; }, "numa_node=-3"),
      pool("numa 2^31-1", [](PoolOptions& o) { o.numa_node = INT_MAX; }, "numa_node=2147483647"),
      pool("chunk 2^64-1", [](PoolOptions& o) { o.chunk_bytes = SIZE_MAX; }, "chunk_bytes=18446744073709551615"),
      pool("chunk 256 TiB", [](PoolOptions& o) { o.chunk_bytes = size_t{256} << 40; }, "at most 128 TiB"),
      pool("target beyond the machine", [](PoolOptions& o) { o.target_bytes = SIZE_MAX; },
           "target_bytes=18446744073709551615", FERRY_ERROR_OUT_OF_MEMORY),
  });
}

TEST(BadInput, TheLongestReleaseDelayWorksAndShutsDownAtOnce) {
  PoolOptions o;
  o.chunk_bytes = 2 * MiB;
  o.release_delay_ms = kMaxReleaseDelayMs;
  Pool p(o);
  for (int i = 0; i < 3; ++i) p.deallocate(p.allocate(3 * MiB));
  EXPECT_EQ(p.stats().chunk_releases, 0u);  // nothing has been idle for a day
}

TEST(BadInput, FaultSpecsAreStrict) {
  std::vector<Case> cases;
  for (const char* spec : {"mmap:99999999999999999999999", "mmap: 5", "mmap:+5", "mmap:5 +", "mmap:-1",
                           "mmap:1e3", "mmap:0x10", "mmap:1000000001", "mmap:1=EWHAT", "mmap:1=", "mmap:=EAGAIN",
                           "madvise:1+=eagain", ":1", "mmap:1:2"})
    cases.push_back({spec, [spec] { parse_fault_spec(spec); }, FERRY_ERROR_INVALID_ARGUMENT, spec});
  expect_refused(cases);
  const auto rules = parse_fault_spec("mmap:1000000000, madvise:0+=EAGAIN,touch:2=ENOMEM");
  ASSERT_EQ(rules.size(), 3u);
  EXPECT_EQ(rules[0].after, kMaxFaultCount);
  EXPECT_TRUE(rules[1].persistent);
  EXPECT_EQ(rules[1].error, EAGAIN);
  EXPECT_EQ(rules[2].error, ENOMEM);
}

TEST(BadInput, ProfileValuesAreRangeChecked) {
  std::vector<Case> cases;
  for (const char* line :
       {"staging_slots = 99999999999", "staging_slots = 1", "staging_slots = -3", "workers = -5",
        "workers = 4294967297", "staging_chunk_bytes = 1T", "pin_piece_bytes = 128G",
        "hybrid_pinned_share_h2d = nan", "hybrid_pinned_share_d2h = 1.5", "cuda_below_bytes = -1"})
    cases.push_back({line, [line] { parse_profile(line); }, FERRY_ERROR_INVALID_ARGUMENT, line});
  expect_refused(cases);
}

}  // namespace
}  // namespace ferry
