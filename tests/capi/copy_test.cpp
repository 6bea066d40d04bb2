// copy_test.cpp — the copy engine's and registration's C API on any machine:
// NULL, destroyed and wrong-kind handles named; registration's argument checks
// (NULL, size 0, unmapped memory) made before any device is touched; without a
// device, engine creation and registration fail with FERRY_ERROR_NO_DEVICE and
// leave *out NULL. ferry_options_check in a clean environment. (Copies on a
// device: tests/gpu/capi_copy_test.cpp; bad FERRY_* environments:
// capi/options_check_test.c, one process per environment.)
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ferry/ferry.h"
// The old name stays in the ABI (GDRCopy's rule); these tests call it on purpose.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace {

std::string last() { return ferry_last_error(); }

bool have_device() {
  int n = 0;
  return ferry_device_count(&n) == FERRY_SUCCESS && n > 0;
}

#define EXPECT_REFUSED(call, text)                                              \
  do {                                                                          \
    EXPECT_EQ((call), FERRY_ERROR_INVALID_ARGUMENT) << #call;                   \
    EXPECT_NE(last().find(text), std::string::npos) << #call << ": " << last(); \
  } while (0)

TEST(CApiCopy, NullHandlesAndOutputsAreNamed) {
  std::vector<unsigned char> a(4096), b(4096);
  void* dsts[1] = {b.data()};
  const void* srcs[1] = {a.data()};
  size_t sizes[1] = {a.size()};
  ferry_copy_t copy = nullptr;
  EXPECT_REFUSED(ferry_engine_create(0, nullptr), "out must not be NULL");
  EXPECT_REFUSED(ferry_engine_destroy(nullptr), "engine must not be NULL");
  EXPECT_REFUSED(ferry_copy(nullptr, b.data(), a.data(), a.size()), "engine must not be NULL");
  EXPECT_REFUSED(ferry_copy_async(nullptr, b.data(), a.data(), a.size(), nullptr, FERRY_STRATEGY_AUTO, &copy),
                 "engine must not be NULL");
  EXPECT_REFUSED(ferry_copy_many(nullptr, dsts, srcs, sizes, 1, nullptr), "engine must not be NULL");
  EXPECT_REFUSED(ferry_copy_many_async(nullptr, dsts, srcs, sizes, 1, nullptr, FERRY_STRATEGY_AUTO, &copy),
                 "engine must not be NULL");
  EXPECT_REFUSED(ferry_copy_batch_async(nullptr, dsts, srcs, sizes, 1, nullptr, &copy), "engine must not be NULL");
  int done = -1;
  void* event = reinterpret_cast<void*>(uintptr_t{1});
  ferry_strategy_t strategy = FERRY_STRATEGY_HYBRID;
  EXPECT_REFUSED(ferry_copy_wait(nullptr), "copy must not be NULL");
  EXPECT_REFUSED(ferry_copy_query(nullptr, &done), "copy must not be NULL");
  EXPECT_REFUSED(ferry_copy_get_event(nullptr, &event), "copy must not be NULL");
  EXPECT_REFUSED(ferry_copy_get_strategy(nullptr, &strategy), "copy must not be NULL");
  EXPECT_REFUSED(ferry_copy_destroy(nullptr), "copy must not be NULL");
  EXPECT_EQ(done, -1);  // outputs untouched by a refused call
  EXPECT_EQ(strategy, FERRY_STRATEGY_HYBRID);
  EXPECT_REFUSED(ferry_registration_destroy(nullptr), "registration must not be NULL");
}

