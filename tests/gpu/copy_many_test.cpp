// copy_many_test.cpp — many items in one call: random mixes of sizes (1 B ..
// 256 MiB) and host kinds (pageable, registered, pinned) at odd offsets, both
// directions, synchronous and async, poisoned destinations; the eager staged
// path at every size; an item that cannot be copied fails the whole call
// naming it, before any work, and the engine keeps working.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fault.h"
#include "cuda/copy/copy_engine.h"
#include "test_buffers.h"
#include "test_engine.h"

namespace ferry::cuda {
namespace {

using namespace ferry::cuda::testing;

enum class HostKind { pageable, registered, pinned };

// One region of host memory per kind, large enough for the items given to it.
struct HostArena {
  HostKind kind;
  size_t bytes;
  unsigned char* p = nullptr;
  HostBuffer* pageable = nullptr;
  HostArena(HostKind k, size_t n) : kind(k), bytes(n) {
    if (kind == HostKind::pinned) {
      EXPECT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&p), n, 0), cudaSuccess);
      return;
    }
    pageable = new HostBuffer(n);
    p = pageable->p;
    if (kind == HostKind::registered) {
      EXPECT_EQ(cudaHostRegister(p, n, cudaHostRegisterDefault), cudaSuccess);
    }
  }
  ~HostArena() {
    if (kind == HostKind::pinned) cudaFreeHost(p);
    if (kind == HostKind::registered) cudaHostUnregister(p);
    delete pageable;
  }
};

struct Mix {
  std::vector<size_t> sizes;
  std::vector<HostKind> kinds;
  std::vector<size_t> host_offset, device_offset;  // into the kind's arena / the device buffer
  size_t host_need[3] = {0, 0, 0}, device_need = 0;
};

// Sizes: mostly small (tensors of norms and biases), some MiB, a few large.
Mix random_mix(std::mt19937_64& rng, int items, size_t large_budget) {
  Mix m;
  for (int i = 0; i < items; ++i) {
    size_t n;
    const int r = static_cast<int>(rng() % 10);
    if (r < 6)
      n = 1 + rng() % (64 * KiB);
    else if (r < 9 || large_budget < 8 * MiB)
      n = 64 * KiB + rng() % (8 * MiB);
    else
      n = std::min<size_t>(large_budget, 8 * MiB + rng() % (248 * MiB)), large_budget -= n;
    const auto kind = static_cast<HostKind>(rng() % 3);
    const size_t hskew = rng() % 64, dskew = rng() % 64;
    m.sizes.push_back(n);
    m.kinds.push_back(kind);
    m.host_offset.push_back(m.host_need[static_cast<int>(kind)] + hskew);
    m.host_need[static_cast<int>(kind)] += hskew + n + 64;
    m.device_offset.push_back(m.device_need + dskew);
    m.device_need += dskew + n + 64;
  }
  return m;
}

// Up through copy_many (sync or async), back into poisoned copies of each
// arena; every item compared, every byte around the items untouched.
void round_trip_mix(const Mix& m, bool async, uint64_t seed) {
  std::vector<std::unique_ptr<HostArena>> src, dst;
  for (int k = 0; k < 3; ++k) {
    src.push_back(std::make_unique<HostArena>(static_cast<HostKind>(k), m.host_need[k] + 4096));
    dst.push_back(std::make_unique<HostArena>(static_cast<HostKind>(k), m.host_need[k] + 4096));
    fill_random(src[k]->p, src[k]->bytes, seed + k);
    std::memset(dst[k]->p, 0xEE, dst[k]->bytes);
  }
  DeviceBuffer dev(m.device_need + 4096);
  CUDA_OK(cudaMemset(dev.p, 0xCD, m.device_need + 4096));
  std::vector<CopyOp> up, down;
  for (size_t i = 0; i < m.sizes.size(); ++i) {
    const int k = static_cast<int>(m.kinds[i]);
    up.push_back({dev.p + m.device_offset[i], src[k]->p + m.host_offset[i], m.sizes[i]});
    down.push_back({dst[k]->p + m.host_offset[i], dev.p + m.device_offset[i], m.sizes[i]});
  }
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  if (async) {
    engine().copy_many_async(up, s).wait();
    engine().copy_many_async(down, s).wait();
  } else {
    engine().copy_many(up, s);
    engine().copy_many(down, s);
  }
  CUDA_OK(cudaStreamDestroy(s));
  for (size_t i = 0; i < m.sizes.size(); ++i) {
    const int k = static_cast<int>(m.kinds[i]);
    ASSERT_EQ(std::memcmp(dst[k]->p + m.host_offset[i], src[k]->p + m.host_offset[i], m.sizes[i]), 0)
        << "item " << i << " of " << m.sizes[i] << " bytes, host kind " << k << (async ? " (async)" : "");
  }
  // Bytes between the items were never written.
  for (int k = 0; k < 3; ++k) {
    std::vector<bool> covered(dst[k]->bytes, false);
    for (size_t i = 0; i < m.sizes.size(); ++i)
      if (static_cast<int>(m.kinds[i]) == k)
        std::fill(covered.begin() + m.host_offset[i], covered.begin() + m.host_offset[i] + m.sizes[i], true);
    for (size_t b = 0; b < dst[k]->bytes; b += 7)
      if (!covered[b]) {
        ASSERT_EQ(dst[k]->p[b], 0xEE) << "byte " << b << " of host kind " << k << " written";
      }
  }
}

