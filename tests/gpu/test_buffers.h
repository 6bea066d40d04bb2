// test_buffers.h — host and device buffers for the GPU tests: pageable host
// memory straight from mmap (small pages, THP or memfd), device memory, random
// fills, and whether a page is registered with the driver.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <random>

// Asserts that a CUDA runtime call succeeded, naming the call and the error.
#define CUDA_OK(x)                                                               \
  do {                                                                           \
    const cudaError_t cuda_ok_result_ = (x);                                     \
    ASSERT_EQ(cuda_ok_result_, cudaSuccess) << #x << ": " << cudaGetErrorString(cuda_ok_result_); \
  } while (0)

namespace ferry::cuda::testing {

constexpr size_t KiB = 1u << 10, MiB = 1u << 20;

// Host memory from mmap: pageable, 2 MiB aligned, optionally THP or memfd;
// 2 MiB of slack past the bytes asked for.
struct HostBuffer {
  enum Kind { small, thp, memfd };
  unsigned char* p = nullptr;
  size_t n = 0;
  explicit HostBuffer(size_t bytes, Kind kind = small)
      : n((bytes + 2 * MiB - 1) / (2 * MiB) * (2 * MiB) + 2 * MiB) {
    if (kind == memfd) {
      int fd = memfd_create("ferry-test", MFD_CLOEXEC);
      EXPECT_EQ(ftruncate(fd, n), 0);
      p = static_cast<unsigned char*>(mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
      close(fd);
    } else {
      p = static_cast<unsigned char*>(mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
      madvise(p, n, kind == thp ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    }
    EXPECT_NE(p, MAP_FAILED);
  }
  ~HostBuffer() { munmap(p, n); }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
};

struct DeviceBuffer {
  unsigned char* p = nullptr;
  explicit DeviceBuffer(size_t n) { EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), n), cudaSuccess); }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

inline void fill_random(unsigned char* p, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = rng();
    std::memcpy(p + i, &v, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<unsigned char>(rng());
}

inline bool registered(const void* p) {
  cudaPointerAttributes a{};
  bool r = cudaPointerGetAttributes(&a, p) == cudaSuccess && a.type == cudaMemoryTypeHost;
  cudaGetLastError();
  return r;
}

}  // namespace ferry::cuda::testing
