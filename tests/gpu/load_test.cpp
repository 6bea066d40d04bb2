// load_test.cpp — the checkpoint loader on a real device: random files and
// ranges at odd offsets and sizes into poisoned device memory at misaligned
// addresses, over reader counts, slot sizes and O_DIRECT modes; thousands of
// small tensors back to back; the load is ordered after the caller's stream;
// an error before any read leaves the destination untouched; a CUDA error
// mid-load fails the load naming the file and range, and the same loader
// works after it; two loaders in two threads; the C API round trip.
#include "cuda/load/file_loader.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <random>
#include <thread>

#include "core/error.h"
#include "ferry/ferry.h"
#include "../support/temp_files.h"

namespace ferry {
namespace {

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x << ": " << cudaGetErrorString(x)

constexpr size_t KiB = 1024, MiB = 1024 * KiB;

using Files = test_support::TempFiles;
using test_support::error_of;

struct DeviceBuffer {
  explicit DeviceBuffer(size_t n) : bytes(n) {
    if (cudaMalloc(&p, n + 64) != cudaSuccess) p = nullptr;
    if (p) cudaMemset(p, 0xA5, n + 64);
  }
  ~DeviceBuffer() { cudaFree(p); }
  std::vector<uint8_t> read(size_t off, size_t n) const {
    std::vector<uint8_t> v(n);
    cudaMemcpy(v.data(), static_cast<char*>(p) + off, n, cudaMemcpyDeviceToHost);
    return v;
  }
  void* p = nullptr;
  size_t bytes;
};

// Random ranges packed into the device buffer from byte `skew` on.
struct Plan {
  std::vector<load::FileRange> ranges;
  std::vector<uint8_t> expected;
};

Plan random_plan(const Files& f, std::mt19937_64& rng, int count, void* dev, size_t skew, size_t cap) {
  Plan p;
  for (int k = 0; k < count; ++k) {
    uint32_t i = static_cast<uint32_t>(rng() % f.data.size());
    uint64_t size = f.data[i].size();
    uint64_t off = size ? rng() % size : 0;
    uint64_t n = size ? rng() % (size - off + 1) : 0;
    if (rng() % 3 == 0) off = 0, n = size;
    if (p.expected.size() + n > cap) break;
    p.ranges.push_back({i, off, n, reinterpret_cast<uintptr_t>(dev) + skew + p.expected.size()});
    p.expected.insert(p.expected.end(), f.data[i].begin() + static_cast<ptrdiff_t>(off),
                      f.data[i].begin() + static_cast<ptrdiff_t>(off + n));
  }
  return p;
}

cuda::LoaderOptions options(size_t staging, size_t slot, int threads, load::DirectIo d) {
  cuda::LoaderOptions o;
  o.staging_bytes = staging;
  o.slot_bytes = slot;
  o.threads = threads;
  o.direct_io = d;
  o.progress = cuda::Progress::never;
  return o;
}

TEST(Loader, RandomRangesArriveBitForBit) {
  std::mt19937_64 rng(41);
  Files f;
  ASSERT_TRUE(f.ok());
  for (size_t b : {size_t{0}, size_t{1}, size_t{4097}, size_t{9 * MiB + 5}, size_t{33 * MiB + 4093}, size_t{300 * KiB}})
    f.add(b, rng);
  DeviceBuffer dev(96 * MiB);
  ASSERT_NE(dev.p, nullptr);
  struct Config {
    size_t staging, slot;
    int threads;
    load::DirectIo direct;
  } configs[] = {
      {2 * MiB, 1 * MiB, 1, load::DirectIo::never},     {8 * MiB, 1 * MiB, 4, load::DirectIo::never},
      {64 * MiB, 16 * MiB, 16, load::DirectIo::always}, {6 * MiB, 2 * MiB, 8, load::DirectIo::automatic},
      {16 * MiB, 4 * MiB, 16, load::DirectIo::never},
  };
  for (const Config& c : configs) {
    cuda::Loader loader(options(c.staging, c.slot, c.threads, c.direct));
    for (int round = 0; round < 4; ++round) {
      CUDA_OK(cudaMemset(dev.p, 0xA5, dev.bytes + 64));
      size_t skew = rng() % 61;
      Plan p = random_plan(f, rng, 1 + static_cast<int>(rng() % 25), dev.p, skew, dev.bytes);
      cuda::LoadStats st = loader.load(f.paths, p.ranges);
      std::vector<uint8_t> got = dev.read(skew, p.expected.size() + 3);
      ASSERT_TRUE(std::equal(p.expected.begin(), p.expected.end(), got.begin()))
          << "threads " << c.threads << " slot " << c.slot << " direct " << load::direct_io_name(c.direct) << " round "
          << round;
      for (size_t k = 0; k < 3; ++k) EXPECT_EQ(got[p.expected.size() + k], 0xA5) << "wrote past the last range";
      EXPECT_EQ(st.range_bytes, p.expected.size());
      EXPECT_EQ(st.staged_bytes, st.read_bytes);
    }
  }
}

TEST(Loader, ThousandsOfSmallTensorsBackToBack) {
  // 6,000 ranges of 1..3000 bytes laid out back to back in the file and at
  // the destination (one allocation, as a checkpoint's tensors in file
  // order), every 5th sent elsewhere: bit for bit, with one read per window.
  std::mt19937_64 rng(71);
  Files f;
  f.add(20 * MiB + 7, rng);  // the ranges take about 9 MB of it, at most 18
  DeviceBuffer dev(48 * MiB);
  CUDA_OK(cudaMemset(dev.p, 0xA5, dev.bytes));
  std::vector<load::FileRange> r;
  std::vector<uint8_t> expected(dev.bytes, 0xA5);
  uint64_t at = 13;
  const uintptr_t base = reinterpret_cast<uintptr_t>(dev.p);
  for (int i = 0; i < 6000; ++i) {
    uint64_t n = 1 + rng() % 3000;
    uint64_t to = i % 5 == 4 ? 24 * MiB + at : at;
    r.push_back({0, at, n, base + to});
    std::copy_n(f.data[0].begin() + static_cast<ptrdiff_t>(at), n, expected.begin() + static_cast<ptrdiff_t>(to));
    at += n;
  }
  cuda::Loader loader(options(16 * MiB, 1 * MiB, 8, load::DirectIo::never));
  cuda::LoadStats st = loader.load(f.paths, r);
  EXPECT_EQ(dev.read(0, dev.bytes), expected);
  EXPECT_EQ(st.range_bytes, at - 13);
  EXPECT_LE(st.reads, (at >> 20) + 2);  // one read per 1 MiB window
}

TEST(Loader, OrderedAfterTheCallersStream) {
  std::mt19937_64 rng(47);
  Files f;
  f.add(8 * MiB, rng);
  DeviceBuffer dev(8 * MiB);
  DeviceBuffer big(1024 * MiB);  // a long memset before the destination's memset
  ASSERT_NE(big.p, nullptr);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cuda::Loader loader(options(8 * MiB, 1 * MiB, 8, load::DirectIo::never));
  std::vector<load::FileRange> r{{0, 0, 8 * MiB, reinterpret_cast<uintptr_t>(dev.p)}};
  for (int i = 0; i < 3; ++i) {
    for (int k = 0; k < 8; ++k) CUDA_OK(cudaMemsetAsync(big.p, k, big.bytes, s));
    CUDA_OK(cudaMemsetAsync(dev.p, 0, dev.bytes, s));  // must land before the load's DMAs
    loader.load(f.paths, r, s);
    EXPECT_EQ(dev.read(0, 8 * MiB), f.data[0]) << "round " << i;
  }
  CUDA_OK(cudaStreamDestroy(s));
}

TEST(Loader, AStreamOfAnotherDeviceIsRefusedByName) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2)
    GTEST_SKIP() << "needs two CUDA devices (this machine has " << n << ")";
  std::mt19937_64 rng(59);
  Files f;
  f.add(MiB + 7, rng);
  DeviceBuffer dev(2 * MiB);
  cuda::Loader loader(options(4 * MiB, 1 * MiB, 2, load::DirectIo::never));
  cudaStream_t other = nullptr;
  CUDA_OK(cudaSetDevice(1));
  CUDA_OK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  CUDA_OK(cudaSetDevice(0));
  std::vector<load::FileRange> r{{0, 0, MiB + 7, reinterpret_cast<uintptr_t>(dev.p)}};
  const std::string msg = error_of([&] { loader.load(f.paths, r, other); });
  EXPECT_NE(msg.find("the stream is one of cuda:1; this loader serves cuda:0"), std::string::npos) << msg;
  EXPECT_EQ(dev.read(0, 2 * MiB), std::vector<uint8_t>(2 * MiB, 0xA5));  // nothing written
  loader.load(f.paths, r);  // and the loader still works
  EXPECT_EQ(dev.read(0, MiB + 7), f.data[0]);
  CUDA_OK(cudaStreamDestroy(other));
}

