// bench.cpp — timing loops that must run in C++ (a Python loop would measure
// Python): pool recycle latency, the CUDA runtime's baselines, and the host's
// memcpy bandwidth by thread count (pure C++, no CUDA).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "cuda/bench/baselines.h"
#include "cuda/copy/copy_engine.h"
#include "pool/pool.h"
#include "python/copy_args.h"
#include "python/handles.h"
#include "python/gil.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace ferry::python {

// Nanoseconds of each allocate+deallocate pair of `bytes`, after one warm-up
// pair (so every timed pair recycles).
std::vector<uint64_t> pool_recycle_ns(PoolHandle& h, size_t bytes, size_t alignment, int iterations) {
  ferry::python::GilRelease unlocked;
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

using Clock = std::chrono::steady_clock;

uint64_t since_ns(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
}

void* as_ptr(uintptr_t p) { return reinterpret_cast<void*>(p); }

// Nanoseconds of each synchronous ferry copy (after one warm-up copy).
std::vector<uint64_t> copy_ns(cuda::CopyEngine& e, uintptr_t dst, uintptr_t src, size_t n, const std::string& strategy,
                              int iterations) {
  Strategy s = parse_strategy(strategy);
  ferry::python::GilRelease unlocked;
  e.copy(as_ptr(dst), as_ptr(src), n, nullptr, s);
  std::vector<uint64_t> ns;
  for (int i = 0; i < iterations; ++i) {
    auto t0 = Clock::now();
    e.copy(as_ptr(dst), as_ptr(src), n, nullptr, s);
    ns.push_back(since_ns(t0));
  }
  return ns;
}

// copy_ns on a private engine of `device` whose profile is `profile_text`
// (profile lines; keys not named keep their defaults). FERRY_PROFILE cannot
// do this in-process: the options are read once per process (core/options.h).
std::vector<uint64_t> copy_ns_with_profile(int device, const std::string& profile_text, uintptr_t dst, uintptr_t src,
                                           size_t n, const std::string& strategy, int iterations) {
  auto o = cuda::CopyEngineOptions::from_environment(device);
  o.profile = parse_profile(profile_text);
  std::unique_ptr<cuda::CopyEngine> e;
  {
    ferry::python::GilRelease unlocked;
    e = std::make_unique<cuda::CopyEngine>(o);
  }
  auto ns = copy_ns(*e, dst, src, n, strategy, iterations);
  ferry::python::GilRelease unlocked;
  e.reset();  // waits for its work
  return ns;
}

// Nanoseconds of each of `iterations` parallel host memcpys of `bytes` (after
// one untimed warm-up copy): `threads` threads each copy their slice of a
// source buffer into a destination buffer, both first-touched by that thread
// before the first copy, so only the copy is timed. A copy is timed from its
// start (all threads released together) until the last slice is done.
std::vector<uint64_t> host_memcpy_ns(size_t bytes, int threads, int iterations) {
  if (bytes == 0 || threads < 1 || threads > 1024 || iterations < 1)
    throw nb::value_error("host_memcpy_ns: needs bytes >= 1, 1 <= threads <= 1024, iterations >= 1");
  ferry::python::GilRelease unlocked;
  std::unique_ptr<char[]> src(new char[bytes]), dst(new char[bytes]);  // not touched yet
  const size_t slice = (bytes / threads + 4095) / 4096 * 4096;
  std::barrier sync(threads + 1);  // twice per copy: start, end
  std::vector<std::thread> workers;
  try {
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        const size_t lo = std::min(bytes, t * slice), n = std::min(bytes, lo + slice) - lo;
        std::memset(src.get() + lo, 0x5a, n);  // first touch by the thread that copies
        std::memset(dst.get() + lo, 0, n);
        for (int i = -1; i < iterations; ++i) {
          sync.arrive_and_wait();
          std::memcpy(dst.get() + lo, src.get() + lo, n);
          sync.arrive_and_wait();
        }
      });
    }
  } catch (...) {  // a thread could not start: release the others, then report
    for (size_t k = workers.size(); k < size_t(threads); ++k) sync.arrive_and_drop();
    for (int i = -1; i < iterations; ++i) {
      sync.arrive_and_wait();
      sync.arrive_and_wait();
    }
    for (auto& w : workers) w.join();
    throw;
  }
  std::vector<uint64_t> ns;
  for (int i = -1; i < iterations; ++i) {
    auto t0 = Clock::now();
    sync.arrive_and_wait();
    sync.arrive_and_wait();
    if (i >= 0) ns.push_back(since_ns(t0));
  }
  for (auto& w : workers) w.join();
  return ns;
}

