// capi_copy_test.cpp — the copy engine and registration through the C API
// (ferry.h) on a real device: ferry_copy and ferry_copy_async with every
// strategy, ferry_copy_many(_async) and ferry_copy_batch_async over pageable,
// registered (ferry_register) and pinned (ferry_pinned_pool_create) host
// memory; random data, poisoned destinations on both sides, odd sizes and
// misaligned offsets, both directions; stream order, events, query and
// release; argument errors that change nothing and leave the engine working.
// (The C++ engine itself: copy_engine_test.cpp, copy_many_test.cpp; the C API
// without a device: tests/capi/copy_test.cpp.)
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ferry/ferry.h"
#include "test_buffers.h"

// The old name stays in the ABI (GDRCopy's rule); these tests call it on purpose.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace {

using namespace ferry::cuda::testing;

std::string last() { return ferry_last_error(); }

#define FERRY_OK(x) ASSERT_EQ((x), FERRY_SUCCESS) << #x << ": " << last()

constexpr unsigned char kHostPoison = 0xEE, kDevicePoison = 0xCD;
constexpr size_t kGuard = 64;  // poisoned bytes checked past every destination

// One engine and one pinned pool for the suite (creation and destroy have
// their own test).
class CApiCopyGpu : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_EQ(ferry_engine_create(0, &engine_), FERRY_SUCCESS) << last();
    ferry_pool_options_t o;
    ASSERT_EQ(ferry_pool_options_init(&o), FERRY_SUCCESS) << last();
    o.chunk_bytes = size_t{32} << 20;
    ASSERT_EQ(ferry_pinned_pool_create(&o, 0, &pinned_), FERRY_SUCCESS) << last();
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(ferry_pool_destroy(pinned_), FERRY_SUCCESS) << last();
    EXPECT_EQ(ferry_engine_destroy(engine_), FERRY_SUCCESS) << last();
    pinned_ = nullptr;
    engine_ = nullptr;
  }
  static ferry_engine_t engine_;
  static ferry_pool_t pinned_;
};
ferry_engine_t CApiCopyGpu::engine_ = nullptr;
ferry_pool_t CApiCopyGpu::pinned_ = nullptr;

// A copy handle released at the end of the scope unless the test released it
// (a failed assertion must not leave a copy running into freed buffers).
struct CopyHandle {
  ferry_copy_t c = nullptr;
  ~CopyHandle() {
    if (c) ferry_copy_destroy(c);
  }
  // Releases now (the assertion is the caller's).
  ferry_status_t release() {
    const ferry_status_t s = ferry_copy_destroy(c);
    c = nullptr;
    return s;
  }
};

enum class Host { pageable, registered, pinned };
const char* name(Host h) { return h == Host::pageable ? "pageable" : h == Host::registered ? "registered" : "pinned"; }

// `bytes` of host memory of one kind: mmap'd pageable memory, the same pinned
// through ferry_register, or an allocation of a ferry pinned pool.
struct HostMem {
  Host kind;
  unsigned char* p = nullptr;
  std::unique_ptr<HostBuffer> pageable;
  ferry_registration_t registration = nullptr;
  ferry_pool_t pool = nullptr;
  HostMem(Host k, size_t bytes, ferry_pool_t pinned_pool) : kind(k) {
    if (kind == Host::pinned) {
      pool = pinned_pool;
      void* out = nullptr;
      EXPECT_EQ(ferry_pool_alloc(pool, bytes, 0, FERRY_HUGE_AUTO, &out), FERRY_SUCCESS) << last();
      p = static_cast<unsigned char*>(out);
      return;
    }
    pageable = std::make_unique<HostBuffer>(bytes);
    p = pageable->p;
    if (kind == Host::registered) {
      EXPECT_EQ(ferry_registration_create(p, bytes, 0, &registration), FERRY_SUCCESS) << last();
      EXPECT_TRUE(registered(p) && registered(p + bytes - 1)) << "ferry_register did not pin the range";
    }
  }
  ~HostMem() {
    if (pool) {
      EXPECT_EQ(ferry_pool_free(pool, p), FERRY_SUCCESS) << last();
    }
    if (registration) {
      EXPECT_EQ(ferry_registration_destroy(registration), FERRY_SUCCESS) << last();
    }
  }
};

