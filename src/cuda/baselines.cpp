// baselines.cpp — timings of cudaHostAlloc / cudaHostRegister for comparison.
#include "cuda/baselines.h"

#include <cuda_runtime_api.h>

#include <chrono>

#include "cuda/cuda_check.h"
#include "cuda/device.h"

namespace ferry::cuda {
namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
}  // namespace

void warm_up(int device) {
  set_device(device);
  check(cudaFree(nullptr), "cudaFree(nullptr) (context creation)");
}

AllocFreeSeconds time_cuda_host_alloc(size_t bytes, int device) {
  warm_up(device);
  AllocFreeSeconds t;
  void* p = nullptr;
  auto t0 = Clock::now();
  check(cudaHostAlloc(&p, bytes, cudaHostAllocDefault), "cudaHostAlloc");
  t.alloc = seconds_since(t0);
  t0 = Clock::now();
  check(cudaFreeHost(p), "cudaFreeHost");
  t.free = seconds_since(t0);
  return t;
}

std::vector<uint64_t> time_cuda_host_alloc_free_ns(size_t bytes, int iterations, int device) {
  warm_up(device);
  std::vector<uint64_t> ns;
  ns.reserve(iterations);
  for (int i = 0; i < iterations; ++i) {
    void* p = nullptr;
    auto t0 = Clock::now();
    check(cudaHostAlloc(&p, bytes, cudaHostAllocDefault), "cudaHostAlloc");
    check(cudaFreeHost(p), "cudaFreeHost");
    ns.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
  }
  return ns;
}

AllocFreeSeconds time_cuda_host_register(void* ptr, size_t bytes, int device) {
  warm_up(device);
  AllocFreeSeconds t;
  auto t0 = Clock::now();
  check(cudaHostRegister(ptr, bytes, cudaHostRegisterDefault), "cudaHostRegister");
  t.alloc = seconds_since(t0);
  t0 = Clock::now();
  check(cudaHostUnregister(ptr), "cudaHostUnregister");
  t.free = seconds_since(t0);
  return t;
}

}  // namespace ferry::cuda
