// batch_lookup_test.cpp — PointerLookup on real allocations (kinds, ranges,
// device views, one driver query per allocation) and the batches that rely on
// it: many odd blocks of one pinned and one device allocation, random data,
// poisoned destinations, both directions, kernel and copy-engine paths; and a
// batch with one op past its device allocation, refused before any work.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/copy/copy_engine.h"
#include "cuda/pointer_lookup.h"
#include "test_buffers.h"
#include "test_engine.h"

namespace ferry::cuda {
namespace {

using namespace ferry::cuda::testing;

TEST(PointerLookup, KindsRangesAndOneQueryPerAllocation) {
  const size_t n = 3 * MiB + 5;
  unsigned char *dev = nullptr, *pinned = nullptr, *managed = nullptr;
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&dev), n));
  CUDA_OK(cudaHostAlloc(reinterpret_cast<void**>(&pinned), n, cudaHostAllocMapped));
  CUDA_OK(cudaMallocManaged(reinterpret_cast<void**>(&managed), n));
  std::vector<unsigned char> pageable(n);
  void* device_of_pinned = nullptr;
  CUDA_OK(cudaHostGetDevicePointer(&device_of_pinned, pinned, 0));

  PointerLookup lookup;
  EXPECT_EQ(lookup.classify(dev + 7, n - 7), Memory::device);
  EXPECT_EQ(lookup.classify(managed + 7, 64), Memory::device);
  EXPECT_EQ(lookup.classify(pinned + 7, n - 7), Memory::pinned_host);
  EXPECT_EQ(lookup.classify(pageable.data(), n), Memory::pageable_host);
  EXPECT_EQ(lookup.device_bytes_after(dev + 100), n - 100);
  EXPECT_EQ(lookup.device_view(dev + 100), dev + 100);
  EXPECT_EQ(lookup.device_view(pinned + 100), static_cast<unsigned char*>(device_of_pinned) + 100);
  EXPECT_EQ(lookup.device_view(pageable.data() + 1), pageable.data() + 1);
  const size_t after_first = lookup.driver_queries();
  for (size_t off = 0; off < n; off += 4099) {  // inside known allocations: no driver call
    lookup.classify(dev + off, n - off);
    lookup.classify(pinned + off, n - off);
    lookup.device_view(pinned + off);
    lookup.device_bytes_after(dev + off);
  }
  EXPECT_EQ(lookup.driver_queries(), after_first);
  EXPECT_LE(after_first, 4u + 2u) << "one query per allocation (pageable memory is asked each time)";
  EXPECT_EQ(lookup.device_bytes_after(dev + n - 1), 1u);
  cudaFree(dev);
  cudaFreeHost(pinned);
  cudaFree(managed);
}

