// eager-trace.cpp — where an eager staged copy's time goes, by size: the crew
// copying into a staging area alone (no DMA), the DMAs alone (2 MiB chunks
// from pinned memory), run_eager with the caller alone and with the crew, and
// the engine's copy(). Median microseconds of 50 runs. Built and run by
// scripts/probes/run-eager-trace.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <immintrin.h>
#include <sys/mman.h>
#include <vector>

#include "copy/copy_crew.h"
#include "copy/host_copy.h"
#include "copy/staging_plan.h"
#include "core/crew.h"
#include "cuda/copy/copy_engine.h"
#include "cuda/copy/eager_copy.h"
#include "cuda/pinned_pool.h"
#include "cuda/staging_area.h"
#include "pool/pool.h"

#include "probe_common.h"

using namespace ferry;
using Clock = std::chrono::steady_clock;

using probe::ok;

__attribute__((target("cldemote"))) static void copy_demote(char* d, const char* s, size_t n) {
  std::memcpy(d, s, n);
  for (size_t i = 0; i < n; i += 64) _cldemote(d + i);
}

struct DemoteJob {
  char* dst;
  const char* src;
  size_t piece, n;
  static void run(void* c, uint32_t i) noexcept {
    auto& j = *static_cast<DemoteJob*>(c);
    const size_t off = i * j.piece;
    copy_demote(j.dst + off, j.src + off, std::min(j.piece, j.n - off));
  }
};

using probe::median_us;

struct CopyJob {
  char* dst;
  const char* src;
  size_t piece;
  size_t n;
  bool evict = false;
  static void run(void* c, uint32_t i) noexcept {
    auto& j = *static_cast<CopyJob*>(c);
    const size_t off = i * j.piece;
    copy_from_staging(j.dst + off, j.src + off, std::min(j.piece, j.n - off));  // streaming stores
    if (j.evict) evict_from_caches(j.src + off, std::min(j.piece, j.n - off));
  }
};

// The crew copies n bytes from src to dst (plain or streaming stores).
static void crew_copy(Crew& crew, char* dst, const char* src, size_t n, bool evict) {
  const size_t piece = piece_bytes_for(n, 2u << 20, crew.threads() + 1);
  const uint32_t pieces = static_cast<uint32_t>((n + piece - 1) / piece);
  CopyJob j{dst, src, piece, n, evict};
  CrewJob job(&CopyJob::run, &j, pieces);
  crew.post(job, pieces);
  job.work();
  crew.retire(job);
}

