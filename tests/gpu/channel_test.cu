// channel_test.cu — the low-latency channel on a real GPU: writes, reads and
// fills of random payloads at every size class and device offset, checked with
// cudaMemcpy against poisoned guards; every small size at every offset in a
// 16-byte line, back to back; signal/wait against kernels on another
// stream; per-thread order under 8 concurrent threads; idle exit, relaunch and
// the relaunch race; cudaDeviceSynchronize() with the channel open; close with
// requests in flight; process exit without close (re-runs this binary); the
// 64 KiB limit; bad pointers; the GDRCopy option.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <cuda/atomic>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "cuda/channel/channel.h"
#include "cuda/channel/gdrcopy.h"

extern char** environ;

namespace ferry::cuda {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

#define CUDA_OK(x)                                                                   \
  do {                                                                               \
    const cudaError_t err_ = (x);                                                    \
    ASSERT_EQ(err_, cudaSuccess) << #x << ": " << cudaGetErrorString(err_);          \
  } while (0)

constexpr size_t kGuard = 64;  // poisoned bytes on each side of every range
const size_t kSizes[] = {1, 2, 3, 15, 16, 17, 103, 104, 105, 255, 4096, 4097, 65535, 65536};
constexpr char kChildEnv[] = "FERRYTEST_CHANNEL_CHILD";

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A host -> device copy or a memset that has landed when it returns. The
// channel is not ordered with CUDA streams: its kernel serves a request as soon
// as it is published. cudaMemcpy from pageable memory returns once the bytes
// are staged, before their DMA lands (CUDA runtime API, "API synchronization
// behavior"), and cudaMemset returns at once; a running channel kernel serves
// the next request within microseconds, so without the synchronize the copy
// can land after it (channel-gpu-run1: the second small request of a test
// "failed" that way).
cudaError_t upload(void* dst, const void* src, size_t n) {
  const cudaError_t e = cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice);
  return e != cudaSuccess ? e : cudaStreamSynchronize(0);
}

cudaError_t clear(void* dst, size_t n) {
  const cudaError_t e = cudaMemset(dst, 0, n);
  return e != cudaSuccess ? e : cudaStreamSynchronize(0);
}

// cudaMalloc'ed bytes, freed at scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    const cudaError_t e = cudaMalloc(&p_, n);
    if (e != cudaSuccess) throw std::runtime_error(std::string("cudaMalloc: ") + cudaGetErrorString(e));
  }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  unsigned char* at(size_t offset) const { return static_cast<unsigned char*>(p_) + offset; }
  size_t size() const { return n_; }

 private:
  void* p_ = nullptr;
  size_t n_;
};

