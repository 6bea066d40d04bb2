// pinned_pool.cpp — ChunkHooks that pin chunks with cudaHostRegister.
#include "cuda/pinned_pool.h"

#include <cuda_runtime_api.h>

#include <cstdio>

#include "core/error.h"
#include "core/fault.h"
#include "pool/numa_home.h"
#include "cuda/cuda_check.h"
#include "cuda/device.h"
#include "cuda/scoped_device.h"

namespace ferry::cuda {
namespace {

class HostRegistrar final : public ChunkHooks {
 public:
  explicit HostRegistrar(int device) : device_(device) {}

  // Runs on whichever thread prepares the chunk (a caller or the pool's
  // target worker), while the pool's threads may still be touching the
  // chunk: make the pool's device current there first.
  void on_chunk_ready(void* base, size_t bytes) override {
    char what[96];
    std::snprintf(what, sizeof what, "cudaHostRegister(%p, %s)", base, format_bytes(bytes).c_str());
    if (fault_injected(FaultPoint::register_host))
      throw CudaError(std::string(what) + " failed: injected fault (FERRY_FAULT_INJECT)",
                      cudaErrorMemoryAllocation);
    ScopedDevice on(device_);  // the calling thread keeps its own device
    check(cudaHostRegister(base, bytes, cudaHostRegisterDefault), what);
  }

  void on_chunk_release(void* base, size_t) noexcept override {
    ScopedDevice restore;
    cudaSetDevice(device_);
    cudaHostUnregister(base);
    cudaGetLastError();
  }

 private:
  int device_;
};

}  // namespace

std::unique_ptr<Pool> make_pinned_pool(PoolOptions options, int device) {
  DeviceInfo info = device_info(device);  // throws NoDevice / InvalidArgument
  if (options.numa_node == -1) options.numa_node = numa_home(info.pci_bus_id);
  return std::make_unique<Pool>(options, std::make_shared<HostRegistrar>(device));
}

}  // namespace ferry::cuda