// API 1.7 renamed four calls and reordered one; the old names stay in the ABI
// as deprecated aliases that behave exactly as the new ones (the same checks,
// the same messages, the same handles).
TEST(CApiCopy, DeprecatedNamesBehaveAsTheNewOnes) {
  EXPECT_REFUSED(ferry_copy_release(nullptr), "copy must not be NULL");
  EXPECT_REFUSED(ferry_unregister(nullptr), "registration must not be NULL");
  std::vector<unsigned char> buf(8192);
  ferry_registration_t r = nullptr;
  EXPECT_REFUSED(ferry_register(buf.data(), 0, 0, &r), "size 0");
  EXPECT_REFUSED(ferry_register(buf.data(), buf.size(), 0, nullptr), "out must not be NULL");
  EXPECT_EQ(r, nullptr);
  EXPECT_REFUSED(ferry_channel_create(0, nullptr, nullptr), "out must not be NULL");
  EXPECT_REFUSED(ferry_node_pool_close(nullptr), "pool must not be NULL");
  // A real node pool (host memory only): opened, then destroyed by the old
  // name; the handle is then refused by the new name as destroyed.
  ferry_node_pool_options_t o;
  ASSERT_EQ(ferry_node_pool_options_init(&o), FERRY_SUCCESS) << last();
  o.capacity = size_t{8} << 20;
  ferry_node_pool_t pool = nullptr;
  const std::string name = "capialias" + std::to_string(getpid());
  ASSERT_EQ(ferry_node_pool_open(name.c_str(), &o, &pool), FERRY_SUCCESS) << last();
  EXPECT_EQ(ferry_node_pool_close(pool), FERRY_SUCCESS) << last();
  EXPECT_EQ(ferry_node_pool_destroy(pool), FERRY_ERROR_INVALID_ARGUMENT);
}

TEST(CApiCopy, HandlesOfAnotherKindAreNamedAndChangeNothing) {
  ferry_pool_options_t o;
  ASSERT_EQ(ferry_pool_options_init(&o), FERRY_SUCCESS) << last();
  o.chunk_bytes = size_t{2} << 20;
  ferry_pool_t pool = nullptr;
  ASSERT_EQ(ferry_pool_create(&o, &pool), FERRY_SUCCESS) << last();
  void* p = nullptr;
  ASSERT_EQ(ferry_pool_alloc(pool, 8192, 0, FERRY_HUGE_NO, &p), FERRY_SUCCESS) << last();
  std::memset(p, 0x3c, 8192);
  auto* as_engine = reinterpret_cast<ferry_engine_t>(pool);
  auto* as_copy = reinterpret_cast<ferry_copy_t>(pool);
  auto* as_registration = reinterpret_cast<ferry_registration_t>(pool);
  void* dsts[1] = {p};
  const void* srcs[1] = {static_cast<unsigned char*>(p) + 4096};
  size_t sizes[1] = {4096};
  ferry_copy_t copy = nullptr;
  int done = 0;
  void* event = nullptr;
  ferry_strategy_t strategy{};
  const char* engine_text = "is a ferry_pool_t, not a ferry_engine_t";
  const char* copy_text = "is a ferry_pool_t, not a ferry_copy_t";
  EXPECT_REFUSED(ferry_copy(as_engine, p, srcs[0], 4096), engine_text);
  EXPECT_REFUSED(ferry_copy_async(as_engine, p, srcs[0], 4096, nullptr, FERRY_STRATEGY_AUTO, &copy), engine_text);
  EXPECT_REFUSED(ferry_copy_many(as_engine, dsts, srcs, sizes, 1, nullptr), engine_text);
  EXPECT_REFUSED(ferry_copy_many_async(as_engine, dsts, srcs, sizes, 1, nullptr, FERRY_STRATEGY_AUTO, &copy),
                 engine_text);
  EXPECT_REFUSED(ferry_copy_batch_async(as_engine, dsts, srcs, sizes, 1, nullptr, &copy), engine_text);
  EXPECT_REFUSED(ferry_engine_destroy(as_engine), engine_text);
  EXPECT_REFUSED(ferry_copy_wait(as_copy), copy_text);
  EXPECT_REFUSED(ferry_copy_query(as_copy, &done), copy_text);
  EXPECT_REFUSED(ferry_copy_get_event(as_copy, &event), copy_text);
  EXPECT_REFUSED(ferry_copy_get_strategy(as_copy, &strategy), copy_text);
  EXPECT_REFUSED(ferry_copy_destroy(as_copy), copy_text);
  EXPECT_REFUSED(ferry_registration_destroy(as_registration), "is a ferry_pool_t, not a ferry_registration_t");
  EXPECT_EQ(copy, nullptr);
  // The pool is intact: its memory unchanged, free and destroy work.
  for (size_t i = 0; i < 8192; ++i) ASSERT_EQ(static_cast<unsigned char*>(p)[i], 0x3c) << i;
  EXPECT_EQ(ferry_pool_free(pool, p), FERRY_SUCCESS) << last();
  EXPECT_EQ(ferry_pool_destroy(pool), FERRY_SUCCESS) << last();
}