std::vector<unsigned char> random_bytes(std::mt19937_64& rng, size_t n) {
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Waits (acquire) until *flag >= value, then copies n words of data to out.
// status: 1 reached, 2 timed out.
__global__ void wait_flag_then_copy(uint32_t* flag, uint32_t value, const uint32_t* data,
                                    uint32_t* out, int n, int* status, uint64_t timeout_ns) {
  ::cuda::atomic_ref<uint32_t, ::cuda::thread_scope_system> f(*flag);
  const uint64_t start = global_timer_ns();
  while (f.load(::cuda::memory_order_acquire) < value) {
    if (global_timer_ns() - start > timeout_ns) {
      *status = 2;
      return;
    }
    __nanosleep(100);
  }
  for (int i = 0; i < n; ++i) out[i] = data[i];
  *status = 1;
}

// Sleeps delay_ns on the GPU, then release-stores value to *flag.
__global__ void set_flag_after(uint32_t* flag, uint32_t value, uint64_t delay_ns) {
  const uint64_t start = global_timer_ns();
  while (global_timer_ns() - start < delay_ns) __nanosleep(1000);
  ::cuda::atomic_ref<uint32_t, ::cuda::thread_scope_system>(*flag).store(
      value, ::cuda::memory_order_release);
}

TEST(Channel, WritesRandomPayloadsAtEverySizeAndOffset) {
  Channel channel(0);
  std::mt19937_64 rng(1);
  DeviceBuffer dev(kChannelMaxPayload + 32 + 2 * kGuard);
  std::vector<unsigned char> image(dev.size()), back(dev.size());
  for (size_t n : kSizes) {
    const size_t offsets[] = {0, rng() % 32, rng() % 32, 31};
    for (size_t offset : offsets) {
      image = random_bytes(rng, dev.size());  // poison: random, so no byte value is special
      CUDA_OK(upload(dev.at(0), image.data(), image.size()));
      const std::vector<unsigned char> payload = random_bytes(rng, n);
      channel.write(dev.at(kGuard + offset), payload.data(), n);
      std::memcpy(image.data() + kGuard + offset, payload.data(), n);
      CUDA_OK(cudaMemcpy(back.data(), dev.at(0), back.size(), cudaMemcpyDeviceToHost));
      ASSERT_EQ(std::memcmp(back.data(), image.data(), image.size()), 0)
          << "write of " << n << " bytes at device offset " << offset;
    }
  }
  EXPECT_EQ(channel.stats().requests, std::size(kSizes) * 4);
}

TEST(Channel, ReadsRandomDeviceDataIntoPoisonedHostMemory) {
  Channel channel(0);
  std::mt19937_64 rng(2);
  DeviceBuffer dev(kChannelMaxPayload + 32);
  for (size_t n : kSizes) {
    const size_t offsets[] = {0, rng() % 32, rng() % 32, 31};
    for (size_t offset : offsets) {
      // New device data every time: a read must never see bytes a previous one cached.
      const std::vector<unsigned char> device_data = random_bytes(rng, dev.size());
      CUDA_OK(upload(dev.at(0), device_data.data(), dev.size()));
      const size_t host_misalign = rng() % 16;
      std::vector<unsigned char> host(n + 2 * kGuard + 16, 0x5A);
      const std::vector<unsigned char> poisoned = host;
      unsigned char* dst = host.data() + kGuard + host_misalign;
      channel.read(dst, dev.at(offset), n);
      ASSERT_EQ(std::memcmp(dst, device_data.data() + offset, n), 0)
          << "read of " << n << " bytes at device offset " << offset;
      ASSERT_EQ(std::memcmp(host.data(), poisoned.data(), kGuard + host_misalign), 0)
          << "bytes before the destination changed, size " << n;
      const size_t after = kGuard + host_misalign + n;
      ASSERT_EQ(std::memcmp(host.data() + after, poisoned.data() + after, host.size() - after), 0)
          << "bytes after the destination changed, size " << n;
    }
  }
}

TEST(Channel, FillSetsExactlyItsRange) {
  Channel channel(0);
  std::mt19937_64 rng(3);
  DeviceBuffer dev(kChannelMaxPayload + 32 + 2 * kGuard);
  std::vector<unsigned char> image(dev.size()), back(dev.size());
  for (size_t n : kSizes) {
    const size_t offset = rng() % 32;
    const int value = static_cast<int>(rng() % 256);
    image = random_bytes(rng, dev.size());
    CUDA_OK(upload(dev.at(0), image.data(), image.size()));
    channel.fill(dev.at(kGuard + offset), value, n);
    std::memset(image.data() + kGuard + offset, value, n);
    CUDA_OK(cudaMemcpy(back.data(), dev.at(0), back.size(), cudaMemcpyDeviceToHost));
    ASSERT_EQ(std::memcmp(back.data(), image.data(), image.size()), 0)
        << "fill of " << n << " bytes with " << value << " at offset " << offset;
  }
  EXPECT_THROW(channel.fill(dev.at(0), 256, 1), InvalidArgument);
  EXPECT_THROW(channel.fill(dev.at(0), -1, 1), InvalidArgument);
}

TEST(Channel, SmallRequestsAtEveryOffsetInALine) {
  // Sizes 1 .. 2 * 104 + 1 (inline writes, then payload writes with byte edges)
  // at device offsets 0 .. 15, requests back to back so that the kernel stays
  // hot; each step is checked by reading the whole buffer, guards included,
  // through the channel, and at the end with cudaMemcpy.
  Channel channel(0);
  std::mt19937_64 rng(6);
  constexpr size_t kLargest = 2 * 104 + 1;
  DeviceBuffer dev(kGuard + 16 + kLargest + kGuard);
  std::vector<unsigned char> image = random_bytes(rng, dev.size()), whole(dev.size());
  CUDA_OK(upload(dev.at(0), image.data(), image.size()));
  for (size_t n = 1; n <= kLargest; ++n) {
    for (size_t offset = 0; offset < 16; ++offset) {
      unsigned char* at = dev.at(kGuard + offset);
      const std::vector<unsigned char> payload = random_bytes(rng, n);
      channel.write(at, payload.data(), n);
      std::memcpy(image.data() + kGuard + offset, payload.data(), n);
      std::vector<unsigned char> back(n);
      channel.read(back.data(), at, n);
      ASSERT_EQ(back, payload) << "write then read of " << n << " bytes at offset " << offset;
      channel.read(whole.data(), dev.at(0), whole.size());
      ASSERT_EQ(whole, image) << "write of " << n << " bytes at offset " << offset;
      const int value = static_cast<int>(rng() % 256);
      channel.fill(at, value, n);
      std::memset(image.data() + kGuard + offset, value, n);
      channel.read(whole.data(), dev.at(0), whole.size());
      ASSERT_EQ(whole, image) << "fill of " << n << " bytes at offset " << offset;
    }
  }
  CUDA_OK(cudaMemcpy(whole.data(), dev.at(0), whole.size(), cudaMemcpyDeviceToHost));
  EXPECT_EQ(whole, image);
}

TEST(Channel, ManagedMemoryWorks) {
  Channel channel(0);
  void* managed = nullptr;
  CUDA_OK(cudaMallocManaged(&managed, 4096));
  std::vector<unsigned char> data(300), back(300);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 7);
  channel.write(static_cast<char*>(managed) + 5, data.data(), data.size());
  channel.read(back.data(), static_cast<char*>(managed) + 5, back.size());
  EXPECT_EQ(data, back);
  CUDA_OK(cudaFree(managed));
}

