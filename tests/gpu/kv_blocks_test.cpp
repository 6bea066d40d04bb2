// kv_blocks_test.cpp — copy_many on KV-cache blocks (issue 41): random block
// sizes (odd ones too), counts (1 .. 60,000) and places (shuffled on both
// sides, odd offsets, or adjacent runs that the engine merges) from a seed
// printed by the test (FERRYTEST_SEED repeats a run), through every path
// (auto, the copy engines, the SM kernel), with and without a stream; every
// block compared, every byte between blocks still poisoned on both sides.
// Also: adjacent blocks across two adjacent registrations (a merge must stop
// there), both directions at once from two threads with no stream, and a
// no-stream call ordered after work on the legacy default stream.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "cuda/copy/block_plan.h"
#include "cuda/copy/copy_engine.h"
#include "test_buffers.h"
#include "test_engine.h"

namespace ferry::cuda {
namespace {

using namespace ferry::cuda::testing;

uint64_t test_seed() {
  static const uint64_t seed = [] {
    const char* s = std::getenv("FERRYTEST_SEED");
    const uint64_t v = s ? std::strtoull(s, nullptr, 10) : std::random_device{}();
    std::printf("kv_blocks_test seed %llu (FERRYTEST_SEED=%llu repeats it)\n", static_cast<unsigned long long>(v),
                static_cast<unsigned long long>(v));
    return v;
  }();
  return seed;
}

constexpr unsigned char kHostPoison = 0xEE, kDevicePoison = 0xCD;

// Blocks of one round: where each lies on the host and the device side.
struct Layout {
  std::vector<size_t> sizes, host_off, dev_off;
  size_t host_bytes = 0, dev_bytes = 0;
};

// Scattered: slots in shuffled order on each side, random gaps and skews;
// adjacent: block i right after block i-1 on both sides (one merged copy).
Layout random_layout(std::mt19937_64& rng, size_t count, size_t block, bool same_size, bool adjacent) {
  Layout l;
  for (size_t i = 0; i < count; ++i) l.sizes.push_back(same_size ? block : 1 + rng() % block);
  auto place = [&](std::vector<size_t>& off, size_t& end) {
    std::vector<size_t> order(count);
    std::iota(order.begin(), order.end(), 0);
    if (!adjacent) std::shuffle(order.begin(), order.end(), rng);
    off.assign(count, 0);
    size_t at = adjacent ? rng() % 64 : 0;
    for (size_t k : order) {
      if (!adjacent) at += rng() % 48;  // a gap (odd too): the next block's skew
      off[k] = at;
      at += l.sizes[k];
    }
    end = at + 64;
  };
  place(l.host_off, l.host_bytes);
  place(l.dev_off, l.dev_bytes);
  return l;
}

// Up from random pinned memory, down into poisoned pinned memory; every block
// compared, every other byte of both sides still poisoned.
void round_trip(const Layout& l, Strategy strategy, bool with_stream, uint64_t seed, const std::string& what,
                CopyEngine& through = engine()) {
  unsigned char *src = nullptr, *dst = nullptr;
  ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&src), l.host_bytes, 0), cudaSuccess);
  ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&dst), l.host_bytes, 0), cudaSuccess);
  DeviceBuffer dev(l.dev_bytes);
  fill_random(src, l.host_bytes, seed);
  std::memset(dst, kHostPoison, l.host_bytes);
  CUDA_OK(cudaMemset(dev.p, kDevicePoison, l.dev_bytes));
  std::vector<CopyOp> up, down;
  for (size_t i = 0; i < l.sizes.size(); ++i) {
    up.push_back({dev.p + l.dev_off[i], src + l.host_off[i], l.sizes[i]});
    down.push_back({dst + l.host_off[i], dev.p + l.dev_off[i], l.sizes[i]});
  }
  cudaStream_t s = nullptr;
  if (with_stream) CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  through.copy_many_async(up, s, strategy).wait();
  through.copy_many(down, s, strategy);
  if (s) CUDA_OK(cudaStreamDestroy(s));
  std::vector<unsigned char> device_side(l.dev_bytes);
  CUDA_OK(cudaMemcpy(device_side.data(), dev.p, l.dev_bytes, cudaMemcpyDeviceToHost));
  std::vector<bool> on_host(l.host_bytes), on_dev(l.dev_bytes);
  for (size_t i = 0; i < l.sizes.size(); ++i) {
    ASSERT_EQ(std::memcmp(dst + l.host_off[i], src + l.host_off[i], l.sizes[i]), 0)
        << what << ": block " << i << " of " << l.sizes[i] << " bytes came back wrong";
    ASSERT_EQ(std::memcmp(device_side.data() + l.dev_off[i], src + l.host_off[i], l.sizes[i]), 0)
        << what << ": block " << i << " on the device is wrong";
    std::fill_n(on_host.begin() + l.host_off[i], l.sizes[i], true);
    std::fill_n(on_dev.begin() + l.dev_off[i], l.sizes[i], true);
  }
  for (size_t k = 0; k < l.host_bytes; ++k)
    ASSERT_TRUE(on_host[k] || dst[k] == kHostPoison) << what << ": host byte " << k << " outside every block written";
  for (size_t k = 0; k < l.dev_bytes; ++k)
    ASSERT_TRUE(on_dev[k] || device_side[k] == kDevicePoison)
        << what << ": device byte " << k << " outside every block written";
  cudaFreeHost(src);
  cudaFreeHost(dst);
}