TEST(Loader, ErrorsBeforeAnyReadLeaveTheDestinationUntouched) {
  std::mt19937_64 rng(53);
  Files f;
  f.add(3 * MiB, rng);
  DeviceBuffer dev(4 * MiB);
  cuda::Loader loader(options(4 * MiB, 1 * MiB, 4, load::DirectIo::never));
  uintptr_t d = reinterpret_cast<uintptr_t>(dev.p);
  std::vector<load::FileRange> past{{0, 0, MiB, d}, {0, 2 * MiB, MiB + 1, d + MiB}};
  std::string msg = error_of([&] { loader.load(f.paths, past); });
  EXPECT_NE(msg.find(f.paths[0] + ": range 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("runs past the end of the file"), std::string::npos) << msg;
  std::vector<load::FileRange> overlap{{0, 0, MiB, d}, {0, MiB, MiB, d + MiB - 1}};
  msg = error_of([&] { loader.load(f.paths, overlap); });
  EXPECT_NE(msg.find("overlapping destination"), std::string::npos) << msg;
  std::vector<std::string> missing{f.paths[0] + ".missing"};
  msg = error_of([&] { loader.load(missing, std::vector<load::FileRange>{}); });
  EXPECT_NE(msg.find(missing[0]), std::string::npos) << msg;
  EXPECT_EQ(dev.read(0, 4 * MiB), std::vector<uint8_t>(4 * MiB, 0xA5));
}

TEST(Loader, ACudaErrorMidLoadFailsItAndTheLoaderWorksAfter) {
  std::mt19937_64 rng(59);
  Files f;
  f.add(40 * MiB + 11, rng);
  DeviceBuffer dev(40 * MiB + 11);
  // A destination no allocation holds (not null, so the plan accepts it):
  // cudaMemcpyAsync refuses it when the copy is enqueued.
  const uintptr_t nowhere = 0x1000;
  {
    cuda::Loader loader(options(8 * MiB, 2 * MiB, 8, load::DirectIo::never));
    uintptr_t d = reinterpret_cast<uintptr_t>(dev.p);
    std::vector<load::FileRange> bad{{0, 0, 20 * MiB, d},
                                     {0, 30 * MiB, 4 * MiB, nowhere},
                                     {0, 20 * MiB, 10 * MiB, d + 20 * MiB}};
    std::string msg = error_of([&] { loader.load(f.paths, bad); });
    EXPECT_NE(msg.find(f.paths[0] + ", bytes ["), std::string::npos) << msg;
    EXPECT_NE(msg.find("cudaMemcpyAsync"), std::string::npos) << msg;
    CUDA_OK(cudaDeviceSynchronize());  // the context is fine: the error was caught at enqueue
    // The same loader, the whole file: every worker is idle.
    CUDA_OK(cudaMemset(dev.p, 0xA5, dev.bytes));
    std::vector<load::FileRange> whole{{0, 0, f.data[0].size(), d}};
    loader.load(f.paths, whole);
    EXPECT_EQ(dev.read(0, f.data[0].size()), f.data[0]);
  }
}

TEST(Loader, TwoLoadersInTwoThreads) {
  std::mt19937_64 rng(61);
  Files f;
  f.add(24 * MiB + 1, rng);
  f.add(17 * MiB + 3, rng);
  DeviceBuffer a(24 * MiB + 1), b(17 * MiB + 3);
  auto run = [&](int file, DeviceBuffer& dst) {
    cuda::Loader loader(options(8 * MiB, 2 * MiB, 4, load::DirectIo::never));
    std::vector<load::FileRange> r{{static_cast<uint32_t>(file), 0, f.data[file].size(), reinterpret_cast<uintptr_t>(dst.p)}};
    for (int i = 0; i < 5; ++i) loader.load(f.paths, r);
  };
  std::thread t1(run, 0, std::ref(a)), t2(run, 1, std::ref(b));
  t1.join();
  t2.join();
  EXPECT_EQ(a.read(0, f.data[0].size()), f.data[0]);
  EXPECT_EQ(b.read(0, f.data[1].size()), f.data[1]);
}

TEST(Loader, CApiRoundTrip) {
  std::mt19937_64 rng(67);
  Files f;
  f.add(5 * 1000 * 1000 + 7, rng);
  DeviceBuffer dev(f.data[0].size());
  ferry_loader_options_t o;
  ASSERT_EQ(ferry_loader_options_init(&o), FERRY_SUCCESS);
  o.staging_bytes = 4 << 20;
  o.slot_bytes = 1 << 20;
  o.progress = 0;
  ferry_loader_t l = nullptr;
  ASSERT_EQ(ferry_loader_create(&o, 0, &l), FERRY_SUCCESS) << ferry_last_error();
  const size_t half = 2 * 1000 * 1000 + 3;  // the second half first, at odd offsets
  ferry_load_range_t ranges[] = {{0, half, f.data[0].size() - half, static_cast<char*>(dev.p) + half},
                                 {0, 0, half, dev.p}};
  const char* files[] = {f.paths[0].c_str()};
  ferry_load_stats_t st{};
  EXPECT_EQ(ferry_loader_load(l, files, 1, ranges, 2, nullptr, &st), FERRY_ERROR_INVALID_ARGUMENT);  // no struct_size
  st.struct_size = sizeof st;
  ASSERT_EQ(ferry_loader_load(l, files, 1, ranges, 2, nullptr, &st), FERRY_SUCCESS) << ferry_last_error();
  EXPECT_EQ(st.struct_size, sizeof st);
  EXPECT_EQ(st.bytes, f.data[0].size());
  EXPECT_EQ(st.staging_bytes, size_t{4} << 20);
  EXPECT_EQ(dev.read(0, f.data[0].size()), f.data[0]);
  ranges[0].file = 3;
  EXPECT_EQ(ferry_loader_load(l, files, 1, ranges, 2, nullptr, nullptr), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("ranges[0].file=3"), std::string::npos) << ferry_last_error();
  EXPECT_EQ(ferry_loader_destroy(l), FERRY_SUCCESS);
}

}  // namespace
}  // namespace ferry