// Asserts that the device buffer holds `want` at `off` and kDevicePoison in
// the `off` bytes before and the kGuard bytes after.
void expect_device_holds(const unsigned char* dev, size_t off, const unsigned char* want, size_t n) {
  std::vector<unsigned char> back(off + n + kGuard);
  CUDA_OK(cudaMemcpy(back.data(), dev, back.size(), cudaMemcpyDeviceToHost));
  ASSERT_EQ(std::memcmp(back.data() + off, want, n), 0) << "host->device: wrong bytes on the device";
  for (size_t i = 0; i < off; ++i) ASSERT_EQ(back[i], kDevicePoison) << "wrote " << off - i << " bytes before";
  for (size_t i = off + n; i < back.size(); ++i) ASSERT_EQ(back[i], kDevicePoison) << "wrote past the end";
}

// Asserts that device memory holds exactly `want`.
void expect_device_equals(const unsigned char* dev, const unsigned char* want, size_t n) {
  std::vector<unsigned char> back(n);
  CUDA_OK(cudaMemcpy(back.data(), dev, n, cudaMemcpyDeviceToHost));
  ASSERT_EQ(std::memcmp(back.data(), want, n), 0) << "wrong bytes on the device";
}

// Asserts that host `dst` holds `want` at `off`, kHostPoison around it.
void expect_host_holds(const unsigned char* dst, size_t off, const unsigned char* want, size_t n) {
  ASSERT_EQ(std::memcmp(dst + off, want, n), 0) << "device->host: wrong bytes on the host";
  for (size_t i = 0; i < off; ++i) ASSERT_EQ(dst[i], kHostPoison) << "wrote " << off - i << " bytes before";
  for (size_t i = off + n; i < off + n + kGuard; ++i) ASSERT_EQ(dst[i], kHostPoison) << "wrote past the end";
}

// A copy function of the C API under test: copies n bytes, returns when done.
using CopyFn = std::function<void(void* dst, const void* src, size_t n)>;

// n random bytes from host (+hoff) to a poisoned device buffer (+doff), then
// back into poisoned host memory of the same kind (+hoff), each leg checked.
void round_trip(Host kind, ferry_pool_t pinned, size_t n, size_t hoff, size_t doff, uint64_t seed,
                const CopyFn& copy) {
  SCOPED_TRACE(std::string(name(kind)) + ", " + std::to_string(n) + " bytes, host +" + std::to_string(hoff) +
               ", device +" + std::to_string(doff));
  const size_t host_bytes = hoff + n + kGuard;
  HostMem src(kind, host_bytes, pinned), dst(kind, host_bytes, pinned);
  DeviceBuffer dev(doff + n + kGuard);
  fill_random(src.p, host_bytes, seed);
  std::memset(dst.p, kHostPoison, host_bytes);
  CUDA_OK(cudaMemset(dev.p, kDevicePoison, doff + n + kGuard));
  copy(dev.p + doff, src.p + hoff, n);
  if (::testing::Test::HasFatalFailure()) return;
  expect_device_holds(dev.p, doff, src.p + hoff, n);
  if (::testing::Test::HasFatalFailure()) return;
  copy(dst.p + hoff, dev.p + doff, n);
  if (::testing::Test::HasFatalFailure()) return;
  expect_host_holds(dst.p, hoff, src.p + hoff, n);
}

const size_t kSizes[] = {1, 3, 4095, 4097, MiB + 7, 9 * MiB + 3, 70 * MiB + 5};  // 70 MiB: past the eager bound
const std::pair<size_t, size_t> kOffsets[] = {{0, 0}, {1, 17}, {63, 1}, {4096 + 5, 256}};