TEST(CopyMany, RandomMixesOfSizesAndHostKindsBothDirections) {
  std::mt19937_64 rng(20261122);
  for (int round = 0; round < 12; ++round) {
    const int items = 1 + static_cast<int>(rng() % 60);
    Mix m = random_mix(rng, items, round % 3 == 0 ? 300 * MiB : 40 * MiB);
    SCOPED_TRACE("round " + std::to_string(round) + ", " + std::to_string(items) + " items");
    round_trip_mix(m, round % 2 == 1, 1000 + round);
    if (HasFatalFailure()) return;
  }
}

TEST(CopyMany, StateDictOfManySmallAndSomeLargeTensors) {
  Mix m;
  std::mt19937_64 rng(5);
  for (int i = 0; i < 300; ++i) {
    const size_t n = i % 10 == 9 ? 4 * MiB + rng() % 4096 : 8 * KiB + rng() % 8;
    m.sizes.push_back(n);
    m.kinds.push_back(HostKind::pageable);
    m.host_offset.push_back(m.host_need[0]);
    m.host_need[0] += n + 1;  // odd offsets
    m.device_offset.push_back(m.device_need);
    m.device_need += (n + 255) / 256 * 256;
  }
  round_trip_mix(m, false, 77);
  round_trip_mix(m, true, 78);
}

TEST(CopyMany, EagerStagedCopiesAtEverySizeAndOffset) {
  // Synchronous copies of pageable memory take the eager path: the chunk and
  // piece arithmetic at the edges (1 B, a piece, a chunk, an area and more).
  const size_t sizes[] = {1, 7, 4096, 16 * KiB + 1, 64 * KiB - 1, 2 * MiB, 2 * MiB + 1, 32 * MiB,
                          32 * MiB + 4097, 97 * MiB + 3};
  for (size_t n : sizes)
    for (size_t hoff : {size_t{0}, size_t{3}}) {
      HostBuffer a(n + hoff), b(n + hoff);
      DeviceBuffer d(n + 64);
      fill_random(a.p + hoff, n, n + hoff);
      std::memset(b.p, 0x3C, b.n);
      ASSERT_EQ(engine().plan(d.p + 5, a.p + hoff, n), Strategy::staged);
      engine().copy(d.p + 5, a.p + hoff, n);
      engine().copy(b.p + hoff, d.p + 5, n);
      ASSERT_EQ(std::memcmp(a.p + hoff, b.p + hoff, n), 0) << n << " bytes at +" << hoff;
      if (hoff) {
        ASSERT_EQ(b.p[hoff - 1], 0x3C);
      }
      ASSERT_EQ(b.p[hoff + n], 0x3C);
    }
}

TEST(CopyMany, AsyncHostToDeviceHasReadItsSourcesWhenItReturns) {
  // An eager async copy stages its sources before it returns: overwriting
  // them right after the call must not change what arrives.
  const size_t n = 24 * MiB + 13;
  HostBuffer a(n), back(n);
  DeviceBuffer d(n);
  fill_random(a.p, n, 4);
  std::vector<unsigned char> expect(a.p, a.p + n);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Completion c = engine().copy_async(d.p, a.p, n, s);
  std::memset(a.p, 0, n);  // the caller reuses its buffer at once
  c.wait();
  CUDA_OK(cudaMemcpy(back.p, d.p, n, cudaMemcpyDeviceToHost));
  EXPECT_EQ(std::memcmp(back.p, expect.data(), n), 0);
  CUDA_OK(cudaStreamDestroy(s));
}