// Nanoseconds of each batch (copy_many_async + wait) on one stream.
std::vector<uint64_t> batch_ns(cuda::CopyEngine& e, const std::vector<uintptr_t>& dsts,
                               const std::vector<uintptr_t>& srcs, const std::vector<size_t>& sizes,
                               const std::string& strategy, int iterations) {
  std::vector<cuda::CopyOp> ops(dsts.size());
  for (size_t i = 0; i < ops.size(); ++i) ops[i] = {as_ptr(dsts[i]), as_ptr(srcs[i]), sizes[i]};
  Strategy s = parse_strategy(strategy);
  ferry::python::GilRelease unlocked;
  std::vector<uint64_t> ns;
  cuda::StreamHandle stream;
  for (int i = -1; i < iterations; ++i) {
    auto t0 = Clock::now();
    e.copy_many_async(ops, stream.get(), s).wait();
    if (i >= 0) ns.push_back(since_ns(t0));
  }
  return ns;
}

// cudaMemcpyBatchAsync baseline (baselines.h): `lists` is one (dsts, srcs,
// sizes) tuple of address arrays per thread; returns (wall_ns, submit_ns).
nb::tuple memcpy_batch_ns(nb::list lists, int iterations) {
  std::vector<cuda::BatchList> ls;
  for (nb::handle h : lists) {
    nb::tuple t = nb::cast<nb::tuple>(h);
    cuda::BatchList l;
    for (uintptr_t a : addresses(t[0], "dsts")) l.dsts.push_back(as_ptr(a));
    for (uintptr_t a : addresses(t[1], "srcs")) l.srcs.push_back(as_ptr(a));
    for (uintptr_t a : addresses(t[2], "sizes")) l.sizes.push_back(a);
    if (l.dsts.size() != l.srcs.size() || l.dsts.size() != l.sizes.size() || l.dsts.empty())
      throw nb::value_error("memcpy_batch_ns: dsts, srcs and sizes of one list must have the same, nonzero length");
    ls.push_back(std::move(l));
  }
  if (ls.empty() || iterations < 1) throw nb::value_error("memcpy_batch_ns: needs a list and iterations >= 1");
  cuda::BatchTimes t;
  {
    ferry::python::GilRelease unlocked;
    t = cuda::time_memcpy_batch(ls, iterations);
  }
  return nb::make_tuple(t.wall_ns, t.submit_ns);
}