TEST_F(CApiCopyGpu, SyncCopyEveryHostKindSizeAndOffset) {
  uint64_t seed = 1;
  const CopyFn copy = [](void* dst, const void* src, size_t n) {
    ASSERT_EQ(ferry_copy(engine_, dst, src, n), FERRY_SUCCESS) << last();
  };
  for (Host kind : {Host::pageable, Host::registered, Host::pinned})
    for (size_t n : kSizes)
      for (auto [hoff, doff] : kOffsets) {
        round_trip(kind, pinned_, n, hoff, doff, seed++, copy);
        if (HasFatalFailure()) return;
      }
}

// The strategy a copy reports for the one asked for (ferry_strategy_t rules:
// pinned memory goes straight to the DMA engine unless the SM kernel is asked
// for; for pageable memory "direct" means the CUDA path and "sm" staging).
ferry_strategy_t expected_strategy(Host kind, ferry_strategy_t asked) {
  if (kind != Host::pageable) return asked == FERRY_STRATEGY_SM ? FERRY_STRATEGY_SM : FERRY_STRATEGY_DIRECT;
  if (asked == FERRY_STRATEGY_DIRECT) return FERRY_STRATEGY_CUDA;
  if (asked == FERRY_STRATEGY_SM) return FERRY_STRATEGY_STAGED;
  return asked;  // AUTO: checked apart
}

// ferry_copy_v2: the synchronous call in the async call's order, every
// strategy on a stream (and the legacy stream), every host kind.
TEST_F(CApiCopyGpu, SyncCopyV2EveryStrategyOnAStream) {
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  uint64_t seed = 500;
  for (Host kind : {Host::pageable, Host::registered, Host::pinned})
    for (ferry_strategy_t asked : {FERRY_STRATEGY_AUTO, FERRY_STRATEGY_DIRECT, FERRY_STRATEGY_STAGED,
                                   FERRY_STRATEGY_PIN_IN_PLACE, FERRY_STRATEGY_HYBRID, FERRY_STRATEGY_CUDA,
                                   FERRY_STRATEGY_SM})
      for (void* on : {static_cast<void*>(stream), static_cast<void*>(nullptr)}) {
        const CopyFn copy = [&](void* dst, const void* src, size_t n) {
          ASSERT_EQ(ferry_copy_v2(engine_, dst, src, n, on, asked), FERRY_SUCCESS)
              << "strategy " << asked << ": " << last();
        };
        for (size_t n : {size_t{1}, size_t{4097}, 9 * MiB + 3}) {
          round_trip(kind, pinned_, n, 17, 5, seed++, copy);
          if (HasFatalFailure()) return;
        }
      }
  EXPECT_EQ(ferry_copy_v2(engine_, nullptr, nullptr, 1, stream, FERRY_STRATEGY_AUTO), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("dst must not be NULL"), std::string::npos) << last();
  CUDA_OK(cudaStreamDestroy(stream));
}