TEST(CopyMany, AnItemThatCannotBeCopiedFailsTheCallNamingIt) {
  DeviceBuffer dev(64 * MiB);
  HostBuffer host(64 * MiB);
  fill_random(host.p, 64 * MiB, 9);
  void* gone = mmap(nullptr, 4 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(gone, MAP_FAILED);
  munmap(gone, 4 * MiB);
  std::vector<CopyOp> ops;
  for (int i = 0; i < 10; ++i) ops.push_back({dev.p + i * 6 * MiB, host.p + i * 6 * MiB, 5 * MiB + 1});
  ops[6].src = gone;
  CUDA_OK(cudaMemset(dev.p, 0xAB, 64 * MiB));
  for (bool async : {false, true}) {
    try {
      if (async)
        engine().copy_many_async(ops, nullptr).wait();
      else
        engine().copy_many(ops);
      FAIL() << "an unmapped source was copied";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("item 6 of 10"), std::string::npos) << e.what();
    }
  }
  // Refused before any work: the device memory is untouched.
  std::vector<unsigned char> probe(64);
  CUDA_OK(cudaMemcpy(probe.data(), dev.p, 64, cudaMemcpyDeviceToHost));
  for (unsigned char b : probe) ASSERT_EQ(b, 0xAB);
  EXPECT_FALSE(registered(host.p));
  // The engine works on.
  ops[6].src = host.p + 36 * MiB;
  engine().copy_many(ops);
  CUDA_OK(cudaMemcpy(probe.data(), dev.p + 36 * MiB, 64, cudaMemcpyDeviceToHost));
  EXPECT_EQ(std::memcmp(probe.data(), host.p + 36 * MiB, 64), 0);
}

TEST(CopyMany, AFaultMidRunFailsTheCallAndTheEngineWorksOn) {
  const size_t n = 20 * MiB + 3;
  HostBuffer a(n), b(n);
  DeviceBuffer d(n);
  fill_random(a.p, n, 12);
  set_fault_injection("touch:3");  // the fourth staged piece fails
  EXPECT_THROW(engine().copy(d.p, a.p, n, nullptr, Strategy::staged), OsError);
  set_fault_injection("");
  engine().copy(d.p, a.p, n);
  engine().copy(b.p, d.p, n);
  EXPECT_EQ(std::memcmp(a.p, b.p, n), 0);
}

TEST(CopyMany, DeviceMemoryOfAnotherDeviceIsRefused) {
  int count = 0;
  CUDA_OK(cudaGetDeviceCount(&count));
  if (count < 2) GTEST_SKIP() << "needs two CUDA devices";
  CUDA_OK(cudaSetDevice(1));
  unsigned char* other = nullptr;
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&other), MiB));
  CUDA_OK(cudaSetDevice(0));
  std::vector<unsigned char> host(MiB);
  std::vector<CopyOp> ops = {{other, host.data(), MiB}};
  try {
    engine().copy_many(ops);
    FAIL() << "copied into another device's memory";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("device 1"), std::string::npos) << e.what();
  }
  cudaFree(other);
}

TEST(CopyMany, NoCallLeavesTheCallersDeviceChanged) {
  int count = 0;
  CUDA_OK(cudaGetDeviceCount(&count));
  const int mine = count - 1;  // the last device; the engine is device 0's
  CUDA_OK(cudaSetDevice(0));
  DeviceBuffer d(4 * MiB);
  HostBuffer h(4 * MiB);
  CUDA_OK(cudaSetDevice(mine));
  engine().copy(d.p, h.p, 4 * MiB);
  engine().copy_async(h.p, d.p, 4 * MiB, nullptr).wait();
  std::vector<CopyOp> ops = {{d.p, h.p, MiB}, {h.p + MiB, d.p + 2 * MiB, MiB}};
  engine().copy_many(ops);
  int now = -1;
  CUDA_OK(cudaGetDevice(&now));
  EXPECT_EQ(now, mine);
  CUDA_OK(cudaSetDevice(0));
}

}  // namespace
}  // namespace ferry::cuda
