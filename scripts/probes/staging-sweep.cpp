// staging-sweep.cpp — what bounds a staged pageable copy on this machine:
//  A. host copy bandwidth into a ring of reused destination memory, by ring
//     size (cache-resident vs DRAM), thread count and store kind (memcpy vs
//     non-temporal stores);
//  B. the copy engine's staged path by slot size, slot count and workers;
//  C. hybrid (staged + pinned in place) shares;
//  D. cudaHostRegister / cudaHostUnregister of 4 KiB-page memory by piece size;
//  E. a worker wake-up (submit -> task runs) after idle.
// Built and run by scripts/probes/run-staging-sweep.
#include <cuda_runtime_api.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sys/mman.h>
#include <thread>
#include <vector>

#include "core/worker_pool.h"
#include "cuda/copy/copy_engine.h"

#include "probe_common.h"

using namespace ferry;
using Clock = std::chrono::steady_clock;

using probe::ok;

static double seconds(const std::function<void()>& f) {
  auto a = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - a).count();
}

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

__attribute__((target("avx2"))) static void copy_nt(void* dst, const void* src, size_t n) {
  auto* d = static_cast<char*>(dst);
  auto* s = static_cast<const char*>(src);
  size_t head = (32 - (reinterpret_cast<uintptr_t>(d) & 31)) & 31;
  if (head > n) head = n;
  std::memcpy(d, s, head);
  d += head, s += head, n -= head;
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 64));
    __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 96), e);
  }
  _mm_sfence();
  std::memcpy(d + i, s + i, n - i);
}