TEST(CApiRegister, ArgumentsAreCheckedBeforeTheDevice) {
  // These checks come before any CUDA call: the same answers with or without a GPU.
  std::mt19937_64 rng(std::random_device{}());
  const size_t n = 1 + rng() % (1u << 20);
  std::vector<unsigned char> buf(n);
  ferry_registration_t r = reinterpret_cast<ferry_registration_t>(uintptr_t{1});
  EXPECT_REFUSED(ferry_registration_create(buf.data(), n, 0, nullptr), "out must not be NULL");
  EXPECT_REFUSED(ferry_registration_create(nullptr, n, 0, &r), "ptr must not be NULL");
  EXPECT_EQ(r, nullptr);  // *out is cleared first
  EXPECT_REFUSED(ferry_registration_create(buf.data(), 0, 0, &r), "size 0");
  // A range that is not mapped: map three pages, unmap the middle one.
  const size_t page = 4096;
  auto* m = static_cast<unsigned char*>(mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                                             -1, 0));
  ASSERT_NE(m, MAP_FAILED);
  ASSERT_EQ(munmap(m + page, page), 0);
  EXPECT_REFUSED(ferry_registration_create(m + page, page, 0, &r), "not (fully) mapped");
  EXPECT_REFUSED(ferry_registration_create(m + 17, 3 * page - 17, 0, &r), "not (fully) mapped");  // a hole inside
  EXPECT_EQ(r, nullptr);
  munmap(m, page);
  munmap(m + 2 * page, page);
}

TEST(CApiCopy, WithoutADeviceEngineAndRegistrationSayNoDevice) {
  if (have_device()) GTEST_SKIP() << "a CUDA device is present; tests/gpu/capi_copy_test.cpp covers it";
  ferry_engine_t engine = reinterpret_cast<ferry_engine_t>(uintptr_t{1});
  EXPECT_EQ(ferry_engine_create(0, &engine), FERRY_ERROR_NO_DEVICE) << last();
  EXPECT_EQ(engine, nullptr);
  EXPECT_NE(last().find("CUDA"), std::string::npos) << last();
  std::vector<unsigned char> buf(3 * 4096 + 5);
  ferry_registration_t r = reinterpret_cast<ferry_registration_t>(uintptr_t{1});
  EXPECT_EQ(ferry_registration_create(buf.data() + 5, buf.size() - 5, 0, &r), FERRY_ERROR_NO_DEVICE) << last();
  EXPECT_EQ(r, nullptr);
  EXPECT_NE(last().find("CUDA"), std::string::npos) << last();
  // The failed calls held nothing: the buffer is still ordinary, writable memory.
  std::memset(buf.data(), 0x77, buf.size());
  EXPECT_EQ(buf[buf.size() - 1], 0x77);
}

TEST(CApiOptions, CheckPassesInTheTestEnvironmentAndIsStable) {
  // The test environment sets no bad FERRY_* variable (else every test here
  // would fail); bad environments: options_check_test.c.
  ASSERT_EQ(ferry_options_check(), FERRY_SUCCESS) << last();
  EXPECT_EQ(ferry_options_check(), FERRY_SUCCESS) << last();
  // A check does not clear the message of an earlier failure on this thread.
  EXPECT_EQ(ferry_device_count(nullptr), FERRY_ERROR_INVALID_ARGUMENT);
  const std::string before = last();
  EXPECT_EQ(ferry_options_check(), FERRY_SUCCESS);
  EXPECT_EQ(last(), before);
}

}  // namespace