int main() {
  ok(cudaSetDevice(0), "cudaSetDevice");
  ok(cudaFree(nullptr), "init");
  const size_t max = 64u << 20;
  char* src = static_cast<char*>(mmap(nullptr, max, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  madvise(src, max, MADV_NOHUGEPAGE);
  std::memset(src, 5, max);
  void* dev;
  ok(cudaMalloc(&dev, max), "cudaMalloc");
  std::unique_ptr<Pool> pinned = cuda::make_pinned_pool(PoolOptions{}, 0);
  StagingGeometry geometry;  // 16 slots of 2 MiB
  cuda::StagingArea area(*pinned, geometry, cuda::SlotWait::poll);
  std::memset(area.base(), 0, area.bytes());
  cudaStream_t s;
  ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  Crew& crew = copy_crew();
  Crew alone(0, 0);
  cuda::CopyEngine engine(cuda::CopyEngineOptions::from_environment(0));
  engine.warm_up();
  std::printf("crew threads: %d (+ the caller)\n", crew.threads());
  std::printf("%-10s %12s %12s %12s %12s %12s %12s %12s\n", "size", "crew-memcpy", "dma-only", "eager-alone",
              "eager-crew", "copy() h2d", "copy() d2h", "cudaMemcpy");
  for (size_t n : {size_t{4} << 10, size_t{64} << 10, size_t{256} << 10, size_t{1} << 20, size_t{4} << 20,
                   size_t{16} << 20, size_t{64} << 20}) {
    const size_t piece = piece_bytes_for(n, 2u << 20, crew.threads() + 1);
    const size_t area_n = std::min(n, area.bytes());
    const uint32_t pieces = static_cast<uint32_t>((area_n + piece - 1) / piece);
    double t_crew = median_us(50, [&] {
      CopyJob j{reinterpret_cast<char*>(area.base()), src, piece, area_n};
      CrewJob job(&CopyJob::run, &j, pieces);
      crew.post(job, pieces);
      job.work();
      crew.retire(job);
    });
    if (n > area_n) t_crew *= static_cast<double>(n) / area_n;
    double t_dma = median_us(50, [&] {
      for (size_t off = 0; off < n; off += 2u << 20) {
        const size_t c = std::min<size_t>(2u << 20, n - off);
        cudaMemcpyAsync(static_cast<char*>(dev) + off, area.base() + (off % area.bytes()), c, cudaMemcpyHostToDevice, s);
        cudaEventRecord(area.slot_done((off >> 21) % 16), s);
      }
      cudaStreamSynchronize(s);
    });
    cuda::EagerItem item{dev, src, n};
    double t_alone = median_us(50, [&] { cuda::run_eager(Direction::h2d, {&item, 1}, area, alone, s, true); });
    double t_eager = median_us(50, [&] { cuda::run_eager(Direction::h2d, {&item, 1}, area, crew, s, true); });
    double t_copy = median_us(50, [&] { engine.copy(dev, src, n); });
    double t_back = median_us(50, [&] { engine.copy(src, dev, n); });
    double t_cuda = median_us(50, [&] { cudaMemcpy(dev, src, n, cudaMemcpyHostToDevice); });
    std::printf("%-10zu %12.1f %12.1f %12.1f %12.1f %12.1f %12.1f %12.1f   (KiB; us)\n", n >> 10, t_crew, t_dma,
                t_alone, t_eager, t_copy, t_back, t_cuda);
    std::fflush(stdout);
  }

  // Does a DMA slow down when the CPU has just written its source (dirty lines
  // in the cores' caches) or the CPU reads right after a DMA wrote?
  std::printf("\n%-10s %14s %14s %14s %16s %16s %12s %12s\n", "size", "dma clean", "dma after cpu", "dma after nt",
              "copy-out plain", "copy-out nt", "d2h clean", "d2h after rd");
  for (size_t n : {size_t{1} << 20, size_t{4} << 20, size_t{16} << 20, size_t{32} << 20}) {
    auto dma = [&] {
      cudaMemcpyAsync(dev, area.base(), n, cudaMemcpyHostToDevice, s);
      cudaStreamSynchronize(s);
    };
    auto timed = [&](const std::function<void()>& before) {
      std::vector<double> t;
      for (int i = 0; i < 30; ++i) {
        before();
        auto a = Clock::now();
        dma();
        t.push_back(std::chrono::duration<double, std::micro>(Clock::now() - a).count());
      }
      std::sort(t.begin(), t.end());
      return t[t.size() / 2];
    };
    double clean = timed([] {});
    double after_cpu = timed([&] {
      std::memcpy(area.base(), src, n);  // plain stores, one thread
    });
    double after_nt = timed([&] { crew_copy(crew, reinterpret_cast<char*>(area.base()), src, n, false); });
    {
      const size_t piece = piece_bytes_for(n, 2u << 20, crew.threads() + 1);
      const uint32_t pieces = static_cast<uint32_t>((n + piece - 1) / piece);
      auto demote_copy = [&] {
        DemoteJob j{reinterpret_cast<char*>(area.base()), src, piece, n};
        CrewJob job(&DemoteJob::run, &j, pieces);
        crew.post(job, pieces);
        job.work();
        crew.retire(job);
      };
      double t_demote_copy = median_us(30, demote_copy);
      double t_nt_copy = median_us(30, [&] { crew_copy(crew, reinterpret_cast<char*>(area.base()), src, n, false); });
      double after_demote = timed(demote_copy);
      std::printf("   crew copy in: streaming %.1f us, plain+cldemote %.1f us; DMA after cldemote %.1f us\n",
                  t_nt_copy, t_demote_copy, after_demote);
    }
    auto copy_out = [&](bool nt) {
      std::vector<double> t;
      for (int i = 0; i < 30; ++i) {
        cudaMemcpyAsync(area.base(), dev, n, cudaMemcpyDeviceToHost, s);
        cudaStreamSynchronize(s);
        auto a = Clock::now();
        if (nt)
          crew_copy(crew, src, reinterpret_cast<char*>(area.base()), n, false);
        else
          std::memcpy(src, area.base(), n);
        t.push_back(std::chrono::duration<double, std::micro>(Clock::now() - a).count());
      }
      std::sort(t.begin(), t.end());
      return t[t.size() / 2];
    };
    double out_plain = copy_out(false), out_nt = copy_out(true);
    // Device->host DMA into the area: after nothing, after the CPU read it.
    auto d2h_dma = [&](bool read_first) {
      std::vector<double> t;
      for (int i = 0; i < 30; ++i) {
        if (read_first) crew_copy(crew, src, reinterpret_cast<char*>(area.base()), n, false);
        auto a = Clock::now();
        cudaMemcpyAsync(area.base(), dev, n, cudaMemcpyDeviceToHost, s);
        cudaStreamSynchronize(s);
        t.push_back(std::chrono::duration<double, std::micro>(Clock::now() - a).count());
      }
      std::sort(t.begin(), t.end());
      return t[t.size() / 2];
    };
    double d2h_clean = d2h_dma(false), d2h_after_read = d2h_dma(true);
    std::vector<double> t_evict, t_copy_evict;
    for (int i = 0; i < 30; ++i) {
      auto a = Clock::now();
      crew_copy(crew, src, reinterpret_cast<char*>(area.base()), n, true);
      t_copy_evict.push_back(std::chrono::duration<double, std::micro>(Clock::now() - a).count());
      a = Clock::now();
      cudaMemcpyAsync(area.base(), dev, n, cudaMemcpyDeviceToHost, s);
      cudaStreamSynchronize(s);
      t_evict.push_back(std::chrono::duration<double, std::micro>(Clock::now() - a).count());
    }
    std::sort(t_evict.begin(), t_evict.end());
    std::sort(t_copy_evict.begin(), t_copy_evict.end());
    std::printf("   copy-out+evict %.1f us, then d2h DMA %.1f us\n", t_copy_evict[15], t_evict[15]);
    std::printf("%-10zu %14.1f %14.1f %14.1f %16.1f %16.1f %12.1f %12.1f  (KiB; us)\n", n >> 10, clean, after_cpu,
                after_nt, out_plain, out_nt, d2h_clean, d2h_after_read);
    std::fflush(stdout);
  }

  // Memory bandwidth: does a DMA from pinned memory slow down while the CPUs
  // stream other bytes (a 64 MiB DMA from the area, while the crew copies
  // 256 MiB pageable -> another buffer with streaming stores)?
  {
    const size_t n = 64u << 20, busy = 256u << 20;
    char* big = static_cast<char*>(mmap(nullptr, 2 * busy, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    std::memset(big, 1, 2 * busy);
    void* pinned64;
    ok(cudaHostAlloc(&pinned64, n, 0), "cudaHostAlloc 64");
    std::memset(pinned64, 2, n);
    auto dma = [&] {
      cudaMemcpyAsync(dev, pinned64, n, cudaMemcpyHostToDevice, s);
      cudaStreamSynchronize(s);
    };
    double alone = median_us(10, dma);
    std::vector<double> t;
    for (int i = 0; i < 10; ++i) {
      std::atomic<bool> go{false};
      std::thread cpu([&] {
        go = true;
        crew_copy(crew, big + busy, big, busy, false);
      });
      while (!go) {
      }
      auto a = Clock::now();
      dma();
      t.push_back(std::chrono::duration<double, std::micro>(Clock::now() - a).count());
      cpu.join();
    }
    std::sort(t.begin(), t.end());
    double cpu_alone = median_us(5, [&] { crew_copy(crew, big + busy, big, busy, false); });
    std::printf("\n64 MiB DMA from pinned memory: alone %.1f us, while the crew streams 256 MiB %.1f us "
                "(the crew alone: %.1f us for 256 MiB)\n", alone, t[5], cpu_alone);
  }
  return 0;
}