TEST_F(CApiCopyGpu, AsyncCopyEveryStrategyOnAStream) {
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const ferry_strategy_t strategies[] = {FERRY_STRATEGY_AUTO,         FERRY_STRATEGY_DIRECT, FERRY_STRATEGY_STAGED,
                                         FERRY_STRATEGY_PIN_IN_PLACE, FERRY_STRATEGY_HYBRID, FERRY_STRATEGY_CUDA,
                                         FERRY_STRATEGY_SM};
  uint64_t seed = 1000;
  for (Host kind : {Host::pageable, Host::pinned})
    for (ferry_strategy_t asked : strategies) {
      const CopyFn copy = [&](void* dst, const void* src, size_t n) {
        CopyHandle h;
        ASSERT_EQ(ferry_copy_async(engine_, dst, src, n, stream, asked, &h.c), FERRY_SUCCESS)
            << "strategy " << asked << ": " << last();
        ASSERT_NE(h.c, nullptr);
        ferry_copy_t c = h.c;
        ferry_strategy_t used = FERRY_STRATEGY_AUTO;
        FERRY_OK(ferry_copy_get_strategy(c, &used));
        if (asked == FERRY_STRATEGY_AUTO && kind == Host::pageable)
          EXPECT_TRUE(used == FERRY_STRATEGY_STAGED || used == FERRY_STRATEGY_PIN_IN_PLACE ||
                      used == FERRY_STRATEGY_HYBRID || used == FERRY_STRATEGY_CUDA)
              << "auto chose " << used;
        else
          EXPECT_EQ(used, expected_strategy(kind, asked)) << "asked " << asked;
        void* event = nullptr;
        FERRY_OK(ferry_copy_get_event(c, &event));
        ASSERT_NE(event, nullptr);
        FERRY_OK(ferry_copy_wait(c));
        int done = 0;
        FERRY_OK(ferry_copy_query(c, &done));
        EXPECT_EQ(done, 1) << "query after wait";
        EXPECT_EQ(cudaEventQuery(static_cast<cudaEvent_t>(event)), cudaSuccess) << "the copy's event after wait";
        FERRY_OK(h.release());
      };
      for (size_t n : {size_t{3}, size_t{4097}, 9 * MiB + 3, 70 * MiB + 5}) {
        round_trip(kind, pinned_, n, 63, 1, seed++, copy);
        if (HasFatalFailure()) return;
      }
    }
  CUDA_OK(cudaStreamDestroy(stream));
}

TEST_F(CApiCopyGpu, TheCallersStreamIsOrderedAroundAnAsyncCopy) {
  // Up: work queued on the stream after ferry_copy_async sees the copied bytes
  // without any ferry wait. Down: the copy sees work queued before it.
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  uint64_t seed = 2000;
  for (ferry_strategy_t asked : {FERRY_STRATEGY_AUTO, FERRY_STRATEGY_STAGED, FERRY_STRATEGY_PIN_IN_PLACE,
                                 FERRY_STRATEGY_HYBRID, FERRY_STRATEGY_CUDA})
    for (size_t n : {size_t{4097}, 9 * MiB + 3, 70 * MiB + 5}) {
      SCOPED_TRACE("strategy " + std::to_string(asked) + ", " + std::to_string(n) + " bytes");
      HostBuffer src(n), dst(n + kGuard);
      DeviceBuffer dev(n);
      unsigned char* pinned_back = nullptr;
      CUDA_OK(cudaHostAlloc(reinterpret_cast<void**>(&pinned_back), n, cudaHostAllocDefault));
      fill_random(src.p, n, seed++);
      CopyHandle up, down;
      ASSERT_EQ(ferry_copy_async(engine_, dev.p, src.p, n, stream, asked, &up.c), FERRY_SUCCESS) << last();
      CUDA_OK(cudaMemcpyAsync(pinned_back, dev.p, n, cudaMemcpyDeviceToHost, stream));
      CUDA_OK(cudaStreamSynchronize(stream));
      EXPECT_EQ(std::memcmp(pinned_back, src.p, n), 0) << "the stream did not wait for the copy";
      FERRY_OK(up.release());
      // Down: new bytes reach the device through the stream just before the copy.
      fill_random(pinned_back, n, seed++);
      std::memset(dst.p, kHostPoison, n + kGuard);
      CUDA_OK(cudaMemcpyAsync(dev.p, pinned_back, n, cudaMemcpyHostToDevice, stream));
      ASSERT_EQ(ferry_copy_async(engine_, dst.p, dev.p, n, stream, asked, &down.c), FERRY_SUCCESS) << last();
      FERRY_OK(ferry_copy_wait(down.c));
      FERRY_OK(down.release());
      expect_host_holds(dst.p, 0, pinned_back, n);
      CUDA_OK(cudaFreeHost(pinned_back));
      if (HasFatalFailure()) return;
    }
  CUDA_OK(cudaStreamDestroy(stream));
}

