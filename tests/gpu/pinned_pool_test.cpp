// pinned_pool_test.cpp — pinned pools on a real device: memory is registered,
// DMA to and from it is correct at odd sizes and offsets, registration faults
// fail cleanly, background pinning serves allocations, a target of N serves one
// allocation of N that DMA uses whole.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/fault.h"
#include "cuda/pinned_pool.h"

namespace ferry {
namespace {

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x << ": " << cudaGetErrorString(x)

bool is_registered(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeHost;
}

PoolOptions small_chunks() {
  PoolOptions o;
  o.chunk_bytes = 16u << 20;
  return o;
}

TEST(PinnedPool, AllocationsArePinnedAndDmaRoundTrips) {
  auto pool = cuda::make_pinned_pool(small_chunks(), 0);
  std::mt19937_64 rng(7);
  void* dev = nullptr;
  CUDA_OK(cudaMalloc(&dev, 40u << 20));
  const size_t sizes[] = {1, 3, 255, 4097, (1u << 20) + 13, (5u << 20) + 1, 40u << 20};
  for (size_t n : sizes) {
    auto* src = static_cast<unsigned char*>(pool->allocate(n, 1));
    auto* dst = static_cast<unsigned char*>(pool->allocate(n, 256));
    ASSERT_TRUE(is_registered(src)) << n;
    ASSERT_TRUE(is_registered(dst + n - 1)) << n;
    for (size_t i = 0; i < n; ++i) src[i] = static_cast<unsigned char>(rng());
    std::memset(dst, 0xA5, n);  // poison
    size_t off = n > 1 ? rng() % 64 : 0;  // misaligned device offset
    if (off + n > (40u << 20)) off = 0;
    CUDA_OK(cudaMemcpy(static_cast<char*>(dev) + off, src, n, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dst, static_cast<char*>(dev) + off, n, cudaMemcpyDeviceToHost));
    ASSERT_EQ(std::memcmp(src, dst, n), 0) << "size " << n;
    pool->deallocate(src);
    pool->deallocate(dst);
  }
  CUDA_OK(cudaFree(dev));
  PoolStats s = pool->stats();
  EXPECT_GT(s.register_ns, 0u);
  EXPECT_GE(s.chunk_reservations, 2u);
}

TEST(PinnedPool, AsyncCopyFromPoolMemoryDoesNotBlockTheHost) {
  auto pool = cuda::make_pinned_pool(small_chunks(), 0);
  const size_t n = 64u << 20;
  auto* src = static_cast<unsigned char*>(pool->allocate(n));
  std::memset(src, 0x3C, n);
  void* dev = nullptr;
  CUDA_OK(cudaMalloc(&dev, n));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUDA_OK(cudaMemcpyAsync(dev, src, n, cudaMemcpyHostToDevice, s));
  // A pinned source lets the call return before the DMA ends (usually): we only
  // check that it completes and is correct; speed is `ferry bench pool`'s job.
  CUDA_OK(cudaStreamSynchronize(s));
  std::vector<unsigned char> back(n);
  CUDA_OK(cudaMemcpy(back.data(), dev, n, cudaMemcpyDeviceToHost));
  EXPECT_EQ(back[0], 0x3C);
  EXPECT_EQ(back[n - 1], 0x3C);
  CUDA_OK(cudaStreamDestroy(s));
  CUDA_OK(cudaFree(dev));
  pool->deallocate(src);
}

TEST(PinnedPool, RegisterFaultFailsCleanlyAndPoolRecovers) {
  auto pool = cuda::make_pinned_pool(small_chunks(), 0);
  set_fault_injection("register:0");
  EXPECT_THROW(pool->allocate(1u << 20), CudaError);
  set_fault_injection("");
  PoolStats s = pool->stats();
  EXPECT_EQ(s.kind[0].reserved.current + s.kind[1].reserved.current, 0u);
  void* p = pool->allocate(1u << 20);
  EXPECT_TRUE(is_registered(p));
  pool->deallocate(p);
}

TEST(PinnedPool, BackgroundTargetServesAllocationsWithoutNewChunks) {
  PoolOptions o = small_chunks();
  o.target_bytes = 64u << 20;
  auto pool = cuda::make_pinned_pool(o, 0);
  pool->wait_ready();
  PoolStats before = pool->stats();
  EXPECT_EQ(before.chunk_reservations, 1u) << "the target is one chunk";
  void* p = pool->allocate(10u << 20);
  EXPECT_TRUE(is_registered(p));
  EXPECT_EQ(pool->stats().chunk_reservations, 1u);
  pool->deallocate(p);
}

// Target N, then one allocation of N (from the target) and a second one of N
// (a dedicated chunk, no target): each is one registration, used whole by DMA
// on a stream in both directions, for each way of overlapping the touch with
// the registration (at once, after 64 MiB, after the whole touch).
TEST(PinnedPool, ATargetServesOneAllocationOfItsSizeUsedWholeByDma) {
  const size_t n = (size_t{1} << 30) + (6u << 20) + 12345;
  const size_t rounded = (n + (2u << 20) - 1) / (2u << 20) * (2u << 20);
  void* dev = nullptr;
  CUDA_OK(cudaMalloc(&dev, n));
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (const size_t lead : {size_t{0}, size_t{64} << 20, SIZE_MAX}) {
    SCOPED_TRACE("register_lead_bytes=" + std::to_string(lead));
    PoolOptions o;
    o.target_bytes = n;
    o.register_lead_bytes = lead;
    auto pool = cuda::make_pinned_pool(o, 0);
    auto* src = static_cast<unsigned char*>(pool->allocate(n));  // waits for the target
    PoolStats s = pool->stats();
    EXPECT_EQ(s.chunk_reservations, 1u);
    EXPECT_EQ(s.kind[0].reserved.current + s.kind[1].reserved.current, rounded) << "pinned more than the target";
    auto* dst = static_cast<unsigned char*>(pool->allocate(n));  // a chunk of its own
    EXPECT_EQ(pool->stats().chunk_reservations, 2u);
    for (unsigned char* p : {src, dst}) {
      ASSERT_TRUE(is_registered(p));
      ASSERT_TRUE(is_registered(p + n - 1));
    }
    std::mt19937_64 rng(lead);
    for (size_t i = 0; i + 8 <= n; i += 8) {
      const uint64_t v = rng();
      std::memcpy(src + i, &v, 8);
    }
    for (size_t i = n / 8 * 8; i < n; ++i) src[i] = static_cast<unsigned char>(rng());
    std::memset(dst, 0x5A, n);  // poison
    CUDA_OK(cudaMemsetAsync(dev, 0xA5, n, stream));
    CUDA_OK(cudaMemcpyAsync(dev, src, n, cudaMemcpyHostToDevice, stream));
    CUDA_OK(cudaMemcpyAsync(dst, dev, n, cudaMemcpyDeviceToHost, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    ASSERT_EQ(std::memcmp(src, dst, n), 0);
    pool->deallocate(src);
    pool->deallocate(dst);
  }
  CUDA_OK(cudaStreamDestroy(stream));
  CUDA_OK(cudaFree(dev));
}

TEST(PinnedPool, TrimUnpinsAndReleases) {
  auto pool = cuda::make_pinned_pool(small_chunks(), 0);
  void* p = pool->allocate(20u << 20);
  pool->deallocate(p);
  size_t released = pool->trim(0);
  EXPECT_GE(released, 20u << 20);
  PoolStats s = pool->stats();
  EXPECT_EQ(s.kind[1].reserved.current, 0u);
  EXPECT_GE(s.chunk_releases, 1u);
}

TEST(PinnedPool, BadDeviceIsAnInvalidArgument) {
  EXPECT_THROW(cuda::make_pinned_pool(small_chunks(), 1000), InvalidArgument);
}

}  // namespace
}  // namespace ferry