TEST(KvBlocks, RandomBlocksEveryPathBitExact) {
  std::mt19937_64 rng(test_seed());
  const Strategy strategies[] = {Strategy::automatic, Strategy::direct, Strategy::sm};
  for (int round = 0; round < 18; ++round) {
    const size_t block = std::vector<size_t>{4096, 16384, 32768, 65536, 262144, 2 << 20, 1 + rng() % 300000}[rng() % 7];
    const size_t most = std::max<size_t>(1, (48u << 20) / block);
    const size_t count = 1 + rng() % std::min<size_t>(most, rng() % 4 == 0 ? 60000 : 3000);
    const bool same_size = rng() % 3 != 0, adjacent = rng() % 4 == 0, with_stream = rng() % 2 == 0;
    const Strategy strategy = strategies[round % 3];
    const std::string what = "round " + std::to_string(round) + ": " + std::to_string(count) + " blocks of " +
                             (same_size ? "" : "up to ") + std::to_string(block) + " B, " +
                             (adjacent ? "adjacent" : "scattered") + ", strategy " + strategy_name(strategy) +
                             (with_stream ? ", a stream" : ", no stream");
    SCOPED_TRACE(what);
    round_trip(random_layout(rng, count, block, same_size, adjacent), strategy, with_stream, rng(), what);
    if (HasFatalFailure()) return;
  }
}

// The SM kernel cut into many launches (batch_sm_launch_bytes: 4 KiB per SM,
// 3 SMs): launches of a few ops each, more launches asked for than there are
// ops (one op each then), odd block sizes; every block bit-exact.
TEST(KvBlocks, SmKernelInManyLaunchesBitExact) {
  CopyEngineOptions o = CopyEngineOptions::from_environment(0);
  o.profile.batch_sm_launch_bytes = 4096;
  o.profile.batch_sm_max_sms = 3;
  CopyEngine small_launches(o);
  std::mt19937_64 rng(test_seed() + 7);
  for (int round = 0; round < 6; ++round) {
    const size_t block = std::vector<size_t>{4096, 20000, 65536, 1 + rng() % 100000}[rng() % 4];
    const size_t count = 1 + rng() % 900;
    const bool same_size = rng() % 2 == 0, with_stream = rng() % 2 == 0;
    const std::string what = "launches of 12 KiB, round " + std::to_string(round) + ": " + std::to_string(count) +
                             " blocks of " + (same_size ? "" : "up to ") + std::to_string(block) + " B";
    SCOPED_TRACE(what);
    round_trip(random_layout(rng, count, block, same_size, false), Strategy::sm, with_stream, rng(), what,
               small_launches);
    if (HasFatalFailure()) return;
  }
}

