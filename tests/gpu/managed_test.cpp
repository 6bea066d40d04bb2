// managed_test.cpp — ferry's PyTorch allocators on a real device, through the
// same extern "C" entry points PyTorch calls: each allocator round-trips random
// data at odd sizes; the prefetch and advice paths leave the pages where asked;
// oversubscription is refused with the numbers (prefetch off, so even a broken
// guard would only reserve address space); the pool reuses memory across
// streams only in stream order, and many alloc/free cycles on several streams
// end with its stats back at zero.
//
// Never asks CUDA itself for more managed memory than is free: the requests
// beyond it are made to ferry's guard, which must refuse them.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <sys/types.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ferry/ferry.h"

extern "C" {
void* ferry_torch_alloc_device(ssize_t size, int device, cudaStream_t stream);
void ferry_torch_free_device(void* ptr, ssize_t size, int device, cudaStream_t stream);
void* ferry_torch_alloc_managed(ssize_t size, int device, cudaStream_t stream);
void ferry_torch_free_managed(void* ptr, ssize_t size, int device, cudaStream_t stream);
void* ferry_torch_alloc_managed_pool(ssize_t size, int device, cudaStream_t stream);
void ferry_torch_free_managed_pool(void* ptr, ssize_t size, int device, cudaStream_t stream);
}