TEST_F(CApiCopyGpu, SyncCopyIsOrderedAfterTheLegacyStream) {
  const size_t n = 64 * MiB + 9;
  DeviceBuffer dev(n);
  HostBuffer dst(n);
  std::mt19937_64 rng(3000);
  for (int round = 0; round < 4; ++round) {
    const int value = static_cast<int>(rng() % 255);
    std::memset(dst.p, value ^ 0xff, n);
    CUDA_OK(cudaMemsetAsync(dev.p, value, n, nullptr));  // legacy stream, not waited for
    FERRY_OK(ferry_copy(engine_, dst.p, dev.p, n));
    for (size_t i = 0; i < n; i += 4093) ASSERT_EQ(dst.p[i], value) << "byte " << i;
    ASSERT_EQ(dst.p[n - 1], value);
  }
}

TEST_F(CApiCopyGpu, DeviceToDeviceAtOddOffsets) {
  const size_t n = 5 * MiB + 13;
  DeviceBuffer a(n + 7), b(n + 3 + kGuard);
  std::vector<unsigned char> want(n);
  fill_random(want.data(), n, 4000);
  CUDA_OK(cudaMemcpy(a.p + 7, want.data(), n, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(b.p, kDevicePoison, n + 3 + kGuard));
  FERRY_OK(ferry_copy(engine_, b.p + 3, a.p + 7, n));
  expect_device_holds(b.p, 3, want.data(), n);
}

// Items of random sizes (1 B .. 3 MiB) and host kinds at random offsets, up
// then back into poisoned memory; `run` copies one list of items.
using ManyFn = std::function<void(std::vector<void*>& dsts, std::vector<const void*>& srcs,
                                  std::vector<size_t>& sizes)>;

void many_round_trip(ferry_pool_t pinned, uint64_t seed, int items, const ManyFn& run) {
  std::mt19937_64 rng(seed);
  struct Item {
    Host kind;
    size_t n, hoff, doff;
  };
  std::vector<Item> list;
  size_t host_need[3] = {0, 0, 0}, device_need = 0;
  for (int i = 0; i < items; ++i) {
    Item it;
    it.kind = static_cast<Host>(rng() % 3);
    it.n = rng() % 4 == 0 ? 1 + rng() % (3 * MiB) : 1 + rng() % (64 * KiB);
    size_t& h = host_need[static_cast<int>(it.kind)];
    it.hoff = h + rng() % 64;
    h = it.hoff + it.n + kGuard;
    it.doff = device_need + rng() % 64;
    device_need = it.doff + it.n + kGuard;
    list.push_back(it);
  }
  std::vector<std::unique_ptr<HostMem>> src, dst;
  for (int k = 0; k < 3; ++k) {
    src.push_back(std::make_unique<HostMem>(static_cast<Host>(k), host_need[k] + kGuard, pinned));
    dst.push_back(std::make_unique<HostMem>(static_cast<Host>(k), host_need[k] + kGuard, pinned));
    fill_random(src[k]->p, host_need[k] + kGuard, seed * 3 + k);
    std::memset(dst[k]->p, kHostPoison, host_need[k] + kGuard);
  }
  DeviceBuffer dev(device_need);
  CUDA_OK(cudaMemset(dev.p, kDevicePoison, device_need));
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<size_t> sizes;
  for (const Item& it : list) {
    dsts.push_back(dev.p + it.doff);
    srcs.push_back(src[static_cast<int>(it.kind)]->p + it.hoff);
    sizes.push_back(it.n);
  }
  run(dsts, srcs, sizes);
  if (::testing::Test::HasFatalFailure()) return;
  std::vector<unsigned char> back(device_need);
  CUDA_OK(cudaMemcpy(back.data(), dev.p, device_need, cudaMemcpyDeviceToHost));
  size_t end = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    const Item& it = list[i];
    for (size_t b = end; b < it.doff; ++b) ASSERT_EQ(back[b], kDevicePoison) << "item " << i << ": wrote before it";
    ASSERT_EQ(std::memcmp(back.data() + it.doff, srcs[i], it.n), 0) << "item " << i << " up (" << name(it.kind) << ")";
    end = it.doff + it.n;
  }
  for (size_t b = end; b < device_need; ++b) ASSERT_EQ(back[b], kDevicePoison) << "wrote past the last item";
  dsts.clear();
  srcs.clear();
  for (const Item& it : list) {
    dsts.push_back(dst[static_cast<int>(it.kind)]->p + it.hoff);
    srcs.push_back(dev.p + it.doff);
  }
  run(dsts, srcs, sizes);
  if (::testing::Test::HasFatalFailure()) return;
  for (size_t i = 0; i < list.size(); ++i) {
    const Item& it = list[i];
    const unsigned char* want = src[static_cast<int>(it.kind)]->p + it.hoff;
    ASSERT_EQ(std::memcmp(dsts[i], want, it.n), 0) << "item " << i << " down (" << name(it.kind) << ")";
    ASSERT_EQ(static_cast<unsigned char*>(dsts[i])[it.n], kHostPoison) << "item " << i << ": wrote past it";
  }
}

