// baselines.cpp — timings of cudaHostAlloc / cudaHostRegister for comparison.
#include "cuda/bench/baselines.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <exception>
#include <thread>

#include "cuda/copy/copy_engine.h"
#include "cuda/cuda_check.h"
#include "cuda/device.h"
#include "cuda/scoped_device.h"

namespace ferry::cuda {
namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
}  // namespace

namespace {
// Makes `device` current with its context created (callers restore the device).
void make_current(int device) {
  set_device(device);
  check(cudaFree(nullptr), "cudaFree(nullptr) (context creation)");
}
}  // namespace

void warm_up(int device) {
  ScopedDevice restore;
  make_current(device);
}

AllocFreeSeconds time_cuda_host_alloc(size_t bytes, int device) {
  ScopedDevice restore;
  make_current(device);
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
  ScopedDevice restore;
  make_current(device);
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
  ScopedDevice restore;
  make_current(device);
  AllocFreeSeconds t;
  auto t0 = Clock::now();
  check(cudaHostRegister(ptr, bytes, cudaHostRegisterDefault), "cudaHostRegister");
  t.alloc = seconds_since(t0);
  t0 = Clock::now();
  check(cudaHostUnregister(ptr), "cudaHostUnregister");
  t.free = seconds_since(t0);
  return t;
}

std::vector<uint64_t> time_cuda_memcpy_ns(void* dst, const void* src, size_t bytes, int iterations) {
  std::vector<uint64_t> ns;
  for (int i = -1; i < iterations; ++i) {
    auto t0 = Clock::now();
    check(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "cudaMemcpy");
    if (i >= 0) ns.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
  }
  return ns;
}

std::vector<uint64_t> time_cuda_memcpy_async_ns(void* dst, const void* src, size_t bytes, int iterations) {
  return time_memcpy_loop_ns(&dst, &src, &bytes, 1, iterations);
}

std::vector<uint64_t> time_bidirectional_ns(CopyEngine* engine, void* dev_a, const void* host_a, void* host_b,
                                            const void* dev_b, size_t bytes, Strategy strategy, int iterations) {
  auto one = [&](void* d, const void* s) {
    if (engine)
      engine->copy(d, s, bytes, nullptr, strategy);
    else
      check(cudaMemcpy(d, s, bytes, cudaMemcpyDefault), "cudaMemcpy");
  };
  std::vector<uint64_t> ns;
  for (int i = -1; i < iterations; ++i) {
    auto t0 = Clock::now();
    std::exception_ptr err;
    std::thread t([&] {
      try {
        one(host_b, dev_b);
      } catch (...) {
        err = std::current_exception();
      }
    });
    one(dev_a, host_a);
    t.join();
    if (err) std::rethrow_exception(err);
    if (i >= 0) ns.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
  }
  return ns;
}

std::vector<uint64_t> time_memcpy_loop_ns(void* const* dsts, const void* const* srcs, const size_t* sizes,
                                          size_t count, int iterations) {
  StreamHandle s;
  std::vector<uint64_t> ns;
  for (int i = -1; i < iterations; ++i) {
    auto t0 = Clock::now();
    for (size_t k = 0; k < count; ++k)
      check(cudaMemcpyAsync(dsts[k], srcs[k], sizes[k], cudaMemcpyDefault, s.get()), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(s.get()), "cudaStreamSynchronize");
    if (i >= 0) ns.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
  }
  return ns;
}

BatchTimes time_memcpy_batch(const std::vector<BatchList>& lists, int iterations) {
  const size_t n = lists.size();
  std::vector<std::unique_ptr<StreamHandle>> streams;
  for (size_t k = 0; k < n; ++k) streams.push_back(std::make_unique<StreamHandle>());
  auto one = [&](size_t k) {  // the CPU nanoseconds of the batch call
    const BatchList& l = lists[k];
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t attr_index = 0;
    const auto t0 = Clock::now();
    check(cudaMemcpyBatchAsync(const_cast<void**>(l.dsts.data()), const_cast<const void**>(l.srcs.data()),
                               const_cast<size_t*>(l.sizes.data()), l.dsts.size(), &attr, &attr_index, 1,
                               streams[k]->get()),
          "cudaMemcpyBatchAsync");
    const uint64_t submit = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
    check(cudaStreamSynchronize(streams[k]->get()), "cudaStreamSynchronize");
    return submit;
  };
  BatchTimes t;
  for (int i = -1; i < iterations; ++i) {
    std::vector<uint64_t> submit(n, 0);
    std::vector<std::exception_ptr> errors(n);
    const auto t0 = Clock::now();
    std::vector<std::thread> others;
    for (size_t k = 1; k < n; ++k)
      others.emplace_back([&, k] {
        try {
          submit[k] = one(k);
        } catch (...) {
          errors[k] = std::current_exception();
        }
      });
    try {
      submit[0] = one(0);
    } catch (...) {
      errors[0] = std::current_exception();
    }
    for (auto& th : others) th.join();
    const uint64_t wall = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
    if (i < 0) continue;
    t.wall_ns.push_back(wall);
    t.submit_ns.push_back(*std::max_element(submit.begin(), submit.end()));
  }
  return t;
}

StreamHandle::StreamHandle() {
  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
}
StreamHandle::~StreamHandle() { cudaStreamDestroy(stream_); }

void* device_malloc(size_t bytes, int device) {
  ScopedDevice restore;
  if (device >= 0) make_current(device);
  void* p = nullptr;
  check(cudaMalloc(&p, bytes), "cudaMalloc");
  return p;
}
void device_free(void* p) { check(cudaFree(p), "cudaFree"); }
void* pinned_host_alloc(size_t bytes) {
  void* p = nullptr;
  check(cudaHostAlloc(&p, bytes, cudaHostAllocDefault), "cudaHostAlloc");
  return p;
}
void pinned_host_free(void* p) { check(cudaFreeHost(p), "cudaFreeHost"); }

}  // namespace ferry::cuda
