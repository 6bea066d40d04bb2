// bench.cpp — timing loops that must run in C++ (a Python loop would measure
// Python): pool recycle latency and the CUDA runtime's baselines.
#include <nanobind/nanobind.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <vector>

#include "cuda/baselines.h"
#include "pool/pool.h"
#include "python/handles.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace ferry::python {

// Nanoseconds of each allocate+deallocate pair of `bytes`, after one warm-up
// pair (so every timed pair recycles).
std::vector<uint64_t> pool_recycle_ns(PoolHandle& h, size_t bytes, size_t alignment, int iterations) {
  nb::gil_scoped_release unlocked;
  Pool& pool = *h.pool;
  pool.deallocate(pool.allocate(bytes, alignment));
  std::vector<uint64_t> ns;
  ns.reserve(iterations);
  for (int i = 0; i < iterations; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    void* p = pool.allocate(bytes, alignment);
    pool.deallocate(p);
    auto t1 = std::chrono::steady_clock::now();
    ns.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
  }
  return ns;
}

void bind_bench(nb::module_& m) {
  m.def("pool_recycle_ns", &pool_recycle_ns, "pool"_a, "nbytes"_a, "alignment"_a = 256,
        "iterations"_a = 1000);
  m.def("cuda_host_alloc_seconds",
        [](size_t bytes, int device) {
          nb::gil_scoped_release unlocked;
          auto t = cuda::time_cuda_host_alloc(bytes, device);
          return std::vector<double>{t.alloc, t.free};
        },
        "nbytes"_a, "device"_a = 0);
  m.def("cuda_host_alloc_free_ns",
        [](size_t bytes, int iterations, int device) {
          nb::gil_scoped_release unlocked;
          return cuda::time_cuda_host_alloc_free_ns(bytes, iterations, device);
        },
        "nbytes"_a, "iterations"_a = 100, "device"_a = 0);
  m.def("cuda_host_register_seconds",
        [](uintptr_t ptr, size_t bytes, int device) {
          nb::gil_scoped_release unlocked;
          auto t = cuda::time_cuda_host_register(reinterpret_cast<void*>(ptr), bytes, device);
          return std::vector<double>{t.alloc, t.free};
        },
        "ptr"_a, "nbytes"_a, "device"_a = 0);
  m.def("cuda_warm_up", [](int device) { cuda::warm_up(device); }, "device"_a = 0);
}

}  // namespace ferry::python