// Each of `threads` threads copies its share of `total` bytes from `src` in
// pieces of `piece` bytes into its own part of a ring of `ring` bytes.
static double ring_copy_gbps(char* src, char* ring, size_t total, size_t ring_bytes, size_t piece, int threads,
                             bool nt, bool reverse) {
  std::vector<std::thread> ts;
  std::atomic<int> go{0};
  const size_t share = total / threads, ring_share = ring_bytes / threads;
  auto body = [&](int t) {
    while (!go) {
    }
    char* s = src + t * share;
    char* r = ring + t * ring_share;
    size_t at = 0;
    for (size_t off = 0; off < share; off += piece) {
      size_t n = std::min(piece, share - off);
      if (at + n > ring_share) at = 0;
      char* a = reverse ? s + off : r + at;
      const char* b = reverse ? r + at : s + off;
      if (nt)
        copy_nt(a, b, n);
      else
        std::memcpy(a, b, n);
      at += n;
    }
  };
  for (int t = 0; t < threads; ++t) ts.emplace_back(body, t);
  double s = seconds([&] {
    go = 1;
    for (auto& t : ts) t.join();
  });
  return total / s / 1e9;
}

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  ok(cudaSetDevice(0), "cudaSetDevice");
  ok(cudaFree(nullptr), "init");
  const size_t total = 1u << 30;
  char* src = static_cast<char*>(mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  madvise(src, total, MADV_NOHUGEPAGE);
  std::memset(src, 3, total);
  char* ring;
  ok(cudaHostAlloc(reinterpret_cast<void**>(&ring), total, 0), "cudaHostAlloc ring");
  std::memset(ring, 1, total);

  std::printf("== A. host copy into a reused ring (1 GiB moved, GB/s; pinned ring) ==\n");
  std::printf("%-8s %-10s %-8s %-4s %10s %10s\n", "threads", "ring", "piece", "nt", "user->ring", "ring->user");
  for (int threads : {4, 8, 12, 16}) {
    for (size_t ring_bytes : {size_t{4} << 20, size_t{16} << 20, size_t{64} << 20, total}) {
      for (size_t piece : {size_t{64} << 10, size_t{256} << 10}) {
        for (bool nt : {false, true}) {
          if (piece > ring_bytes / threads) continue;
          double a = ring_copy_gbps(src, ring, total, ring_bytes, piece, threads, nt, false);
          double b = ring_copy_gbps(src, ring, total, ring_bytes, piece, threads, nt, true);
          std::printf("%-8d %-10zu %-8zu %-4d %10.1f %10.1f\n", threads, ring_bytes >> 20, piece >> 10, nt, a, b);
        }
      }
    }
  }
  std::fflush(stdout);

  void* dev;
  ok(cudaMalloc(&dev, total), "cudaMalloc");
  std::printf("\n== B. staged copies by geometry (GB/s, median of 5) ==\n");
  std::printf("%-10s %-8s %-6s %-8s %8s %8s\n", "size", "chunk", "slots", "workers", "h2d", "d2h");
  std::vector<size_t> sizes = {size_t{4} << 20, size_t{16} << 20, size_t{64} << 20, total};
  for (int workers : {8, 16}) {
    for (size_t chunk : {size_t{256} << 10, size_t{1} << 20, size_t{4} << 20}) {
      for (int slots : {4, 8, 16, 32}) {
        if (quick && slots == 32) continue;
        cuda::CopyEngineOptions o = cuda::CopyEngineOptions::from_environment(0);
        o.workers = workers;
        o.profile.staging_chunk_bytes = chunk;
        o.profile.staging_slots = slots;
        o.profile.cuda_below_bytes[0] = o.profile.cuda_below_bytes[1] = 0;
        cuda::CopyEngine e(o);
        e.warm_up();
        for (size_t n : sizes) {
          double g[2];
          for (int dir = 0; dir < 2; ++dir) {
            void* d = dir == 0 ? dev : static_cast<void*>(src);
            const void* s = dir == 0 ? static_cast<const void*>(src) : dev;
            std::vector<double> t;
            for (int i = 0; i < (n == total ? 3 : 7); ++i)
              t.push_back(seconds([&] { e.copy(d, s, n, nullptr, Strategy::staged); }));
            g[dir] = n / median(t) / 1e9;
          }
          std::printf("%-10zu %-8zu %-6d %-8d %8.1f %8.1f\n", n >> 20, chunk >> 10, slots, workers, g[0], g[1]);
        }
        std::fflush(stdout);
      }
    }
  }

  std::printf("\n== C. hybrid shares (GB/s, median of 3; default geometry) ==\n");
  for (double share : {0.0, 0.1, 0.2, 0.3, 0.45}) {
    cuda::CopyEngineOptions o = cuda::CopyEngineOptions::from_environment(0);
    o.profile.hybrid_pinned_share[0] = o.profile.hybrid_pinned_share[1] = share;
    o.profile.hybrid_below_bytes = 0;
    cuda::CopyEngine e(o);
    e.warm_up();
    for (size_t n : {size_t{64} << 20, total}) {
      double g[2];
      for (int dir = 0; dir < 2; ++dir) {
        void* d = dir == 0 ? dev : static_cast<void*>(src);
        const void* s = dir == 0 ? static_cast<const void*>(src) : dev;
        std::vector<double> t;
        for (int i = 0; i < 3; ++i) t.push_back(seconds([&] { e.copy(d, s, n, nullptr, Strategy::hybrid); }));
        g[dir] = n / median(t) / 1e9;
      }
      std::printf("share %.2f  %5zu MiB  h2d %6.1f  d2h %6.1f\n", share, n >> 20, g[0], g[1]);
    }
    std::fflush(stdout);
  }

  std::printf("\n== D. cudaHostRegister / Unregister of touched 4 KiB pages ==\n");
  for (size_t piece : {size_t{2} << 20, size_t{16} << 20, size_t{64} << 20, size_t{256} << 20}) {
    std::vector<double> r, u;
    for (int i = 0; i < 3; ++i) {
      r.push_back(seconds([&] { ok(cudaHostRegister(src, piece, 0), "register"); }));
      u.push_back(seconds([&] { ok(cudaHostUnregister(src), "unregister"); }));
    }
    std::printf("%5zu MiB  register %8.1f us (%5.1f GB/s)  unregister %8.1f us (%5.1f GB/s)\n", piece >> 20,
                median(r) * 1e6, piece / median(r) / 1e9, median(u) * 1e6, piece / median(u) / 1e9);
  }

  std::printf("\n== E. worker wake-up: submit -> task starts (us, median of 100) ==\n");
  {
    WorkerPool pool(4);
    for (int idle_us : {0, 20, 200, 2000}) {
      std::vector<double> lat;
      for (int i = 0; i < 100; ++i) {
        if (idle_us) std::this_thread::sleep_for(std::chrono::microseconds(idle_us));
        std::atomic<int64_t> ran{0};
        auto t0 = Clock::now();
        pool.submit([&] { ran = std::max<int64_t>(1, (Clock::now() - t0).count()); });
        while (ran == 0) {
        }
        lat.push_back(ran / 1e3);
      }
      std::printf("after %5d us idle: %8.2f us\n", idle_us, median(lat));
    }
  }
  return 0;
}