TEST(PointerLookup, PinnedOnlyWhenBothEndsArePinned) {
  const size_t page = 4096, n = 64 * page;
  auto* host = static_cast<unsigned char*>(
      mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(host, MAP_FAILED);
  CUDA_OK(cudaHostRegister(host, n / 2, cudaHostRegisterDefault));
  PointerLookup lookup;
  EXPECT_EQ(lookup.classify(host + 8, n / 2 - 8), Memory::pinned_host);
  EXPECT_EQ(lookup.classify(host + 8, n / 2 - 7), Memory::pageable_host);  // last byte not registered
  EXPECT_EQ(lookup.classify(host + n / 2, 16), Memory::pageable_host);
  CUDA_OK(cudaHostUnregister(host));
  munmap(host, n);
}

// Odd sizes at odd offsets on both sides of one pinned and one device
// allocation; `down` copies the blocks back into a poisoned second pinned
// allocation.
struct Blocks {
  std::vector<CopyOp> up, down;
  unsigned char *pinned = nullptr, *back = nullptr, *dev = nullptr;
  size_t bytes = 0;
  Blocks(int count, size_t max_block, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<size_t> sizes(count);
    for (auto& z : sizes) bytes += (z = 1 + rng() % max_block) + 64;
    EXPECT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&pinned), bytes, 0), cudaSuccess);
    EXPECT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&back), bytes, 0), cudaSuccess);
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&dev), bytes), cudaSuccess);
    fill_random(pinned, bytes, seed + 1);
    std::memset(back, 0x5A, bytes);
    EXPECT_EQ(cudaMemset(dev, 0xA5, bytes), cudaSuccess);
    size_t hoff = 0, doff = bytes;
    for (size_t z : sizes) {  // host blocks forward, device blocks backward
      const size_t hskew = rng() % 32, dskew = rng() % 32;
      doff -= z + 64;
      up.push_back({dev + doff + dskew, pinned + hoff + hskew, z});
      down.push_back({back + hoff + hskew, dev + doff + dskew, z});
      hoff += z + 64;
    }
  }
  ~Blocks() {
    cudaFreeHost(pinned);
    cudaFreeHost(back);
    cudaFree(dev);
  }
  // Every block came back; every byte between blocks kept its poison.
  void check() const {
    std::vector<bool> written(bytes);
    for (size_t i = 0; i < down.size(); ++i) {
      auto* d = static_cast<unsigned char*>(down[i].dst);
      ASSERT_EQ(std::memcmp(d, up[i].src, down[i].bytes), 0) << "block " << i << " of " << down[i].bytes;
      for (size_t k = 0; k < down[i].bytes; ++k) written[d - back + k] = true;
    }
    for (size_t k = 0; k < bytes; ++k)
      ASSERT_TRUE(written[k] || back[k] == 0x5A) << "byte " << k << " outside every block was written";
  }
};

void round_trip(Blocks& b, Strategy strategy) {
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  engine().copy_many_async(b.up, s, strategy).wait();
  engine().copy_many_async(b.down, s, strategy).wait();
  CUDA_OK(cudaStreamDestroy(s));
  b.check();
}

TEST(BatchLookup, ManySmallBlocksOfTwoAllocations) {  // automatic: the SM kernel
  Blocks b(1024, 64 * KiB, 31);
  round_trip(b, Strategy::automatic);
}

TEST(BatchLookup, ManyBlocksThroughTheCopyEngines) {
  Blocks b(1024, 256 * KiB, 32);
  round_trip(b, Strategy::direct);
}

TEST(BatchLookup, ManyBlocksThroughTheKernel) {
  Blocks b(700, 100 * KiB, 33);
  round_trip(b, Strategy::sm);
}

TEST(BatchLookup, OneOpPastItsDeviceAllocationRefusesTheBatch) {
  Blocks b(64, 16 * KiB, 34);
  // The last op of `up` writes the device blocks' lowest address; make it run
  // past the end of the device allocation instead.
  std::vector<CopyOp> up = b.up;
  const size_t bad = up.size() / 2;
  up[bad].dst = b.dev + b.bytes - 100;
  up[bad].bytes = 101;
  const uint64_t copies = engine().stats().copies;
  for (Strategy strategy : {Strategy::automatic, Strategy::direct, Strategy::sm}) {
    try {
      engine().copy_many_async(up, nullptr, strategy);
      ADD_FAILURE() << "the batch was accepted";
    } catch (const InvalidArgument& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("item " + std::to_string(bad) + " of " + std::to_string(up.size()) + ": destination"), std::string::npos) << m;
      EXPECT_NE(m.find("the device allocation holds 100 B"), std::string::npos) << m;
    }
  }
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(engine().stats().copies, copies);
  std::vector<unsigned char> dev(b.bytes);
  CUDA_OK(cudaMemcpy(dev.data(), b.dev, b.bytes, cudaMemcpyDeviceToHost));
  for (size_t k = 0; k < b.bytes; ++k) ASSERT_EQ(dev[k], 0xA5) << "device byte " << k << " was written";
}

}  // namespace
}  // namespace ferry::cuda
