// copy_engine_test.cpp — every copy path on a real device: random data,
// poisoned destinations, odd sizes, misaligned host and device offsets, THP and
// memfd backing, remapped buffers, threads, batches, stream order, and errors
// that leave no worker stuck and no page registered.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/fault.h"
#include "cuda/copy/copy_engine.h"
#include "cuda/registration.h"
#include "test_buffers.h"

namespace ferry::cuda {
namespace {

using namespace ferry::cuda::testing;

CopyEngine& engine() {
  static CopyEngine e([] {
    CopyEngineOptions o = CopyEngineOptions::from_environment(0);
    o.profile.hybrid_pinned_share[0] = o.profile.hybrid_pinned_share[1] = 0.5;
    return o;
  }());
  return e;
}

// H2D from `host` (+hoff) to device (+doff), then D2H into a poisoned second
// host buffer, both with `strategy`; compares byte for byte.
void round_trip(size_t n, size_t hoff, size_t doff, Strategy strategy, HostBuffer::Kind kind, uint64_t seed) {
  std::fprintf(stderr, "  round trip: %zu bytes, host +%zu, device +%zu, %s, backing %d\n", n, hoff, doff,
               strategy_name(strategy), static_cast<int>(kind));
  HostBuffer src(n + hoff, kind), dst(n + hoff, kind);
  DeviceBuffer dev(n + doff);
  fill_random(src.p + hoff, n, seed);
  std::memset(dst.p, 0xEE, dst.n);
  CUDA_OK(cudaMemset(dev.p, 0xCD, n + doff));
  engine().copy(dev.p + doff, src.p + hoff, n, nullptr, strategy);
  engine().copy(dst.p + hoff, dev.p + doff, n, nullptr, strategy);
  ASSERT_EQ(std::memcmp(src.p + hoff, dst.p + hoff, n), 0)
      << "n=" << n << " hoff=" << hoff << " doff=" << doff << " strategy=" << strategy_name(strategy);
  for (size_t i = 0; i < hoff; ++i) ASSERT_EQ(dst.p[i], 0xEE) << "wrote before the destination";
  ASSERT_EQ(dst.p[hoff + n], 0xEE) << "wrote past the destination";
  ASSERT_FALSE(registered(src.p + hoff)) << "a page stayed registered";
  ASSERT_FALSE(registered(dst.p + hoff + n - 1)) << "a page stayed registered";
}

TEST(CopyEngine, EveryStrategySizeAndOffset) {
  const size_t sizes[] = {1, 3, 4095, 4097, MiB + 7, 8 * MiB, 8 * MiB + 1, 37 * MiB + 3, 70 * MiB + 5};
  const Strategy strategies[] = {Strategy::automatic, Strategy::staged, Strategy::pin_in_place,
                                 Strategy::hybrid, Strategy::cuda};
  uint64_t seed = 1;
  for (Strategy s : strategies)
    for (size_t n : sizes)
      for (auto [hoff, doff] : {std::pair<size_t, size_t>{0, 0}, {1, 17}, {63, 1}, {4096 + 5, 256}}) {
        round_trip(n, hoff, doff, s, HostBuffer::small, seed++);
        if (HasFatalFailure()) return;
      }
}

TEST(CopyEngine, ThpAndMemfdBacking) {
  for (auto kind : {HostBuffer::thp, HostBuffer::memfd})
    for (Strategy s : {Strategy::automatic, Strategy::staged, Strategy::pin_in_place, Strategy::hybrid}) {
      round_trip(96 * MiB + 11, 3, 5, s, kind, 100 + static_cast<int>(s));
      if (HasFatalFailure()) return;
    }
}

TEST(CopyEngine, TwoGiB) {
  size_t free_b = 0, total = 0;
  CUDA_OK(cudaMemGetInfo(&free_b, &total));
  if (free_b < (5ull << 30)) GTEST_SKIP() << "needs 5 GiB of free device memory";
  round_trip((2ull << 30) + 3, 1, 0, Strategy::automatic, HostBuffer::small, 77);
}

TEST(CopyEngine, UnmappedAndRemappedBuffers) {
  DeviceBuffer dev(16 * MiB);
  std::vector<unsigned char> back(16 * MiB);
  for (int round = 0; round < 4; ++round) {
    void* p = mmap(nullptr, 16 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(p, MAP_FAILED);
    fill_random(static_cast<unsigned char*>(p), 16 * MiB, 500 + round);
    for (Strategy s : {Strategy::staged, Strategy::pin_in_place}) {
      engine().copy(dev.p, p, 16 * MiB, nullptr, s);
      CUDA_OK(cudaMemcpy(back.data(), dev.p, 16 * MiB, cudaMemcpyDeviceToHost));
      ASSERT_EQ(std::memcmp(back.data(), p, 16 * MiB), 0) << "round " << round;
    }
    munmap(p, 16 * MiB);  // the next round's mmap may get the same address back
  }
}

// Each of `threads` threads copies its own random buffer of size_of(t) bytes
// (a poisoned one back) to the device and back `rounds` times, through
// engine().copy; returns the rounds that failed. staged: every copy must be
// planned as staged.
template <class SizeOf>
int round_trips_in_threads(int threads, int rounds, uint64_t seed, SizeOf size_of, bool staged = false) {
  std::vector<std::thread> workers;
  std::atomic<int> failures{0};
  for (int t = 0; t < threads; ++t)
    workers.emplace_back([&, t] {
      const size_t n = size_of(t);
      HostBuffer a(n), b(n);
      DeviceBuffer d(n);
      for (int i = 0; i < rounds; ++i) {
        fill_random(a.p, n, seed + t * 100 + i);
        std::memset(b.p, 0xA5, n);
        try {
          if (staged && engine().plan(d.p, a.p, n) != Strategy::staged) {
            ADD_FAILURE() << "thread " << t << ": " << n << " bytes are not staged";
            ++failures;
            return;
          }
          engine().copy(d.p, a.p, n);
          engine().copy(b.p, d.p, n);
        } catch (const std::exception& e) {
          ADD_FAILURE() << "thread " << t << ": " << e.what();
          ++failures;
          return;
        }
        if (std::memcmp(a.p, b.p, n) != 0) ++failures;
      }
    });
  for (auto& w : workers) w.join();
  return failures.load();
}

TEST(CopyEngine, ConcurrentThreadsBothDirections) {
  EXPECT_EQ(round_trips_in_threads(6, 5, 0, [](int t) { return (5 + t) * MiB + t; }), 0);
}

// The hang a cuda-gdb dump showed on the H200: cudaFree in one thread takes
// the driver's lock and waits for the device to go idle, while staged copies
// in other threads are being enqueued. Nothing a lane stream waits on may
// depend on a CUDA call still to come (run_staged submits each piece's task
// before its stream waits on it); synchronous copies now take the eager path,
// where no GPU stream waits for a CPU thread at all.
TEST(CopyEngine, StagedCopiesSurviveDeviceSynchronizingCallsInAnotherThread) {
  std::atomic<bool> copying{true};
  std::atomic<int> syncs{0};
  std::thread syncer([&] {
    while (copying.load()) {
      void* p = nullptr;
      if (cudaMalloc(&p, 3 * MiB) == cudaSuccess) cudaFree(p);  // cudaFree synchronizes the device
      cudaDeviceSynchronize();
      ++syncs;
    }
  });
  // Staged both ways, more pieces than slots.
  const int failures = round_trips_in_threads(4, 8, 1000, [](int t) { return 9 * MiB + 3 * t + 1; }, true);
  copying = false;
  syncer.join();
  EXPECT_EQ(failures, 0);
  EXPECT_GT(syncs.load(), 0);
}

// The same with the stream-ordered pipeline, where GPU streams do wait on CPU
// flags: async device->host copies in four threads while another thread
// calls cudaFree and cudaDeviceSynchronize.
TEST(CopyEngine, StreamOrderedCopiesSurviveDeviceSynchronizingCallsInAnotherThread) {
  std::atomic<bool> copying{true};
  std::thread syncer([&] {
    while (copying.load()) {
      void* p = nullptr;
      if (cudaMalloc(&p, 3 * MiB) == cudaSuccess) cudaFree(p);
      cudaDeviceSynchronize();
    }
  });
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      const size_t n = 9 * MiB + 3 * t + 1;
      HostBuffer a(n), b(n);
      DeviceBuffer d(n);
      cudaStream_t s;
      if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return void(++failures);
      for (int i = 0; i < 8; ++i) {
        fill_random(a.p, n, 3000 + t * 10 + i);
        std::memset(b.p, 0x11, n);
        try {
          engine().copy(d.p, a.p, n, s, Strategy::automatic);
          engine().copy_async(b.p, d.p, n, s, Strategy::staged).wait();
        } catch (const std::exception& e) {
          ADD_FAILURE() << e.what();
          ++failures;
        }
        if (std::memcmp(a.p, b.p, n) != 0) ++failures;
      }
      cudaStreamDestroy(s);
    });
  for (auto& t : threads) t.join();
  copying = false;
  syncer.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(CopyEngine, AsyncIsOrderedOnTheCallersStream) {
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const size_t n = 40 * MiB + 9;
  HostBuffer host(n), back(n);
  DeviceBuffer d(n), d2(n);
  // Work before the copy on the stream: a memset the D2H copy must see.
  CUDA_OK(cudaMemsetAsync(d.p, 0x5A, n, s));
  Completion c = engine().copy_async(back.p, d.p, n, s, Strategy::staged);
  c.wait();
  for (size_t i = 0; i < n; i += 4093) ASSERT_EQ(back.p[i], 0x5A) << i;
  ASSERT_EQ(back.p[n - 1], 0x5A);
  // Work after the copy on the stream sees its result.
  fill_random(host.p, n, 9);
  Completion c2 = engine().copy_async(d.p, host.p, n, s);
  CUDA_OK(cudaMemcpyAsync(d2.p, d.p, n, cudaMemcpyDeviceToDevice, s));
  CUDA_OK(cudaStreamSynchronize(s));
  EXPECT_TRUE(c2.query());
  EXPECT_EQ(c2.strategy(), Strategy::staged);
  std::memset(back.p, 0, n);
  CUDA_OK(cudaMemcpy(back.p, d2.p, n, cudaMemcpyDeviceToHost));
  ASSERT_EQ(std::memcmp(back.p, host.p, n), 0);
  // The event is usable by the caller.
  CUDA_OK(cudaEventSynchronize(c2.event()));
  EXPECT_GE(c2.seconds(), 0.0);
  CUDA_OK(cudaStreamDestroy(s));
}

TEST(CopyEngine, BatchOfScatteredBlocks) {
  const int blocks = 256;
  std::vector<size_t> sizes(blocks);
  std::mt19937_64 rng(3);
  size_t total = 0;
  for (auto& z : sizes) total += (z = (16 << 10) + rng() % (240 << 10) + (rng() % 2));
  unsigned char *pinned = nullptr, *back = nullptr;
  CUDA_OK(cudaHostAlloc(reinterpret_cast<void**>(&pinned), total * 2, 0));
  CUDA_OK(cudaHostAlloc(reinterpret_cast<void**>(&back), total * 2, 0));
  DeviceBuffer dev(total * 2);
  fill_random(pinned, total * 2, 11);
  std::memset(back, 0, total * 2);
  std::vector<CopyOp> up, down;
  size_t hoff = 0, doff = total * 2;
  for (size_t z : sizes) {  // host blocks forward, device blocks backward: scattered
    doff -= z + 3;
    up.push_back({dev.p + doff, pinned + hoff, z});
    down.push_back({back + hoff, dev.p + doff, z});
    hoff += z + 5;
  }
  HostBuffer pageable(3 * MiB);  // one pageable op in the batch too
  fill_random(pageable.p, 3 * MiB, 12);
  up.push_back({dev.p, pageable.p, 3 * MiB});
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  engine().copy_many_async(up, s).wait();
  std::vector<unsigned char> head(3 * MiB);
  CUDA_OK(cudaMemcpy(head.data(), dev.p, 3 * MiB, cudaMemcpyDeviceToHost));
  ASSERT_EQ(std::memcmp(head.data(), pageable.p, 3 * MiB), 0);
  // The pageable op overwrote the first device bytes: skip blocks it touched.
  engine().copy_many_async(down, s).wait();
  for (size_t i = 0; i < down.size(); ++i) {
    auto* d = static_cast<unsigned char*>(down[i].dst);
    if (static_cast<const unsigned char*>(down[i].src) < dev.p + 3 * MiB) continue;
    ASSERT_EQ(std::memcmp(d, static_cast<const unsigned char*>(up[i].src), down[i].bytes), 0) << "block " << i;
  }
  CUDA_OK(cudaStreamDestroy(s));
  cudaFreeHost(pinned);
  cudaFreeHost(back);
}

TEST(CopyEngine, SmKernelBatchOfOddBlocksBothDirections) {
  // Blocks of odd sizes at odd offsets on both sides, some with matching and
  // some with different alignment modulo 16 (the kernel's two paths).
  const int blocks = 300;
  std::mt19937_64 rng(21);
  std::vector<size_t> sizes(blocks);
  size_t total = 0;
  for (auto& z : sizes) total += (z = 1 + rng() % (200 << 10));
  unsigned char *pinned = nullptr, *back = nullptr;
  CUDA_OK(cudaHostAlloc(reinterpret_cast<void**>(&pinned), total + blocks * 64, 0));
  CUDA_OK(cudaHostAlloc(reinterpret_cast<void**>(&back), total + blocks * 64, 0));
  DeviceBuffer dev(total + blocks * 64);
  fill_random(pinned, total + blocks * 64, 22);
  std::memset(back, 0x77, total + blocks * 64);
  CUDA_OK(cudaMemset(dev.p, 0x99, total + blocks * 64));
  std::vector<CopyOp> up, down;
  size_t hoff = 0, doff = total + blocks * 64;
  for (size_t z : sizes) {
    const size_t hskew = rng() % 32, dskew = rng() % 32;
    doff -= z + 32;
    up.push_back({dev.p + doff + dskew, pinned + hoff + hskew, z});
    down.push_back({back + hoff + hskew, dev.p + doff + dskew, z});
    hoff += z + 32;
  }
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Completion c = engine().copy_many_async(up, s, Strategy::sm);
  EXPECT_EQ(c.strategy(), Strategy::sm);
  c.wait();
  engine().copy_many_async(down, s, Strategy::sm).wait();
  for (size_t i = 0; i < up.size(); ++i)
    ASSERT_EQ(std::memcmp(down[i].dst, up[i].src, up[i].bytes), 0) << "block " << i << " of " << up[i].bytes;
  // Nothing outside the blocks was written on the host side.
  size_t guard_ok = 0;
  for (size_t i = 0; i < up.size(); ++i) {
    auto* end = static_cast<unsigned char*>(down[i].dst) + down[i].bytes;
    guard_ok += (end[0] == 0x77 || static_cast<size_t>(end - back) >= hoff);
  }
  EXPECT_EQ(guard_ok, up.size());
  CUDA_OK(cudaStreamDestroy(s));
  cudaFreeHost(pinned);
  cudaFreeHost(back);
}

TEST(CopyEngine, BadInputIsRefusedBeforeAnyWork) {
  DeviceBuffer dev(MiB);
  std::vector<unsigned char> host(2 * MiB);
  EXPECT_THROW(engine().copy(dev.p, host.data(), 0), InvalidArgument);
  EXPECT_THROW(engine().copy(nullptr, host.data(), 16), InvalidArgument);
  EXPECT_THROW(engine().copy(host.data() + 8, host.data(), 64), InvalidArgument);  // host<->host
  EXPECT_THROW(engine().copy(dev.p + 8, dev.p, 64), InvalidArgument);              // overlap
  EXPECT_THROW(engine().copy(dev.p, host.data(), 2 * MiB), InvalidArgument);       // past the allocation
  void* gone = mmap(nullptr, MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  munmap(gone, MiB);
  EXPECT_THROW(engine().copy(dev.p, gone, MiB), InvalidArgument);  // unmapped host memory
  try {
    engine().copy(host.data(), host.data() + MiB, 64);
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("neither"), std::string::npos) << e.what();
  }
  engine().copy(dev.p, host.data(), MiB);  // the engine still works
}

TEST(CopyEngine, WorkerFaultFailsTheCopyAndLeavesNothingStuck) {
  const size_t n = 32 * MiB;
  HostBuffer host(n);
  DeviceBuffer dev(n);
  fill_random(host.p, n, 5);
  set_fault_injection("touch:2");
  EXPECT_THROW(engine().copy(dev.p, host.p, n, nullptr, Strategy::staged), Error);
  set_fault_injection("");
  engine().copy(dev.p, host.p, n, nullptr, Strategy::staged);  // next copy on the same lane works
  std::vector<unsigned char> back(n);
  CUDA_OK(cudaMemcpy(back.data(), dev.p, n, cudaMemcpyDeviceToHost));
  EXPECT_EQ(std::memcmp(back.data(), host.p, n), 0);
}

TEST(CopyEngine, WorkerFaultInTheStreamOrderedPipelineLeavesNothingStuck) {
  // Async host->device copies from eager_async_below_bytes (64 MiB) up take
  // the stream-ordered pipeline, whose workers wait on GPU flags.
  const size_t n = 80 * MiB + 5;
  HostBuffer host(n);
  DeviceBuffer dev(n);
  fill_random(host.p, n, 15);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  set_fault_injection("touch:4");
  EXPECT_THROW(engine().copy_async(dev.p, host.p, n, s, Strategy::staged).wait(), Error);
  set_fault_injection("");
  engine().copy_async(dev.p, host.p, n, s, Strategy::staged).wait();
  std::vector<unsigned char> back(n);
  CUDA_OK(cudaMemcpy(back.data(), dev.p, n, cudaMemcpyDeviceToHost));
  EXPECT_EQ(std::memcmp(back.data(), host.p, n), 0);
  CUDA_OK(cudaStreamDestroy(s));
}

TEST(CopyEngine, RegisterFaultInPinInPlaceLeavesNoPageRegistered) {
  const size_t n = 256 * MiB;
  HostBuffer host(n);
  DeviceBuffer dev(n);
  fill_random(host.p, n, 6);
  set_fault_injection("register:2");
  EXPECT_THROW(engine().copy(dev.p, host.p, n, nullptr, Strategy::pin_in_place), CudaError);
  set_fault_injection("");
  for (size_t off = 0; off < n; off += 2 * MiB) ASSERT_FALSE(registered(host.p + off)) << off;
  engine().copy(dev.p, host.p, n, nullptr, Strategy::pin_in_place);
}

TEST(CopyEngine, RegistrationMakesCopiesDirect) {
  const size_t n = 10 * MiB + 3;
  HostBuffer host(n + 100);
  DeviceBuffer dev(n);
  EXPECT_EQ(engine().plan(dev.p, host.p + 100, n), Strategy::staged);
  {
    Registration r(host.p + 100, n, 0);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(r.base()) % (2 * MiB), 0u) << "widened to whole huge pages";
    EXPECT_EQ(engine().plan(dev.p, host.p + 100, n), Strategy::direct);
    fill_random(host.p + 100, n, 8);
    Completion c = engine().copy_async(dev.p, host.p + 100, n, nullptr);
    EXPECT_EQ(c.strategy(), Strategy::direct);
    c.wait();
    EXPECT_THROW(Registration(host.p + 200, 10, 0), CudaError);  // overlaps the registration
  }
  EXPECT_FALSE(registered(host.p + 100));
  std::vector<unsigned char> back(n);
  CUDA_OK(cudaMemcpy(back.data(), dev.p, n, cudaMemcpyDeviceToHost));
  EXPECT_EQ(std::memcmp(back.data(), host.p + 100, n), 0);
}

}  // namespace
}  // namespace ferry::cuda
