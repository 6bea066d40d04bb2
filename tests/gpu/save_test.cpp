// save_test.cpp — a save from device memory on a real device
// (load/save_file.h with cuda/load/file_writer.h's EngineReads): random
// header and parts at misaligned device addresses, host parts between them,
// odd sizes and zero-size parts, through slot sizes from 4 KiB to 32 MiB,
// O_DIRECT and buffered; the file read back byte for byte. The save is
// ordered after the caller's stream (a memset queued there just before).
// A part on a device the save was not given is refused with nothing written.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <random>

#include "core/error.h"
#include "cuda/copy/copy_engine.h"
#include "cuda/load/file_writer.h"
#include "cuda/pinned_pool.h"
#include "load/save_file.h"
#include "pool/pool.h"
#include "../support/temp_files.h"

namespace ferry {
namespace {

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x << ": " << cudaGetErrorString(x)

constexpr size_t KiB = 1024, MiB = 1024 * KiB;

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

cuda::CopyEngine& engine() {
  // Kept for the process, as the Python module's engines are.
  static cuda::CopyEngine* e = new cuda::CopyEngine(cuda::CopyEngineOptions::from_environment(0));
  return *e;
}

Pool& pinned() {
  static std::unique_ptr<Pool> p = cuda::make_pinned_pool(PoolOptions::from_environment(), 0);
  return *p;
}

TEST(SaveFromDevice, RandomPartsAtOddAddressesArriveIntact) {
  std::mt19937_64 rng(39);
  test_support::TempFiles dir;
  ASSERT_TRUE(dir.ok());
  const size_t device_bytes = 96 * MiB;
  void* dev = nullptr;
  CUDA_OK(cudaMalloc(&dev, device_bytes));
  std::vector<uint8_t> host_src(device_bytes);
  for (auto& b : host_src) b = static_cast<uint8_t>(rng());
  CUDA_OK(cudaMemcpy(dev, host_src.data(), device_bytes, cudaMemcpyHostToDevice));
  std::vector<std::vector<uint8_t>> host_parts;
  for (size_t slot : {4 * KiB, 1 * MiB, 32 * MiB}) {
    for (bool direct : {true, false}) {
      load::FileLayout layout;
      layout.header.resize(4 * KiB - 8 * (rng() % 3));
      for (auto& c : layout.header) c = static_cast<char>(rng());
      std::vector<uint8_t> expect(layout.header.begin(), layout.header.end());
      size_t at = 1 + rng() % 63;
      for (int k = 0; k < 40 && at < device_bytes; ++k) {
        const size_t most = k % 5 == 0 ? 8 * MiB : 70 * KiB;
        const size_t n = k % 9 == 0 ? 0 : std::min<size_t>(device_bytes - at, 1 + rng() % most);
        if (k % 4 == 3) {
          host_parts.emplace_back(n);
          for (auto& b : host_parts.back()) b = static_cast<uint8_t>(rng());
          layout.parts.push_back({reinterpret_cast<uintptr_t>(host_parts.back().data()), n, -1});
          expect.insert(expect.end(), host_parts.back().begin(), host_parts.back().end());
        } else {
          layout.parts.push_back({reinterpret_cast<uintptr_t>(dev) + at, n, 0});
          expect.insert(expect.end(), host_src.begin() + at, host_src.begin() + at + n);
          at += n + rng() % 5;
        }
      }
      SCOPED_TRACE("slot " + std::to_string(slot) + (direct ? ", O_DIRECT" : ", buffered") + ", " +
                   std::to_string(expect.size()) + " bytes");
      const std::string path = dir.dir() + "/m.safetensors";
      load::AtomicFile f(path, path + ".tmp", direct, true);
      load::SaveOptions o;
      o.slot_bytes = slot;
      o.slots = 4;
      {
        cuda::EngineReads reads({cuda::SaveDevice{0, &engine(), nullptr}}, o.slots);
        const load::SaveStats st = load::save_file(f, layout, pinned(), &reads, o, {});
        EXPECT_EQ(st.bytes, expect.size());
      }
      f.publish(true);
      EXPECT_EQ(read_file(path), expect);
    }
  }
  cudaFree(dev);
}

TEST(SaveFromDevice, TheSaveIsOrderedAfterTheCallersStream) {
  test_support::TempFiles dir;
  ASSERT_TRUE(dir.ok());
  const size_t n = 64 * MiB;
  void* dev = nullptr;
  CUDA_OK(cudaMalloc(&dev, n));
  CUDA_OK(cudaMemset(dev, 0x11, n));
  cudaStream_t caller = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&caller, cudaStreamNonBlocking));
  for (int round = 0; round < 3; ++round) {
    const int value = 0x40 + round;
    CUDA_OK(cudaMemsetAsync(dev, value, n, caller));  // queued, not waited for
    load::FileLayout layout;
    layout.parts.push_back({reinterpret_cast<uintptr_t>(dev), n, 0});
    const std::string path = dir.dir() + "/o";
    load::AtomicFile f(path, path + ".tmp", true, false);
    {
      cuda::EngineReads reads({cuda::SaveDevice{0, &engine(), caller}}, 8);
      load::save_file(f, layout, pinned(), &reads, load::SaveOptions{}, {});
    }
    f.publish(false);
    const std::vector<uint8_t> got = read_file(path);
    ASSERT_EQ(got.size(), n);
    EXPECT_EQ(std::count(got.begin(), got.end(), static_cast<uint8_t>(value)), static_cast<long>(n));
  }
  cudaStreamDestroy(caller);
  cudaFree(dev);
}

TEST(SaveFromDevice, APartOnADeviceTheSaveWasNotGivenIsRefused) {
  test_support::TempFiles dir;
  ASSERT_TRUE(dir.ok());
  void* dev = nullptr;
  CUDA_OK(cudaMalloc(&dev, 1 * MiB));
  load::FileLayout layout;
  layout.parts.push_back({reinterpret_cast<uintptr_t>(dev), 1 * MiB, 3});
  const std::string path = dir.dir() + "/r";
  load::AtomicFile f(path, path + ".tmp", true, false);
  std::string what;
  try {
    cuda::EngineReads reads({cuda::SaveDevice{0, &engine(), nullptr}}, 8);
    load::save_file(f, layout, pinned(), &reads, load::SaveOptions{}, {});
  } catch (const Error& e) {
    what = e.what();
  }
  EXPECT_NE(what.find("cuda:3"), std::string::npos) << what;
  EXPECT_TRUE(read_file(path + ".tmp").empty()) << "the temporary file is removed";
  EXPECT_TRUE(read_file(path).empty());
  cudaFree(dev);
}

}  // namespace
}  // namespace ferry
