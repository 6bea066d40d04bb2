// current_device_test.cpp — no ferry call changes the calling thread's current
// device: with the last device current, work on device 0 (device facts, a
// pinned pool, a registration, a copy engine and its copies) leaves the last one
// current. On the 2-GPU machine before this test, reading device facts left the
// last device current, and PyTorch's next `.cuda()` went to the wrong GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "cuda/copy/copy_engine.h"
#include "cuda/device.h"
#include "cuda/pinned_pool.h"
#include "cuda/registration.h"
#include "pool/pool.h"
#include "test_buffers.h"

namespace ferry::cuda {
namespace {

using namespace ferry::cuda::testing;

TEST(CurrentDevice, FerryCallsOnDeviceZeroLeaveTheCallersDeviceCurrent) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2)
    GTEST_SKIP() << "needs two CUDA devices (this machine has " << n << ")";
  const int mine = n - 1;
  struct BackToZero {  // the tests after this one expect device 0 current
    ~BackToZero() { cudaSetDevice(0); }
  } back_to_zero;
  CUDA_OK(cudaSetDevice(0));
  const size_t bytes = 5 * MiB + 3;
  unsigned char* dev = nullptr;
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&dev), bytes));
  CUDA_OK(cudaSetDevice(mine));
  auto still_mine = [&](const char* what) {
    int d = -1;
    ASSERT_EQ(cudaGetDevice(&d), cudaSuccess);
    ASSERT_EQ(d, mine) << what << " left device " << d << " current";
  };

  (void)device_info(0);
  still_mine("device_info(0)");
  {
    auto pool = make_pinned_pool(PoolOptions{}, 0);
    void* p = pool->allocate(3 * MiB);
    still_mine("a pinned pool of device 0 allocating");
    pool->deallocate(p);
  }
  still_mine("a pinned pool of device 0 released");

  HostBuffer src(bytes), back(bytes);
  std::mt19937_64 rng(7);
  for (size_t i = 0; i < bytes; ++i) src.p[i] = static_cast<unsigned char>(rng());
  std::memset(back.p, 0xA5, bytes);
  {
    Registration r(src.p, bytes, 0);
    still_mine("a registration for device 0");
  }
  still_mine("a registration for device 0 released");
  {
    CopyEngine engine(CopyEngineOptions::from_environment(0));
    still_mine("a copy engine of device 0");
    engine.copy(dev, src.p, bytes);
    engine.copy(back.p, dev, bytes);
    still_mine("copies through device 0's engine");
  }
  still_mine("device 0's engine destroyed");
  ASSERT_EQ(std::memcmp(src.p, back.p, bytes), 0);
  CUDA_OK(cudaFree(dev));
}

}  // namespace
}  // namespace ferry::cuda