// Two registrations next to each other in the address space: blocks adjacent
// on both sides run across the boundary, but one DMA or kernel op must not
// (a cudaMemcpyAsync over two registrations fails; their device mappings are
// not contiguous).
TEST(KvBlocks, AdjacentBlocksAcrossTwoAdjacentRegistrations) {
  const size_t half = 4 * MiB, block = 48 * KiB + 16;  // blocks straddle the boundary
  HostBuffer host(2 * half), back(2 * half);
  CUDA_OK(cudaHostRegister(host.p, half, cudaHostRegisterDefault));
  CUDA_OK(cudaHostRegister(host.p + half, half, cudaHostRegisterDefault));
  CUDA_OK(cudaHostRegister(back.p, half, cudaHostRegisterDefault));
  CUDA_OK(cudaHostRegister(back.p + half, half, cudaHostRegisterDefault));
  DeviceBuffer dev(2 * half);
  const size_t count = (2 * half - 100) / block;
  for (Strategy strategy : {Strategy::automatic, Strategy::direct, Strategy::sm}) {
    SCOPED_TRACE(strategy_name(strategy));
    fill_random(host.p, 2 * half, 77 + static_cast<int>(strategy));
    std::memset(back.p, kHostPoison, 2 * half);
    std::vector<CopyOp> up, down;
    for (size_t i = 0; i < count; ++i) {
      up.push_back({dev.p + 32 + i * block, host.p + 32 + i * block, block});
      down.push_back({back.p + 32 + i * block, dev.p + 32 + i * block, block});
    }
    engine().copy_many(up, nullptr, strategy);
    engine().copy_many(down, nullptr, strategy);
    ASSERT_EQ(std::memcmp(back.p + 32, host.p + 32, count * block), 0);
    ASSERT_EQ(back.p[31], kHostPoison);
    ASSERT_EQ(back.p[32 + count * block], kHostPoison);
  }
  for (unsigned char* p : {host.p, host.p + half, back.p, back.p + half}) CUDA_OK(cudaHostUnregister(p));
}

// One thread copies up, another down, both with no stream, many times; each
// checks its own blocks (they overlap in time on the engine's two streams).
TEST(KvBlocks, BothDirectionsAtOnceFromTwoThreadsWithNoStream) {
  for (size_t block : {size_t{16} << 10, size_t{256} << 10}) {
    SCOPED_TRACE(std::to_string(block) + " B blocks");
    const size_t count = (64u << 20) / block, bytes = count * block;
    unsigned char *up_src = nullptr, *down_dst = nullptr, *expect = nullptr;
    ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&up_src), bytes, 0), cudaSuccess);
    ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&down_dst), bytes, 0), cudaSuccess);
    ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&expect), bytes, 0), cudaSuccess);
    DeviceBuffer up_dev(bytes), down_dev(bytes);
    fill_random(up_src, bytes, 5);
    fill_random(expect, bytes, 6);
    CUDA_OK(cudaMemcpy(down_dev.p, expect, bytes, cudaMemcpyHostToDevice));
    std::mt19937_64 rng(test_seed() + block);
    std::vector<size_t> order(count);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<CopyOp> up, down;
    for (size_t i = 0; i < count; ++i) {
      up.push_back({up_dev.p + order[i] * block, up_src + i * block, block});
      down.push_back({down_dst + i * block, down_dev.p + order[i] * block, block});
    }
    std::string error;
    std::thread t([&] {
      try {
        for (int k = 0; k < 10; ++k) engine().copy_many(up, nullptr);
      } catch (const std::exception& e) {
        error = e.what();
      }
    });
    for (int k = 0; k < 10; ++k) {
      std::memset(down_dst, kHostPoison, bytes);
      engine().copy_many(down, nullptr);
      for (size_t i = 0; i < count; ++i)
        ASSERT_EQ(std::memcmp(down_dst + i * block, expect + order[i] * block, block), 0) << "round " << k;
    }
    t.join();
    ASSERT_EQ(error, "");
    std::vector<unsigned char> got(bytes);
    CUDA_OK(cudaMemcpy(got.data(), up_dev.p, bytes, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(std::memcmp(got.data() + order[i] * block, up_src + i * block, block), 0) << "block " << i;
    cudaFreeHost(up_src);
    cudaFreeHost(down_dst);
    cudaFreeHost(expect);
  }
}

// Async SM batches back to back, none waited for until the end: each launch
// reads its own block list (the lists' buffers are reused only once the
// launch that read one has run), in both directions, two streams.
TEST(KvBlocks, AsyncKernelBatchesBackToBackKeepTheirBlockLists) {
  const size_t block = 8 * KiB + 16, count = 500, batches = 24;
  const size_t bytes = block * count * batches;
  unsigned char *src = nullptr, *dst = nullptr;
  ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&src), bytes, 0), cudaSuccess);
  ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&dst), bytes, 0), cudaSuccess);
  DeviceBuffer dev(bytes);
  fill_random(src, bytes, test_seed() + 9);
  std::memset(dst, kHostPoison, bytes);
  std::mt19937_64 rng(test_seed() + 10);
  std::vector<size_t> order(count * batches);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  cudaStream_t up_stream, down_stream;
  CUDA_OK(cudaStreamCreateWithFlags(&up_stream, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&down_stream, cudaStreamNonBlocking));
  std::vector<Completion> ups, downs;
  for (size_t b = 0; b < batches; ++b) {
    std::vector<CopyOp> up;
    for (size_t i = b * count; i < (b + 1) * count; ++i) up.push_back({dev.p + order[i] * block, src + i * block, block});
    ups.push_back(engine().copy_many_async(up, up_stream, Strategy::sm));
  }
  for (auto& c : ups) c.wait();
  for (size_t b = 0; b < batches; ++b) {
    std::vector<CopyOp> down;
    for (size_t i = b * count; i < (b + 1) * count; ++i)
      down.push_back({dst + i * block, dev.p + order[i] * block, block});
    downs.push_back(engine().copy_many_async(down, b % 2 ? down_stream : up_stream, Strategy::sm));
  }
  for (auto& c : downs) c.wait();
  ASSERT_EQ(std::memcmp(dst, src, bytes), 0);
  CUDA_OK(cudaStreamDestroy(up_stream));
  CUDA_OK(cudaStreamDestroy(down_stream));
  cudaFreeHost(src);
  cudaFreeHost(dst);
}