TEST(Channel, ExceedingThePayloadLimitNamesTheCopyEngine) {
  Channel channel(0);
  DeviceBuffer dev(2 * kChannelMaxPayload);
  std::vector<unsigned char> host(kChannelMaxPayload + 1);
  const std::string expected = "use ferry's copy engine (ferry.copy) for transfers above 64 KiB";
  try {
    channel.write(dev.at(0), host.data(), host.size());
    FAIL() << "a write of 64 KiB + 1 was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
  }
  EXPECT_THROW(channel.read(host.data(), dev.at(0), host.size()), InvalidArgument);
  EXPECT_THROW(channel.fill(dev.at(0), 1, host.size()), InvalidArgument);
  EXPECT_THROW(channel.write(dev.at(0), host.data(), 0), InvalidArgument);
  EXPECT_EQ(channel.stats().requests, 0u);
  EXPECT_EQ(channel.stats().launches, 0u);
}

TEST(Channel, BadPointersAreRefusedAndTheChannelStaysUsable) {
  Channel channel(0);
  DeviceBuffer dev(4096);
  std::vector<unsigned char> host(64, 1);
  auto message_of = [](auto&& call) -> std::string {
    try {
      call();
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "(no InvalidArgument)";
  };
  EXPECT_NE(message_of([&] { channel.write(host.data(), host.data(), 16); })
                .find("not CUDA device memory"),
            std::string::npos);
  EXPECT_NE(message_of([&] { channel.write(dev.at(4090), host.data(), 16); })
                .find("runs past the end of its allocation"),
            std::string::npos);
  void* pinned = nullptr;
  CUDA_OK(cudaMallocHost(&pinned, 4096));
  EXPECT_NE(message_of([&] { channel.read(host.data(), pinned, 16); }).find("pinned host memory"),
            std::string::npos);
  CUDA_OK(cudaFreeHost(pinned));
  EXPECT_NE(message_of([&] { channel.signal(reinterpret_cast<uint32_t*>(dev.at(2)), 1); })
                .find("4-byte aligned"),
            std::string::npos);
  EXPECT_NE(message_of([&] { channel.write(nullptr, host.data(), 1); }).find("must not be NULL"),
            std::string::npos);
  channel.write(dev.at(4080), host.data(), 16);  // the last 16 bytes: allowed
  std::vector<unsigned char> back(16);
  channel.read(back.data(), dev.at(4080), 16);
  EXPECT_EQ(std::vector<unsigned char>(host.begin(), host.begin() + 16), back);
}

TEST(Channel, SignalReleasesAKernelOnAnotherStreamAfterEarlierWrites) {
  Channel channel(0);
  DeviceBuffer flag(4), data(256 * 4), out(256 * 4), status(4);
  CUDA_OK(clear(flag.at(0), 4));
  CUDA_OK(clear(out.at(0), out.size()));
  CUDA_OK(clear(status.at(0), 4));
  cudaStream_t other;
  CUDA_OK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  wait_flag_then_copy<<<1, 1, 0, other>>>(reinterpret_cast<uint32_t*>(flag.at(0)), 7,
                                          reinterpret_cast<const uint32_t*>(data.at(0)),
                                          reinterpret_cast<uint32_t*>(out.at(0)), 256,
                                          reinterpret_cast<int*>(status.at(0)), 5'000'000'000ull);
  CUDA_OK(cudaGetLastError());
  std::vector<uint32_t> words(256);
  for (uint32_t i = 0; i < 256; ++i) words[i] = 0xC0DE0000u + i;
  channel.write(data.at(0), words.data(), words.size() * 4);  // must be visible before the flag
  channel.signal(reinterpret_cast<uint32_t*>(flag.at(0)), 7);
  CUDA_OK(cudaStreamSynchronize(other));
  int st = 0;
  CUDA_OK(cudaMemcpy(&st, status.at(0), 4, cudaMemcpyDeviceToHost));
  EXPECT_EQ(st, 1) << "the waiting kernel timed out: the signal never arrived";
  std::vector<uint32_t> copied(256);
  CUDA_OK(cudaMemcpy(copied.data(), out.at(0), out.size(), cudaMemcpyDeviceToHost));
  EXPECT_EQ(copied, words);
  CUDA_OK(cudaStreamDestroy(other));
}

TEST(Channel, WaitReturnsWhenAKernelOnAnotherStreamSetsTheFlag) {
  Channel channel(0);
  DeviceBuffer flag(4);
  CUDA_OK(clear(flag.at(0), 4));
  auto* f = reinterpret_cast<uint32_t*>(flag.at(0));
  cudaStream_t other;
  CUDA_OK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  set_flag_after<<<1, 1, 0, other>>>(f, 42, 2'000'000);  // 2 ms
  CUDA_OK(cudaGetLastError());
  auto t0 = Clock::now();
  EXPECT_TRUE(channel.wait(f, 42, 2'000'000));
  EXPECT_LT(seconds_since(t0), 1.0);
  CUDA_OK(cudaStreamSynchronize(other));
  t0 = Clock::now();
  EXPECT_FALSE(channel.wait(f, 43, 1000));  // 1 ms, never reached
  const double waited = seconds_since(t0);
  EXPECT_GE(waited, 0.001);
  EXPECT_LT(waited, 1.0);
  channel.ping();  // still usable after a timed-out wait
  CUDA_OK(cudaStreamDestroy(other));
}

void threads_keep_their_order(uint32_t slots) {
  ChannelOptions options;
  options.slots = slots;
  Channel channel(0, options);
  constexpr int kThreads = 8, kRequests = 500;
  constexpr size_t kRegion = 4096;  // each thread's own device bytes
  DeviceBuffer dev(kThreads * kRegion);
  CUDA_OK(clear(dev.at(0), dev.size()));
  std::mutex failure_mutex;
  std::string first_failure;
  std::atomic<long> reads{0};
  auto record = [&](const std::string& what) {
    std::lock_guard<std::mutex> lock(failure_mutex);
    if (first_failure.empty()) first_failure = what;
  };
  auto worker = [&](int t) {
    try {
      std::mt19937_64 rng(100 + t);
      unsigned char* region = dev.at(t * kRegion);
      const size_t sizes[] = {4, 64, 104, 200, 1000, kRegion};
      std::vector<uint32_t> words(kRegion / 4);
      for (uint32_t k = 1; k <= kRequests; ++k) {
        const size_t n = sizes[rng() % std::size(sizes)];
        std::fill(words.begin(), words.begin() + n / 4, k);
        channel.write(region, words.data(), n);
        if (k % 3 == 0) {
          uint32_t seen = 0;
          channel.read(&seen, region, 4);
          ++reads;
          if (seen != k) {
            record("thread " + std::to_string(t) + " wrote " + std::to_string(k) +
                   " then read " + std::to_string(seen));
            return;
          }
        }
      }
    } catch (const std::exception& e) {
      record("thread " + std::to_string(t) + ": " + e.what());
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();
  ASSERT_TRUE(first_failure.empty()) << first_failure;
  for (int t = 0; t < kThreads; ++t) {
    uint32_t last = 0;
    CUDA_OK(cudaMemcpy(&last, dev.at(t * kRegion), 4, cudaMemcpyDeviceToHost));
    EXPECT_EQ(last, static_cast<uint32_t>(kRequests)) << "thread " << t;
  }
  EXPECT_EQ(channel.stats().requests, static_cast<uint64_t>(kThreads * kRequests + reads.load()));
}

TEST(Channel, EightThreadsKeepTheirOwnOrder) { threads_keep_their_order(8); }

TEST(Channel, EightThreadsKeepTheirOrderOnTwoSlots) { threads_keep_their_order(2); }

TEST(Channel, IdleKernelExitsAndTheNextRequestRelaunchesIt) {
  ChannelOptions options;
  options.idle_us = 200;
  Channel channel(0, options);
  DeviceBuffer dev(64);
  channel.ping();
  EXPECT_EQ(channel.stats().launches, 1u);
  const auto t0 = Clock::now();
  while (channel.stats().idle_exits < 1 && seconds_since(t0) < 2.0)
    std::this_thread::sleep_for(milliseconds(1));
  ASSERT_GE(channel.stats().idle_exits, 1u) << "the kernel did not leave after 200 us idle";
  for (uint32_t k = 1; k <= 20; ++k) {
    std::this_thread::sleep_for(milliseconds(2));  // > idle: every request relaunches
    channel.write(dev.at(0), &k, 4);
    uint32_t back = 0;
    channel.read(&back, dev.at(0), 4);
    ASSERT_EQ(back, k);
  }
  const ChannelStats s = channel.stats();
  EXPECT_GE(s.launches, 11u) << "sleeping longer than idle_us must cause relaunches";
  EXPECT_EQ(s.requests, 41u);
}

TEST(Channel, RequestsAroundTheIdleDeadlineNeverGetLost) {
  // Requests arrive just before, at and after the kernel's idle deadline, so
  // the Dekker handshake (stopping / re-check / relaunch) races for real.
  ChannelOptions options;
  options.idle_us = 30;
  options.timeout_ms = 3000;
  Channel channel(0, options);
  std::mt19937_64 rng(4);
  const auto t0 = Clock::now();
  for (int i = 0; i < 3000; ++i) {
    const auto pause = std::chrono::microseconds(rng() % 80);
    const auto until = Clock::now() + pause;
    while (Clock::now() < until) {
    }
    channel.ping();
  }
  const ChannelStats s = channel.stats();
  EXPECT_EQ(s.requests, 3000u);
  EXPECT_GT(s.launches, 10u) << "the pauses should have crossed the idle deadline often";
  EXPECT_LT(seconds_since(t0), 30.0);
}

TEST(Channel, DeviceSynchronizeReturnsWhileTheChannelIsOpen) {
  Channel channel(0);
  DeviceBuffer dev(64);
  channel.ping();  // the kernel is running now
  auto t0 = Clock::now();
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_LT(seconds_since(t0), 1.0);
  // With another thread issuing requests for 50 ms: synchronize returns once they stop.
  std::atomic<bool> stop{false};
  std::thread requester([&] {
    const auto start = Clock::now();
    uint32_t k = 0;
    while (seconds_since(start) < 0.05) channel.write(dev.at(0), &++k, 4);
    stop = true;
  });
  std::this_thread::sleep_for(milliseconds(5));
  t0 = Clock::now();
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_LT(seconds_since(t0), 2.0);
  requester.join();
  EXPECT_TRUE(stop.load());
}

TEST(Channel, CloseStopsALongIdleKernelAndRefusesLaterRequests) {
  ChannelOptions options;
  options.idle_us = 10'000'000;  // 10 s: only the stop request ends it early
  Channel channel(0, options);
  channel.ping();
  const auto t0 = Clock::now();
  channel.close();
  EXPECT_LT(seconds_since(t0), 1.0);
  EXPECT_TRUE(channel.closed());
  EXPECT_THROW(channel.ping(), InvalidArgument);
  channel.close();  // idempotent
  const auto t1 = Clock::now();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_LT(seconds_since(t1), 1.0) << "the kernel is still running after close";
}

TEST(Channel, CloseWhileOtherThreadsSendRequests) {
  Channel channel(0);
  DeviceBuffer dev(8 * 64);
  std::atomic<int> unexpected{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      uint32_t k = 0;
      for (;;) {
        try {
          channel.write(dev.at(t * 64), &++k, 4);
        } catch (const InvalidArgument&) {
          return;  // "the channel is closed"
        } catch (...) {
          ++unexpected;
          return;
        }
      }
    });
  std::this_thread::sleep_for(milliseconds(20));
  channel.close();
  for (auto& th : threads) th.join();
  EXPECT_EQ(unexpected.load(), 0);
}

// Run by ProcessExitWithoutCloseDoesNotHang in a child process only.
TEST(ChannelChild, ExitWithoutClose) {
  if (!std::getenv(kChildEnv)) GTEST_SKIP() << "runs as a child of ProcessExitWithoutCloseDoesNotHang";
  auto* leaked = new Channel(0);
  DeviceBuffer* dev = new DeviceBuffer(64);
  uint32_t k = 7;
  leaked->write(dev->at(0), &k, 4);  // the kernel is running when we exit
  std::exit(0);
}

TEST(Channel, ProcessExitWithoutCloseDoesNotHang) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) env_strings.emplace_back(*e);
  env_strings.push_back(std::string(kChildEnv) + "=1");
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe", filter = "--gtest_filter=ChannelChild.ExitWithoutClose";
  char* argv[] = {exe.data(), filter.data(), nullptr};
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()), 0);
  const auto t0 = Clock::now();
  int status = 0;
  pid_t done = 0;
  while ((done = waitpid(pid, &status, WNOHANG)) == 0 && seconds_since(t0) < 30.0)
    std::this_thread::sleep_for(milliseconds(20));
  if (done == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    FAIL() << "a process that exited without closing its channel hung for 30 s";
  }
  ASSERT_EQ(done, pid);
  ASSERT_TRUE(WIFEXITED(status)) << "child status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_LT(seconds_since(t0), 20.0);
}

