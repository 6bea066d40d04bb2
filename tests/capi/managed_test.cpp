// managed_test.cpp — the PyTorch allocators' C side on any machine:
// ferry_managed_configure with bad names and options gives clear errors and
// leaves the options as they were; stats and trim check their arguments; the
// extern "C" entry points return NULL for size 0 and negative sizes, ignore
// NULL and foreign pointers on free, and (without a CUDA device) return NULL
// with the reason instead of crashing. Allocations on a real device are
// tests/gpu/managed_test.cpp's job.
#include <gtest/gtest.h>
#include <sys/types.h>

#include <string>

#include "ferry/ferry.h"

// The entry points are declared with their PyTorch signatures in
// src/capi/capi_managed.cpp, not in ferry.h (which needs no CUDA header);
// cudaStream_t is `struct CUstream_st*`.
struct CUstream_st;
extern "C" {
void* ferry_torch_alloc_device(ssize_t size, int device, CUstream_st* stream);
void ferry_torch_free_device(void* ptr, ssize_t size, int device, CUstream_st* stream);
void* ferry_torch_alloc_managed(ssize_t size, int device, CUstream_st* stream);
void ferry_torch_free_managed(void* ptr, ssize_t size, int device, CUstream_st* stream);
void* ferry_torch_alloc_managed_pool(ssize_t size, int device, CUstream_st* stream);
void ferry_torch_free_managed_pool(void* ptr, ssize_t size, int device, CUstream_st* stream);
}