namespace {

#define CUDA_OK(x)                                                         \
  do {                                                                     \
    cudaError_t e_ = (x);                                                  \
    ASSERT_EQ(e_, cudaSuccess) << #x << ": " << cudaGetErrorString(e_);    \
  } while (0)

using AllocFn = void* (*)(ssize_t, int, cudaStream_t);
using FreeFn = void (*)(void*, ssize_t, int, cudaStream_t);
struct Entry {
  const char* name;
  AllocFn alloc;
  FreeFn free;
  bool managed;
};
const Entry kDevice{"device", ferry_torch_alloc_device, ferry_torch_free_device, false};
const Entry kManaged{"managed", ferry_torch_alloc_managed, ferry_torch_free_managed, true};
const Entry kPool{"managed_pool", ferry_torch_alloc_managed_pool, ferry_torch_free_managed_pool, true};

std::string last() { return ferry_last_error(); }
bool has(const std::string& s, const std::string& n) { return s.find(n) != std::string::npos; }

ferry_managed_stats_t stats(const char* name) {
  ferry_managed_stats_t s{};
  s.struct_size = sizeof s;
  EXPECT_EQ(ferry_managed_get_stats(name, 0, &s), FERRY_SUCCESS) << last();
  return s;
}

void configure(const char* name, const char* options) {
  ASSERT_EQ(ferry_managed_configure(name, options), FERRY_SUCCESS) << last();
}

class Managed : public ::testing::Test {
 protected:
  void SetUp() override {
    CUDA_OK(cudaSetDevice(0));
    CUDA_OK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    int cma = 0;
    CUDA_OK(cudaDeviceGetAttribute(&cma, cudaDevAttrConcurrentManagedAccess, 0));
    concurrent_managed_ = cma != 0;
  }
  void TearDown() override {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
    for (const char* n : {"device", "managed", "managed_pool"}) ferry_managed_configure(n, nullptr);
    ferry_managed_trim("managed_pool", -1, nullptr);
  }
  cudaStream_t stream_ = nullptr;
  bool concurrent_managed_ = false;
};

// Random bytes in, poisoned buffer out, through the device, at odd sizes.
void round_trip(const Entry& e, cudaStream_t stream) {
  std::mt19937_64 rng(11);
  const size_t sizes[] = {1, 511, 4097, (1u << 20) + 3, (40u << 20) + 1};
  const ferry_managed_stats_t before = stats(e.name);
  for (size_t n : sizes) {
    SCOPED_TRACE(std::string(e.name) + " size " + std::to_string(n));
    auto* p = static_cast<unsigned char*>(e.alloc(static_cast<ssize_t>(n), 0, stream));
    ASSERT_NE(p, nullptr) << last();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
    std::vector<unsigned char> src(n), back(n, 0xA5);
    for (auto& b : src) b = static_cast<unsigned char>(rng());
    CUDA_OK(cudaMemcpyAsync(p, src.data(), n, cudaMemcpyHostToDevice, stream));
    CUDA_OK(cudaMemcpyAsync(back.data(), p, n, cudaMemcpyDeviceToHost, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    ASSERT_EQ(std::memcmp(src.data(), back.data(), n), 0);
    if (e.managed) {
      ASSERT_EQ(std::memcmp(src.data(), p, n), 0) << "managed memory read by the CPU";
    }
    e.free(p, static_cast<ssize_t>(n), 0, stream);
  }
  CUDA_OK(cudaStreamSynchronize(stream));
  const ferry_managed_stats_t after = stats(e.name);
  EXPECT_EQ(after.allocations - before.allocations, 5u);
  EXPECT_EQ(after.frees - before.frees, 5u);
  EXPECT_EQ(after.allocated, 0u);
  EXPECT_EQ(after.requested, 0u);
  EXPECT_EQ(after.failures, before.failures);
}

TEST_F(Managed, DeviceAllocatorRoundTrips) { round_trip(kDevice, stream_); }

TEST_F(Managed, ManagedAllocatorRoundTrips) {
  round_trip(kManaged, stream_);
  if (!concurrent_managed_) GTEST_SKIP() << "no concurrentManagedAccess: prefetch and advice untested";
  configure("managed", "prefetch=1,advise=preferred_location+accessed_by");
  round_trip(kManaged, stream_);
  configure("managed", "prefetch=1,advise=read_mostly");
  round_trip(kManaged, stream_);
}

TEST_F(Managed, PoolAllocatorRoundTripsAndTrimsToZero) {
  if (!concurrent_managed_) configure("managed_pool", "prefetch=0");
  round_trip(kPool, stream_);
  if (concurrent_managed_) {
    configure("managed_pool", "prefetch=chunk,advise=preferred_location,chunk_bytes=32M");
    round_trip(kPool, stream_);
  }
  CUDA_OK(cudaDeviceSynchronize());
  size_t released = 0;
  ASSERT_EQ(ferry_managed_trim("managed_pool", -1, &released), FERRY_SUCCESS) << last();
  EXPECT_GT(released, 0u);
  ferry_managed_stats_t s = stats("managed_pool");
  EXPECT_EQ(s.reserved, 0u);
  EXPECT_EQ(s.chunks, 0u);
  EXPECT_EQ(s.allocated, 0u);
}

TEST_F(Managed, PrefetchPutsThePagesOnTheDevice) {
  if (!concurrent_managed_) GTEST_SKIP() << "the device reports concurrentManagedAccess=0";
  const size_t n = 8u << 20;
  for (const Entry* e : {&kManaged, &kPool}) {
    SCOPED_TRACE(e->name);
    configure(e->name, "prefetch=1,advise=preferred_location");
    const ferry_managed_stats_t before = stats(e->name);
    void* p = e->alloc(static_cast<ssize_t>(n), 0, stream_);
    ASSERT_NE(p, nullptr) << last();
    CUDA_OK(cudaStreamSynchronize(stream_));
    int where = -99;
    CUDA_OK(cudaMemRangeGetAttribute(&where, sizeof where, cudaMemRangeAttributeLastPrefetchLocation, p, n));
    EXPECT_EQ(where, 0) << "last prefetch location";
    if (e == &kManaged) {  // the pool advises whole chunks; the range attribute needs one advice
      int preferred = -99;
      CUDA_OK(cudaMemRangeGetAttribute(&preferred, sizeof preferred, cudaMemRangeAttributePreferredLocation,
                                       p, n));
      EXPECT_EQ(preferred, 0) << "preferred location";
    }
    const ferry_managed_stats_t after = stats(e->name);
    EXPECT_EQ(after.prefetched_bytes - before.prefetched_bytes, n);
    EXPECT_EQ(after.prefetches - before.prefetches, 1u);
    e->free(p, static_cast<ssize_t>(n), 0, stream_);
  }
}

TEST_F(Managed, OversubscriptionIsRefusedWithTheMessage) {
  size_t free_b = 0, total_b = 0;
  CUDA_OK(cudaMemGetInfo(&free_b, &total_b));
  const size_t ask = free_b + (1ull << 30);
  for (const Entry* e : {&kManaged, &kPool}) {
    SCOPED_TRACE(e->name);
    configure(e->name, "prefetch=0");  // even a broken guard would only reserve address space
    const ferry_managed_stats_t before = stats(e->name);
    void* p = e->alloc(static_cast<ssize_t>(ask), 0, stream_);
    if (p) e->free(p, static_cast<ssize_t>(ask), 0, stream_);
    ASSERT_EQ(p, nullptr) << "asked for 1 GiB more than free and got it";
    const std::string why = last();
    EXPECT_TRUE(has(why, "refused to ask cudaMallocManaged")) << why;
    EXPECT_TRUE(has(why, "free")) << why;
    EXPECT_TRUE(has(why, "oversubscribe=1")) << why;
    EXPECT_TRUE(has(why, std::to_string(ask) + " B") || has(why, std::to_string((ask + (2u << 20) - 1) / (2u << 20) * (2u << 20)) + " B"))
        << "the message says what was asked: " << why;
    const ferry_managed_stats_t after = stats(e->name);
    EXPECT_EQ(after.failures, before.failures + 1);
    EXPECT_LE(after.reserved, before.reserved);  // the pool may have trimmed idle chunks to retry
  }
}

TEST_F(Managed, UntouchedManagedMemoryCountsAgainstTheDevice) {
  // cudaMemGetInfo does not see untouched managed memory; ferry counts what
  // it holds, so a series of allocations cannot add up past the device.
  configure("managed", "prefetch=0");
  size_t free_b = 0, total_b = 0;
  CUDA_OK(cudaMemGetInfo(&free_b, &total_b));
  if (free_b < total_b / 2 + (256u << 20)) GTEST_SKIP() << "needs more than half of the device free";
  // Each piece fits what is free; two of them do not fit the device.
  const size_t piece = free_b - (64u << 20);
  std::vector<void*> held;
  void* p = nullptr;
  for (int i = 0; i < 3 && (p = ferry_torch_alloc_managed(static_cast<ssize_t>(piece), 0, stream_)); ++i)
    held.push_back(p);
  const std::string why = last();
  for (void* q : held) ferry_torch_free_managed(q, 0, 0, stream_);
  EXPECT_EQ(held.size(), 1u) << "untouched managed allocations added up past the device";
  EXPECT_EQ(p, nullptr);
  EXPECT_TRUE(has(why, "already holds")) << why;
}

TEST_F(Managed, PoolReusesAcrossStreamsOnlyInStreamOrder) {
  cudaStream_t b = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  void* big = nullptr;
  const size_t big_n = 512u << 20, n = 8u << 20;
  CUDA_OK(cudaMalloc(&big, big_n));
  // chunk_bytes = n: x fills its chunk, so B finds no other idle block.
  for (const char* opts : {"chunk_bytes=8M,stream_wait=1", "chunk_bytes=8M,stream_wait=0"}) {
    SCOPED_TRACE(opts);
    configure("managed_pool", concurrent_managed_ ? opts : (std::string(opts) + ",prefetch=0").c_str());
    const ferry_managed_stats_t before = stats("managed_pool");
    void* x = ferry_torch_alloc_managed_pool(static_cast<ssize_t>(n), 0, stream_);
    ASSERT_NE(x, nullptr) << last();
    // Stream A: a long queue, then writes 0xAA into x, then frees x.
    for (int i = 0; i < 20; ++i) CUDA_OK(cudaMemsetAsync(big, i, big_n, stream_));
    CUDA_OK(cudaMemsetAsync(x, 0xAA, n, stream_));
    ferry_torch_free_managed_pool(x, static_cast<ssize_t>(n), 0, stream_);
    // Stream B: takes 8 MiB at once and writes 0x55. If it got x without
    // waiting, A's late 0xAA would land on top.
    void* y = ferry_torch_alloc_managed_pool(static_cast<ssize_t>(n), 0, b);
    ASSERT_NE(y, nullptr) << last();
    CUDA_OK(cudaMemsetAsync(y, 0x55, n, b));
    std::vector<unsigned char> back(n);
    CUDA_OK(cudaMemcpyAsync(back.data(), y, n, cudaMemcpyDeviceToHost, b));
    CUDA_OK(cudaStreamSynchronize(b));
    CUDA_OK(cudaStreamSynchronize(stream_));
    std::vector<unsigned char> now(n);
    CUDA_OK(cudaMemcpy(now.data(), y, n, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i += 4093) {
      ASSERT_EQ(back[i], 0x55) << "at " << i;
      ASSERT_EQ(now[i], 0x55) << "stream A's write landed after stream B's, at " << i;
    }
    const ferry_managed_stats_t after = stats("managed_pool");
    if (has(opts, "stream_wait=1")) {
      EXPECT_EQ(y, x) << "with stream_wait the freed block is the best fit";
      EXPECT_EQ(after.reuse_by_wait - before.reuse_by_wait, 1u);
    } else {
      EXPECT_NE(y, x) << "without stream_wait, B must not get A's pending block";
    }
    ferry_torch_free_managed_pool(y, static_cast<ssize_t>(n), 0, b);
    CUDA_OK(cudaDeviceSynchronize());
  }
  CUDA_OK(cudaFree(big));
  CUDA_OK(cudaStreamDestroy(b));
}

TEST_F(Managed, ManyCyclesOnSeveralStreamsEndAtZero) {
  if (!concurrent_managed_) configure("managed_pool", "prefetch=0");
  cudaStream_t streams[4];
  for (auto& s : streams) CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const ferry_managed_stats_t before = stats("managed_pool");
  struct Live {
    void* p;
    size_t n;
    int stream;
  };
  std::vector<Live> live;
  std::mt19937_64 rng(5);
  for (int i = 0; i < 3000; ++i) {
    if (rng() % 2 || live.empty()) {
      const size_t n = 1 + rng() % (rng() % 16 == 0 ? (12u << 20) : (64u << 10));
      const int s = static_cast<int>(rng() % 4);
      void* p = ferry_torch_alloc_managed_pool(static_cast<ssize_t>(n), 0, streams[s]);
      ASSERT_NE(p, nullptr) << last();
      CUDA_OK(cudaMemsetAsync(p, 0x10 + s, n, streams[s]));
      live.push_back({p, n, s});
    } else {
      const size_t k = rng() % live.size();
      Live l = live[k];
      live.erase(live.begin() + static_cast<long>(k));
      if (rng() % 8 == 0) {  // check it still holds its stream's byte
        unsigned char first = 0, last_byte = 0;
        CUDA_OK(cudaMemcpyAsync(&first, l.p, 1, cudaMemcpyDeviceToHost, streams[l.stream]));
        CUDA_OK(cudaMemcpyAsync(&last_byte, static_cast<char*>(l.p) + l.n - 1, 1, cudaMemcpyDeviceToHost,
                                streams[l.stream]));
        CUDA_OK(cudaStreamSynchronize(streams[l.stream]));
        ASSERT_EQ(first, 0x10 + l.stream);
        ASSERT_EQ(last_byte, 0x10 + l.stream);
      }
      ferry_torch_free_managed_pool(l.p, 0, 0, streams[l.stream]);  // size 0: not trusted anyway
    }
  }
  for (auto& l : live) ferry_torch_free_managed_pool(l.p, static_cast<ssize_t>(l.n), 0, streams[l.stream]);
  CUDA_OK(cudaDeviceSynchronize());
  for (auto& s : streams) CUDA_OK(cudaStreamDestroy(s));
  ferry_managed_stats_t s = stats("managed_pool");
  EXPECT_EQ(s.allocated, 0u);
  EXPECT_EQ(s.requested, 0u);
  EXPECT_EQ(s.failures, before.failures);
  EXPECT_EQ(s.allocations - before.allocations, s.frees - before.frees);
  EXPECT_GT(s.reuse_same_stream + s.reuse_after_fence + s.reuse_by_wait,
            before.reuse_same_stream + before.reuse_after_fence + before.reuse_by_wait);
  ASSERT_EQ(ferry_managed_trim("managed_pool", 0, nullptr), FERRY_SUCCESS) << last();
  s = stats("managed_pool");
  EXPECT_EQ(s.reserved, 0u);
  EXPECT_EQ(s.chunks, 0u);
}

TEST_F(Managed, BadDeviceIndexReturnsNullWithTheReason) {
  int n = 0;
  CUDA_OK(cudaGetDeviceCount(&n));
  for (const Entry* e : {&kDevice, &kManaged, &kPool}) {
    EXPECT_EQ(e->alloc(4096, n + 1, stream_), nullptr) << e->name;
    EXPECT_TRUE(has(last(), "device " + std::to_string(n + 1))) << last();
  }
}

}  // namespace