TEST(Channel, GdrcopyOptionWorksOrSaysWhyNot) {
  ChannelOptions options;
  options.use_gdrcopy = true;
  const GdrcopyStatus& status = gdrcopy_status();
  if (!status.available) {
    try {
      Channel channel(0, options);
      FAIL() << "use_gdrcopy was accepted without GDRCopy";
    } catch (const NotSupported& e) {
      EXPECT_NE(std::string(e.what()).find(status.reason), std::string::npos) << e.what();
    }
    return;
  }
  Channel channel(0, options);
  DeviceBuffer dev(1 << 20);
  std::mt19937_64 rng(5);
  for (size_t n : kSizes) {
    const size_t offset = rng() % 32;
    const std::vector<unsigned char> payload = random_bytes(rng, n);
    channel.write(dev.at(offset), payload.data(), n);
    std::vector<unsigned char> back(n);
    channel.read(back.data(), dev.at(offset), n);  // through the kernel: ordered after the write
    ASSERT_EQ(back, payload) << "size " << n;
  }
  EXPECT_GT(channel.stats().gdrcopy_writes, 0u);
}

TEST(Channel, BadOptionsAndDevicesAreInvalidArguments) {
  ChannelOptions options;
  options.slots = 0;
  EXPECT_THROW(Channel(0, options), InvalidArgument);
  EXPECT_THROW(Channel(1000), InvalidArgument);
}

}  // namespace
}  // namespace ferry::cuda