namespace {

using AllocFn = void* (*)(ssize_t, int, CUstream_st*);
using FreeFn = void (*)(void*, ssize_t, int, CUstream_st*);
struct Entry {
  const char* name;
  AllocFn alloc;
  FreeFn free;
};
const Entry kEntries[] = {{"device", ferry_torch_alloc_device, ferry_torch_free_device},
                          {"managed", ferry_torch_alloc_managed, ferry_torch_free_managed},
                          {"managed_pool", ferry_torch_alloc_managed_pool, ferry_torch_free_managed_pool}};

std::string last() { return ferry_last_error(); }
bool has(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

bool have_device() {
  int n = 0;
  return ferry_device_count(&n) == FERRY_SUCCESS && n > 0;
}

ferry_managed_stats_t stats(const char* name) {
  ferry_managed_stats_t s{};
  s.struct_size = sizeof s;
  EXPECT_EQ(ferry_managed_get_stats(name, -1, &s), FERRY_SUCCESS) << last();
  return s;
}

TEST(ManagedCApi, ConfigureAcceptsGoodOptions) {
  EXPECT_EQ(ferry_managed_configure("device", nullptr), FERRY_SUCCESS) << last();
  EXPECT_EQ(ferry_managed_configure("device", ""), FERRY_SUCCESS) << last();
  EXPECT_EQ(ferry_managed_configure("managed", "prefetch=1,advise=preferred_location+accessed_by"),
            FERRY_SUCCESS)
      << last();
  EXPECT_EQ(ferry_managed_configure("managed_pool", "prefetch=chunk,chunk_bytes=128M,stream_wait=0"),
            FERRY_SUCCESS)
      << last();
  // back to the defaults for the other tests
  EXPECT_EQ(ferry_managed_configure("managed", nullptr), FERRY_SUCCESS);
  EXPECT_EQ(ferry_managed_configure("managed_pool", nullptr), FERRY_SUCCESS);
}

TEST(ManagedCApi, ConfigureRefusesBadNamesClearly) {
  EXPECT_EQ(ferry_managed_configure(nullptr, ""), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(has(last(), "name must not be NULL")) << last();
  EXPECT_EQ(ferry_managed_configure("cuda", ""), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(has(last(), "unknown allocator 'cuda'")) << last();
  EXPECT_TRUE(has(last(), "device, managed or managed_pool")) << last();
}

TEST(ManagedCApi, ConfigureRefusesBadOptionsClearly) {
  struct Case {
    const char* name;
    const char* options;
    const char* says;
  } cases[] = {
      {"device", "prefetch=1", "takes no options"},
      {"managed", "prefetch=perhaps", "'perhaps'"},
      {"managed", "chunk_bytes=64M", "unknown option 'chunk_bytes'"},
      {"managed", "advise=everything", "unknown advice 'everything'"},
      {"managed", "oversubscribe=2", "'2'"},
      {"managed_pool", "chunk_bytes=1M", "multiple of 2 MiB"},
      {"managed_pool", "stream_wait", "not key=value"},
      {"managed_pool", "prefetch=1,prefetch=0", "twice"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(ferry_managed_configure(c.name, c.options), FERRY_ERROR_INVALID_ARGUMENT)
        << c.name << " " << c.options;
    EXPECT_TRUE(has(last(), c.says)) << c.options << ": " << last();
  }
}

TEST(ManagedCApi, StatsAndTrimCheckTheirArguments) {
  ferry_managed_stats_t s{};
  s.struct_size = sizeof s;
  EXPECT_EQ(ferry_managed_get_stats("managed", -1, nullptr), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(has(last(), "out must not be NULL")) << last();
  EXPECT_EQ(ferry_managed_get_stats("nope", -1, &s), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ferry_managed_get_stats("managed", 1000, &s), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(has(last(), "out of range")) << last();
  EXPECT_EQ(ferry_managed_get_stats("managed", 0, &s), FERRY_SUCCESS) << last();
  size_t released = 7;
  EXPECT_EQ(ferry_managed_trim("device", -1, &released), FERRY_SUCCESS) << last();
  EXPECT_EQ(released, 0u);
  EXPECT_EQ(ferry_managed_trim("managed_pool", -1, nullptr), FERRY_SUCCESS) << last();
  EXPECT_EQ(ferry_managed_trim("managed_pool", -5, nullptr), FERRY_ERROR_INVALID_ARGUMENT);
}

TEST(ManagedCApi, ZeroNegativeNullAndForeignNeverCrash) {
  int local = 0;
  for (const Entry& e : kEntries) {
    SCOPED_TRACE(e.name);
    const ferry_managed_stats_t before = stats(e.name);
    EXPECT_EQ(e.alloc(0, 0, nullptr), nullptr);  // empty tensors: no failure
    EXPECT_EQ(stats(e.name).failures, before.failures);
    EXPECT_EQ(e.alloc(-5, 0, nullptr), nullptr);
    EXPECT_TRUE(has(last(), "negative size")) << last();
    EXPECT_EQ(stats(e.name).failures, before.failures + 1);
    e.free(nullptr, 0, 0, nullptr);
    e.free(&local, 4, 0, nullptr);  // not ours: reported, nothing freed
    EXPECT_TRUE(has(last(), "not one of its live allocations")) << last();
    const ferry_managed_stats_t after = stats(e.name);
    EXPECT_EQ(after.frees, before.frees);
    EXPECT_EQ(after.allocated, before.allocated);
  }
}

TEST(ManagedCApi, WithoutADeviceAllocationsReturnNullWithTheReason) {
  if (have_device()) GTEST_SKIP() << "a CUDA device is present (tests/gpu/managed_test.cpp covers it)";
  for (const Entry& e : kEntries) {
    SCOPED_TRACE(e.name);
    const ferry_managed_stats_t before = stats(e.name);
    EXPECT_EQ(e.alloc(4096, 0, nullptr), nullptr);
    const std::string why = last();
    EXPECT_TRUE(has(why, "failed, returning NULL to PyTorch")) << why;
    EXPECT_TRUE(has(why, "CUDA")) << why;  // "no CUDA driver" or "no usable CUDA device"
    EXPECT_EQ(e.alloc(1 << 20, 3, nullptr), nullptr);
    const ferry_managed_stats_t after = stats(e.name);
    EXPECT_EQ(after.failures, before.failures + 2);
    EXPECT_EQ(after.allocations, before.allocations);
    EXPECT_EQ(after.allocated, 0u);
    EXPECT_EQ(after.reserved, 0u);
  }
  size_t released = 1;
  EXPECT_EQ(ferry_managed_trim("managed_pool", -1, &released), FERRY_SUCCESS) << last();
  EXPECT_EQ(released, 0u);
}

}  // namespace