TEST_F(CApiCopyGpu, CopyManyFamilyMixedItems) {
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto async_with = [&](ferry_strategy_t strategy) -> ManyFn {
    return [&, strategy](auto& dsts, auto& srcs, auto& sizes) {
      CopyHandle h;
      ASSERT_EQ(ferry_copy_many_async(engine_, dsts.data(), srcs.data(), sizes.data(), sizes.size(), stream,
                                      strategy, &h.c),
                FERRY_SUCCESS)
          << last();
      FERRY_OK(ferry_copy_wait(h.c));
      int done = 0;
      FERRY_OK(ferry_copy_query(h.c, &done));
      EXPECT_EQ(done, 1);
      FERRY_OK(h.release());
    };
  };
  const std::pair<const char*, ManyFn> calls[] = {
      {"ferry_copy_many, legacy stream",
       [&](auto& dsts, auto& srcs, auto& sizes) {
         ASSERT_EQ(ferry_copy_many(engine_, dsts.data(), srcs.data(), sizes.data(), sizes.size(), nullptr),
                   FERRY_SUCCESS)
             << last();
       }},
      {"ferry_copy_many, a stream",
       [&](auto& dsts, auto& srcs, auto& sizes) {
         ASSERT_EQ(ferry_copy_many(engine_, dsts.data(), srcs.data(), sizes.data(), sizes.size(), stream),
                   FERRY_SUCCESS)
             << last();
       }},
      {"ferry_copy_many_v2, staged, a stream",
       [&](auto& dsts, auto& srcs, auto& sizes) {
         ASSERT_EQ(ferry_copy_many_v2(engine_, dsts.data(), srcs.data(), sizes.data(), sizes.size(), stream,
                                      FERRY_STRATEGY_STAGED),
                   FERRY_SUCCESS)
             << last();
       }},
      {"ferry_copy_many_v2, auto, legacy stream",
       [&](auto& dsts, auto& srcs, auto& sizes) {
         ASSERT_EQ(ferry_copy_many_v2(engine_, dsts.data(), srcs.data(), sizes.data(), sizes.size(), nullptr,
                                      FERRY_STRATEGY_AUTO),
                   FERRY_SUCCESS)
             << last();
       }},
      {"ferry_copy_many_async, auto", async_with(FERRY_STRATEGY_AUTO)},
      {"ferry_copy_many_async, staged", async_with(FERRY_STRATEGY_STAGED)},
      {"ferry_copy_many_async, sm", async_with(FERRY_STRATEGY_SM)},
      {"ferry_copy_batch_async (the earlier name)",
       [&](auto& dsts, auto& srcs, auto& sizes) {
         CopyHandle h;
         ASSERT_EQ(
             ferry_copy_batch_async(engine_, dsts.data(), srcs.data(), sizes.data(), sizes.size(), stream, &h.c),
             FERRY_SUCCESS)
             << last();
         FERRY_OK(ferry_copy_wait(h.c));
         FERRY_OK(h.release());
       }},
  };
  uint64_t seed = 5000;
  for (const auto& [what, run] : calls)
    for (int items : {1, 7, 40}) {
      SCOPED_TRACE(std::string(what) + ", " + std::to_string(items) + " items");
      many_round_trip(pinned_, seed++, items, run);
      if (HasFatalFailure()) return;
    }
  CUDA_OK(cudaStreamDestroy(stream));
}

