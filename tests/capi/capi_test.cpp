// capi_test.cpp — the C API on any machine: versions, options, errors, pools,
// and the no-device path (every CUDA-dependent call fails cleanly, never aborts).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ferry/ferry.h"

namespace {

std::string last() { return ferry_last_error(); }

bool have_driver() {
  ferry_versions_t v{};
  v.struct_size = sizeof v;
  EXPECT_EQ(ferry_get_versions(&v), FERRY_SUCCESS);
  return v.cuda_driver != 0;
}

TEST(CApi, Versions) {
  int major = -1, minor = -1;
  ASSERT_EQ(ferry_get_api_version(&major, &minor), FERRY_SUCCESS);
  EXPECT_EQ((major << 16) | minor, FERRY_API_VERSION);
  ferry_versions_t v{};
  v.struct_size = sizeof v;
  ASSERT_EQ(ferry_get_versions(&v), FERRY_SUCCESS);
  EXPECT_GT(std::strlen(v.library), 0u);
  EXPECT_GE(v.cuda_runtime, 13000);
  EXPECT_EQ(v.api_major, FERRY_API_MAJOR);
}

TEST(CApi, NullArgumentsAreNamed) {
  EXPECT_EQ(ferry_get_api_version(nullptr, nullptr), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("major must not be NULL"), std::string::npos) << last();
  EXPECT_EQ(ferry_get_versions(nullptr), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ferry_device_count(nullptr), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ferry_pool_alloc(nullptr, 1, 0, FERRY_HUGE_AUTO, nullptr), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("pool must not be NULL"), std::string::npos) << last();
}

TEST(CApi, StatusNames) {
  EXPECT_STREQ(ferry_status_name(FERRY_ERROR_NO_DEVICE), "FERRY_ERROR_NO_DEVICE");
  EXPECT_STREQ(ferry_status_name(static_cast<ferry_status_t>(99)), "FERRY_ERROR_UNKNOWN");
}

TEST(CApi, OptionTable) {
  size_t n = 0;
  ASSERT_EQ(ferry_option_count(&n), FERRY_SUCCESS);
  ASSERT_GT(n, 3u);
  for (size_t i = 0; i < n; ++i) {
    const char *name = nullptr, *def = nullptr, *doc = nullptr;
    ASSERT_EQ(ferry_option_info(i, &name, &def, &doc), FERRY_SUCCESS);
    EXPECT_EQ(std::string(name).rfind("FERRY_", 0), 0u);
  }
  EXPECT_EQ(ferry_option_info(n, nullptr, nullptr, nullptr), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("out of range"), std::string::npos);
}

TEST(CApi, FaultInjectionSpecIsChecked) {
  EXPECT_EQ(ferry_set_fault_injection("bogus:1"), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("bogus:1"), std::string::npos) << last();
  EXPECT_EQ(ferry_set_fault_injection(""), FERRY_SUCCESS);
}

TEST(CApi, LastErrorIsPerThread) {
  ASSERT_EQ(ferry_device_count(nullptr), FERRY_ERROR_INVALID_ARGUMENT);
  std::string other = "unset";
  std::thread([&] { other = ferry_last_error(); }).join();
  EXPECT_EQ(other, "");
  EXPECT_NE(last(), "");
}

TEST(CApi, NoDevicePathsFailCleanly) {
  int count = -1;
  ferry_status_t s = ferry_device_count(&count);
  if (have_driver() && s == FERRY_SUCCESS) GTEST_SKIP() << "a CUDA device is present; see gpu tests";
  EXPECT_EQ(s, FERRY_ERROR_NO_DEVICE);
  EXPECT_TRUE(last().find("no CUDA driver") != std::string::npos ||
              last().find("no usable CUDA device") != std::string::npos ||
              last().find("no CUDA device") != std::string::npos)
      << last();
  ferry_pool_t pool = reinterpret_cast<ferry_pool_t>(0x1);
  EXPECT_EQ(ferry_pinned_pool_create(nullptr, 0, &pool), FERRY_ERROR_NO_DEVICE);
  EXPECT_EQ(pool, nullptr);
  EXPECT_NE(last().find("CUDA"), std::string::npos) << last();
}

TEST(CApi, PoolRoundTripWithRandomData) {
  ferry_pool_options_t o;
  ASSERT_EQ(ferry_pool_options_init(&o), FERRY_SUCCESS);
  EXPECT_EQ(o.chunk_bytes, 64u << 20);
  o.chunk_bytes = 8u << 20;
  o.zero_recycled = 1;
  ferry_pool_t pool = nullptr;
  ASSERT_EQ(ferry_pool_create(&o, &pool), FERRY_SUCCESS) << last();
  std::mt19937_64 rng(42);
  std::vector<std::pair<unsigned char*, size_t>> live;
  for (int i = 0; i < 64; ++i) {
    size_t n = 1 + rng() % (3u << 20);
    void* p = nullptr;
    ASSERT_EQ(ferry_pool_alloc(pool, n, 64, FERRY_HUGE_AUTO, &p), FERRY_SUCCESS) << last();
    ASSERT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
    auto* b = static_cast<unsigned char*>(p);
    for (size_t k = 0; k < n; k += 977) b[k] = static_cast<unsigned char>(i + k);
    b[n - 1] = static_cast<unsigned char>(i * 7);
    live.emplace_back(b, n);
  }
  for (size_t i = 0; i < live.size(); ++i) {
    auto [b, n] = live[i];
    for (size_t k = 0; k < n - 1; k += 977) ASSERT_EQ(b[k], static_cast<unsigned char>(i + k));
    ASSERT_EQ(b[n - 1], static_cast<unsigned char>(i * 7));
  }
  ferry_pool_stats_t st{};
  st.struct_size = sizeof st;
  ASSERT_EQ(ferry_pool_get_stats(pool, &st), FERRY_SUCCESS);
  EXPECT_EQ(st.allocations, 64u);
  EXPECT_GT(st.small.in_use.current + st.huge.in_use.current, 0u);
  for (auto [b, n] : live) ASSERT_EQ(ferry_pool_free(pool, b), FERRY_SUCCESS) << last();
  // Double free and foreign pointers are refused with a message, state intact.
  EXPECT_EQ(ferry_pool_free(pool, live[0].first), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_FALSE(last().empty());
  int on_stack = 0;
  EXPECT_EQ(ferry_pool_free(pool, &on_stack), FERRY_ERROR_INVALID_ARGUMENT);
  void* p = nullptr;
  EXPECT_EQ(ferry_pool_alloc(pool, 0, 0, FERRY_HUGE_AUTO, &p), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ferry_pool_alloc(pool, 16, 3, FERRY_HUGE_AUTO, &p), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ferry_pool_alloc(pool, 16, 0, static_cast<ferry_huge_t>(7), &p),
            FERRY_ERROR_INVALID_ARGUMENT);
  ASSERT_EQ(ferry_pool_get_stats(pool, &st), FERRY_SUCCESS);
  EXPECT_EQ(st.small.in_use.current + st.huge.in_use.current, 0u);
  EXPECT_EQ(st.frees, 64u);
  size_t released = 0;
  ASSERT_EQ(ferry_pool_trim(pool, 0, &released), FERRY_SUCCESS);
  EXPECT_GT(released, 0u);
  ASSERT_EQ(ferry_pool_destroy(pool), FERRY_SUCCESS);
}

TEST(CApi, LimitErrorNamesTheLimit) {
  ferry_pool_options_t o;
  ASSERT_EQ(ferry_pool_options_init(&o), FERRY_SUCCESS);
  o.chunk_bytes = 4u << 20;
  o.limit_bytes = 8u << 20;
  ferry_pool_t pool = nullptr;
  ASSERT_EQ(ferry_pool_create(&o, &pool), FERRY_SUCCESS) << last();
  void* p = nullptr;
  EXPECT_EQ(ferry_pool_alloc(pool, 64u << 20, 0, FERRY_HUGE_YES, &p), FERRY_ERROR_OUT_OF_MEMORY);
  EXPECT_NE(last().find("8 MiB"), std::string::npos) << last();
  EXPECT_EQ(ferry_pool_alloc(pool, 1u << 20, 0, FERRY_HUGE_YES, &p), FERRY_SUCCESS) << last();
  EXPECT_EQ(ferry_pool_free(pool, p), FERRY_SUCCESS);
  EXPECT_EQ(ferry_pool_destroy(pool), FERRY_SUCCESS);
}

}  // namespace
