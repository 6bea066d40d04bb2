// copy-costs.cpp — where one copy call's time goes, on a GPU machine: the
// building blocks (stream/event creation, pointer queries, the host range
// check, a worker wake-up, stream memory operations) and whole CopyEngine calls
// beside cudaMemcpyAsync. Median of repeats, microseconds. Built and run by
// scripts/probes/run-copy-costs.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <sys/mman.h>
#include <thread>
#include <vector>

#include "core/worker_pool.h"
#include "cuda/copy/copy_engine.h"
#include "cuda/driver_entry.h"
#include "cuda/pointer_lookup.h"
#include "os/mapping.h"

#include "probe_common.h"

using namespace ferry;
using Clock = std::chrono::steady_clock;

using probe::ok;

static double median_us(int reps, const std::function<void()>& f) {
  return probe::median_us(reps, f, std::min(reps, 20));
}

static void row(const char* what, double us, size_t bytes = 0) {
  if (bytes)
    std::printf("%-58s %10.2f us  %7.2f GB/s\n", what, us, bytes / us / 1e3);
  else
    std::printf("%-58s %10.2f us\n", what, us);
}

int main() {
  ok(cudaSetDevice(0), "cudaSetDevice");
  ok(cudaFree(nullptr), "init");
  cudaStream_t s;
  ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  const size_t big = 64u << 20;
  void *pinned, *dev;
  ok(cudaHostAlloc(&pinned, big, 0), "cudaHostAlloc");
  ok(cudaMalloc(&dev, big), "cudaMalloc");
  std::memset(pinned, 1, big);
  char* pageable = static_cast<char*>(std::malloc(big));
  std::memset(pageable, 2, big);

  std::printf("== building blocks ==\n");
  row("cudaStreamCreate+Destroy", median_us(200, [] {
        cudaStream_t x;
        cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking);
        cudaStreamDestroy(x);
      }));
  row("cudaEventCreate+Destroy", median_us(200, [] {
        cudaEvent_t e;
        cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
        cudaEventDestroy(e);
      }));
  cudaEvent_t ev;
  ok(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "event");
  row("cudaEventRecord+Synchronize (idle stream)", median_us(500, [&] {
        cudaEventRecord(ev, s);
        cudaEventSynchronize(ev);
      }));
  row("cudaStreamSynchronize (idle stream)", median_us(500, [&] { cudaStreamSynchronize(s); }));
  row("cudaSetDevice", median_us(500, [] { cudaSetDevice(0); }));
  row("cudaGetDevice", median_us(500, [] {
        int d;
        cudaGetDevice(&d);
      }));
  row("PointerLookup.classify (fresh lookup, device ptr)", median_us(500, [&] {
        cuda::PointerLookup l;
        l.classify(dev, 4096);
      }));
  row("PointerLookup.classify (fresh lookup, pinned ptr)", median_us(500, [&] {
        cuda::PointerLookup l;
        l.classify(pinned, 4096);
      }));
  row("PointerLookup.classify (fresh lookup, pageable ptr)", median_us(500, [&] {
        cuda::PointerLookup l;
        l.classify(pageable, 4096);
      }));
  row("os::range_is_mapped 1 MiB (msync MS_ASYNC)", median_us(500, [&] { os::range_is_mapped(pageable, 1 << 20); }));
  row("os::range_is_mapped 64 MiB", median_us(200, [&] { os::range_is_mapped(pageable, big); }));
  {
    WorkerPool pool(4);
    std::atomic<int64_t> ran{0};
    auto wake = [&](int idle_us) {
      return median_us(200, [&] {
        std::this_thread::sleep_for(std::chrono::microseconds(idle_us));
        auto t0 = Clock::now();
        ran = 0;
        pool.submit([&] { ran = (Clock::now() - t0).count(); });
        while (ran == 0) {
        }
      });
    };
    row("WorkerPool submit -> task runs (after 1 ms idle)", wake(1000));
    row("WorkerPool submit -> task runs (after 10 us idle)", wake(10));
  }
  {
    uint64_t* flags;
    ok(cudaHostAlloc(reinterpret_cast<void**>(&flags), 64, cudaHostAllocMapped), "flags");
    std::memset(flags, 0, 64);
    uint64_t g = 0;
    row("stream_wait_geq + stream_write enqueue", median_us(500, [&] {
          ++g;
          flags[0] = g;
          cuda::stream_wait_geq(s, &flags[0], g);
          cuda::stream_write(s, &flags[1], g);
        }));
    cudaStreamSynchronize(s);
  }
  row("cudaMemcpyAsync enqueue only (pinned 4 KiB h2d)", median_us(500, [&] {
        cudaMemcpyAsync(dev, pinned, 4096, cudaMemcpyDefault, s);
      }));
  cudaStreamSynchronize(s);

  std::printf("\n== one pinned copy, synchronous ==\n");
  cuda::CopyEngine engine(cuda::CopyEngineOptions::from_environment(0));
  engine.warm_up();
  for (size_t n : {size_t{4} << 10, size_t{256} << 10, size_t{1} << 20, size_t{4} << 20, size_t{16} << 20}) {
    char label[96];
    std::snprintf(label, sizeof label, "%zu KiB h2d cudaMemcpyAsync+StreamSync", n >> 10);
    row(label, median_us(200, [&] {
          cudaMemcpyAsync(dev, pinned, n, cudaMemcpyDefault, s);
          cudaStreamSynchronize(s);
        }), n);
    std::snprintf(label, sizeof label, "%zu KiB h2d CopyEngine::copy", n >> 10);
    row(label, median_us(200, [&] { engine.copy(dev, pinned, n); }), n);
    std::snprintf(label, sizeof label, "%zu KiB h2d CopyEngine::copy_async(s)+wait", n >> 10);
    row(label, median_us(200, [&] { engine.copy_async(dev, pinned, n, s).wait(); }), n);
  }

  std::printf("\n== one pageable copy, synchronous, by strategy ==\n");
  for (size_t n : {size_t{256} << 10, size_t{1} << 20, size_t{4} << 20, size_t{16} << 20, size_t{64} << 20}) {
    for (int dir = 0; dir < 2; ++dir) {
      void* d = dir == 0 ? dev : static_cast<void*>(pageable);
      const void* src = dir == 0 ? static_cast<const void*>(pageable) : dev;
      char label[96];
      std::snprintf(label, sizeof label, "%zu KiB %s cudaMemcpy", n >> 10, dir ? "d2h" : "h2d");
      row(label, median_us(30, [&] { cudaMemcpy(d, src, n, cudaMemcpyDefault); }), n);
      for (Strategy st : {Strategy::automatic, Strategy::cuda, Strategy::staged, Strategy::pin_in_place}) {
        std::snprintf(label, sizeof label, "%zu KiB %s ferry %s", n >> 10, dir ? "d2h" : "h2d", strategy_name(st));
        row(label, median_us(30, [&] { engine.copy(d, src, n, nullptr, st); }), n);
      }
    }
  }
  return 0;
}