void bind_bench(nb::module_& m) {
  m.def("memcpy_batch_ns", &memcpy_batch_ns, "lists"_a, "iterations"_a = 5);
  m.def("host_memcpy_ns", &host_memcpy_ns, "nbytes"_a, "threads"_a, "iterations"_a = 3);
  m.def("batch_ns", &batch_ns, "engine"_a, "dsts"_a, "srcs"_a, "sizes"_a, "strategy"_a = "auto",
        "iterations"_a = 10);
  m.def("memcpy_loop_ns",
        [](const std::vector<uintptr_t>& dsts, const std::vector<uintptr_t>& srcs, const std::vector<size_t>& sizes,
           int iterations) {
          std::vector<void*> d(dsts.size());
          std::vector<const void*> s(srcs.size());
          for (size_t i = 0; i < d.size(); ++i) d[i] = as_ptr(dsts[i]), s[i] = as_ptr(srcs[i]);
          ferry::python::GilRelease unlocked;
          return cuda::time_memcpy_loop_ns(d.data(), s.data(), sizes.data(), d.size(), iterations);
        },
        "dsts"_a, "srcs"_a, "sizes"_a, "iterations"_a = 10);
  m.def("copy_ns", &copy_ns, "engine"_a, "dst"_a, "src"_a, "nbytes"_a, "strategy"_a = "auto", "iterations"_a = 5);
  m.def("copy_ns_with_profile", &copy_ns_with_profile, "device"_a, "profile"_a, "dst"_a, "src"_a, "nbytes"_a,
        "strategy"_a = "auto", "iterations"_a = 5);
  m.def("cuda_memcpy_ns",
        [](uintptr_t dst, uintptr_t src, size_t n, int iterations) {
          ferry::python::GilRelease unlocked;
          return cuda::time_cuda_memcpy_ns(as_ptr(dst), as_ptr(src), n, iterations);
        },
        "dst"_a, "src"_a, "nbytes"_a, "iterations"_a = 5);
  m.def("cuda_memcpy_async_ns",
        [](uintptr_t dst, uintptr_t src, size_t n, int iterations) {
          ferry::python::GilRelease unlocked;
          return cuda::time_cuda_memcpy_async_ns(as_ptr(dst), as_ptr(src), n, iterations);
        },
        "dst"_a, "src"_a, "nbytes"_a, "iterations"_a = 5);
  m.def("bidirectional_ns",
        [](cuda::CopyEngine& e, uintptr_t dev_a, uintptr_t host_a, uintptr_t host_b, uintptr_t dev_b, size_t n,
           const std::string& strategy, int iterations) {
          const bool plain = strategy == "cudaMemcpy";
          Strategy s = plain ? Strategy::automatic : parse_strategy(strategy);
          ferry::python::GilRelease unlocked;
          return cuda::time_bidirectional_ns(plain ? nullptr : &e, as_ptr(dev_a), as_ptr(host_a), as_ptr(host_b),
                                             as_ptr(dev_b), n, s, iterations);
        },
        "engine"_a, "dev_a"_a, "host_a"_a, "host_b"_a, "dev_b"_a, "nbytes"_a, "strategy"_a = "auto",
        "iterations"_a = 3);
  // device -1: the calling thread's current device. cuda_warm_up does not change that (it restores it).
  m.def(
      "cuda_malloc",
      [](size_t n, int device) { return reinterpret_cast<uintptr_t>(cuda::device_malloc(n, device)); },
      "nbytes"_a, "device"_a = -1);
  m.def("cuda_free", [](uintptr_t p) { cuda::device_free(as_ptr(p)); });
  m.def("cuda_host_alloc", [](size_t n) { return reinterpret_cast<uintptr_t>(cuda::pinned_host_alloc(n)); });
  m.def("cuda_free_host", [](uintptr_t p) { cuda::pinned_host_free(as_ptr(p)); });
  m.def("pool_recycle_ns", &pool_recycle_ns, "pool"_a, "nbytes"_a, "alignment"_a = 256,
        "iterations"_a = 1000);
  m.def("cuda_host_alloc_seconds",
        [](size_t bytes, int device) {
          ferry::python::GilRelease unlocked;
          auto t = cuda::time_cuda_host_alloc(bytes, device);
          return std::vector<double>{t.alloc, t.free};
        },
        "nbytes"_a, "device"_a = 0);
  m.def("cuda_host_alloc_free_ns",
        [](size_t bytes, int iterations, int device) {
          ferry::python::GilRelease unlocked;
          return cuda::time_cuda_host_alloc_free_ns(bytes, iterations, device);
        },
        "nbytes"_a, "iterations"_a = 100, "device"_a = 0);
  m.def("cuda_host_register_seconds",
        [](uintptr_t ptr, size_t bytes, int device) {
          ferry::python::GilRelease unlocked;
          auto t = cuda::time_cuda_host_register(reinterpret_cast<void*>(ptr), bytes, device);
          return std::vector<double>{t.alloc, t.free};
        },
        "ptr"_a, "nbytes"_a, "device"_a = 0);
  m.def("cuda_warm_up", [](int device) { cuda::warm_up(device); }, "device"_a = 0);
}

}  // namespace ferry::python