// A block plan captured in a CUDA graph: each replay copies the blocks' bytes
// of that moment (new random data each time), up and back down; a plan
// refuses pageable memory, naming the item.
TEST(KvBlocks, BlockPlanReplaysFromACudaGraph) {
  const size_t block = 32 * KiB, count = 700;
  unsigned char *src = nullptr, *dst = nullptr;
  ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&src), block * count, 0), cudaSuccess);
  ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&dst), block * count, 0), cudaSuccess);
  DeviceBuffer dev(block * count * 2);
  std::mt19937_64 rng(test_seed() + 11);
  std::vector<size_t> order(count * 2);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<CopyOp> up, down;
  for (size_t i = 0; i < count; ++i) {
    up.push_back({dev.p + order[i] * block, src + i * block, block});
    down.push_back({dst + i * block, dev.p + order[i] * block, block});
  }
  BlockPlan up_plan(engine(), up), down_plan(engine(), down, 2);
  EXPECT_EQ(up_plan.items(), count);
  EXPECT_EQ(up_plan.bytes(), block * count);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t graph;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  up_plan.launch(s);
  down_plan.launch(s);
  CUDA_OK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    fill_random(src, block * count, test_seed() + 100 + replay);
    std::memset(dst, kHostPoison, block * count);
    CUDA_OK(cudaGraphLaunch(exec, s));
    CUDA_OK(cudaStreamSynchronize(s));
    ASSERT_EQ(std::memcmp(dst, src, block * count), 0) << "replay " << replay;
  }
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(s));
  HostBuffer pageable(block * 4);
  std::vector<CopyOp> mixed = {up[0], {dev.p, pageable.p, block}, up[2]};
  try {
    BlockPlan bad(engine(), mixed);
    ADD_FAILURE() << "a plan with pageable memory was made";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("pinned host memory and device memory"), std::string::npos) << e.what();
  }
  cudaFreeHost(src);
  cudaFreeHost(dst);
}

// With no stream, copy_many runs on the engine's stream, after the work queued
// on the legacy default stream before the call: the bytes a memset there
// wrote (behind a queue of slow memsets) are the ones copied.
TEST(KvBlocks, NoStreamCallIsOrderedAfterTheLegacyStream) {
  const size_t big = 1u << 30, block = 16 * KiB, count = 256;
  DeviceBuffer slow(big), dev(count * block);
  unsigned char* host = nullptr;
  ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&host), count * block, 0), cudaSuccess);
  for (Strategy strategy : {Strategy::automatic, Strategy::direct, Strategy::sm}) {
    for (bool async : {false, true}) {
      SCOPED_TRACE(std::string(strategy_name(strategy)) + (async ? ", async" : ""));
      CUDA_OK(cudaMemset(dev.p, kDevicePoison, count * block));
      std::memset(host, kHostPoison, count * block);
      for (int k = 0; k < 8; ++k) CUDA_OK(cudaMemsetAsync(slow.p, k, big, nullptr));
      const unsigned char value = static_cast<unsigned char>(0x30 + static_cast<int>(strategy) * 2 + async);
      CUDA_OK(cudaMemsetAsync(dev.p, value, count * block, nullptr));
      std::vector<CopyOp> down;
      for (size_t i = 0; i < count; ++i) down.push_back({host + i * block, dev.p + (count - 1 - i) * block, block});
      if (async)
        engine().copy_many_async(down, nullptr, strategy).wait();
      else
        engine().copy_many(down, nullptr, strategy);
      for (size_t k = 0; k < count * block; ++k) ASSERT_EQ(host[k], value) << "byte " << k;
    }
  }
  cudaFreeHost(host);
}

}  // namespace
}  // namespace ferry::cuda