TEST_F(CApiCopyGpu, BadArgumentsAreRefusedAndChangeNothing) {
  const size_t n = 2 * MiB;  // whole pages of the allocation granularity: the allocation ends at dev.p + n
  HostBuffer host(n);
  DeviceBuffer dev(n), other(n);
  fill_random(host.p, n, 6000);
  CUDA_OK(cudaMemset(dev.p, kDevicePoison, n));
  auto refused = [&](ferry_status_t s, const char* text) {
    EXPECT_EQ(s, FERRY_ERROR_INVALID_ARGUMENT) << text << ": " << last();
    EXPECT_NE(last().find(text), std::string::npos) << last();
  };
  CopyHandle c;  // stays empty: every call below is refused
  refused(ferry_copy(engine_, dev.p, host.p, 0), "copy of 0 bytes");
  refused(ferry_copy(engine_, nullptr, host.p, n), "dst must not be NULL");
  refused(ferry_copy(engine_, host.p + n, host.p, n), "is device memory");  // host to host
  refused(ferry_copy(engine_, dev.p + 1, dev.p, n - 1), "overlap");
  refused(ferry_copy(engine_, dev.p + 1, host.p, n), "the device allocation holds");
  refused(ferry_copy_async(engine_, dev.p, host.p, n, nullptr, static_cast<ferry_strategy_t>(42), &c.c), "strategy=42");
  EXPECT_EQ(c.c, nullptr);
  refused(ferry_copy_async(engine_, dev.p, host.p, n, nullptr, FERRY_STRATEGY_AUTO, nullptr), "out must not be NULL");
  // copy_many checks every item before any work: item 0 is good and must not have been copied.
  void* dsts[4] = {dev.p, other.p, nullptr, other.p + 4096};
  const void* srcs[4] = {host.p, host.p + 4096, host.p, host.p};
  size_t sizes[4] = {4096, 4096, 4096, 4096};
  refused(ferry_copy_many(engine_, dsts, srcs, sizes, 4, nullptr), "item 2 of 4");
  refused(ferry_copy_many_async(engine_, dsts, srcs, sizes, 4, nullptr, FERRY_STRATEGY_AUTO, &c.c), "item 2 of 4");
  refused(ferry_copy_batch_async(engine_, dsts, srcs, sizes, 4, nullptr, &c.c), "item 2 of 4");
  refused(ferry_copy_many(engine_, dsts, srcs, sizes, 0, nullptr), "no items");
  refused(ferry_copy_many(engine_, nullptr, srcs, sizes, 1, nullptr), "dsts must not be NULL");
  std::vector<unsigned char> back(4096);
  CUDA_OK(cudaMemcpy(back.data(), dev.p, 4096, cudaMemcpyDeviceToHost));
  for (unsigned char b : back) ASSERT_EQ(b, kDevicePoison) << "a refused call copied item 0";
  // The engine still works.
  FERRY_OK(ferry_copy(engine_, dev.p, host.p, n));
  expect_device_equals(dev.p, host.p, n);
}

TEST_F(CApiCopyGpu, RegistrationPinsUntilUnregistered) {
  const size_t n = 6 * MiB + 333;
  HostBuffer thp(n + 4096, HostBuffer::thp), small(n + 4096);
  for (HostBuffer* b : {&thp, &small}) {
    unsigned char* p = b->p + 4096 + 7;  // odd start: widened to whole pages by ferry_register
    fill_random(p, n, 7000);
    ferry_registration_t r = nullptr;
    FERRY_OK(ferry_registration_create(p, n, 0, &r));
    ASSERT_NE(r, nullptr);
    EXPECT_TRUE(registered(p) && registered(p + n - 1));
    // Copies from and to it go straight to the DMA engine.
    DeviceBuffer dev(n);
    CopyHandle h;
    FERRY_OK(ferry_copy_async(engine_, dev.p, p, n, nullptr, FERRY_STRATEGY_AUTO, &h.c));
    ferry_copy_t c = h.c;
    ferry_strategy_t used = FERRY_STRATEGY_AUTO;
    FERRY_OK(ferry_copy_get_strategy(c, &used));
    EXPECT_EQ(used, FERRY_STRATEGY_DIRECT);
    FERRY_OK(ferry_copy_wait(c));
    FERRY_OK(h.release());
    EXPECT_EQ(ferry_copy_destroy(c), FERRY_ERROR_INVALID_ARGUMENT);  // released twice
    EXPECT_NE(last().find("was destroyed"), std::string::npos) << last();
    expect_device_equals(dev.p, p, n);
    FERRY_OK(ferry_registration_destroy(r));
    EXPECT_FALSE(registered(p) || registered(p + n - 1)) << "still registered after ferry_unregister";
    EXPECT_EQ(ferry_registration_destroy(r), FERRY_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(last().find("was destroyed"), std::string::npos) << last();
  }
  ferry_registration_t r = nullptr;
  EXPECT_EQ(ferry_registration_create(small.p, 4096, 999, &r), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("device 999 does not exist"), std::string::npos) << last();
  EXPECT_EQ(r, nullptr);
  EXPECT_FALSE(registered(small.p));
}

TEST(CApiEngine, CreateDestroyAndUseAfterDestroy) {
  int before = -1, after = -1;
  CUDA_OK(cudaGetDevice(&before));
  ferry_engine_t e = nullptr;
  ASSERT_EQ(ferry_engine_create(0, &e), FERRY_SUCCESS) << last();
  ASSERT_NE(e, nullptr);
  CUDA_OK(cudaGetDevice(&after));
  EXPECT_EQ(after, before) << "ferry_engine_create changed the current device";
  const size_t n = 3 * MiB + 5;
  HostBuffer host(n), back(n);
  DeviceBuffer dev(n);
  fill_random(host.p, n, 8000);
  std::memset(back.p, kHostPoison, n);
  FERRY_OK(ferry_copy(e, dev.p, host.p, n));
  FERRY_OK(ferry_copy(e, back.p, dev.p, n));
  EXPECT_EQ(std::memcmp(back.p, host.p, n), 0);
  FERRY_OK(ferry_engine_destroy(e));
  EXPECT_EQ(ferry_copy(e, dev.p, host.p, n), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("was destroyed"), std::string::npos) << last();
  EXPECT_EQ(ferry_engine_destroy(e), FERRY_ERROR_INVALID_ARGUMENT);
  // A device that does not exist: refused, nothing created.
  ferry_engine_t bad = reinterpret_cast<ferry_engine_t>(uintptr_t{1});
  EXPECT_NE(ferry_engine_create(999, &bad), FERRY_SUCCESS);
  EXPECT_EQ(bad, nullptr);
  EXPECT_FALSE(last().empty());
  EXPECT_NE(ferry_engine_create(-1, &bad), FERRY_SUCCESS);
  EXPECT_EQ(bad, nullptr);
}

}  // namespace
