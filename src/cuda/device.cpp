// device.cpp — device enumeration and properties through the CUDA runtime.
#include "cuda/device.h"

#include <cuda_runtime_api.h>

#include "core/error.h"
#include "cuda/cuda_check.h"

namespace ferry::cuda {

Versions versions() noexcept {
  Versions v;
  v.runtime = CUDART_VERSION;
  if (cudaDriverGetVersion(&v.driver) != cudaSuccess) v.driver = 0;
  return v;
}

int device_count() {
  int n = 0;
  check(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
  if (n == 0) throw NoDevice("no CUDA device: the driver reports 0 devices", cudaErrorNoDevice);
  return n;
}

namespace {

void check_device_exists(int device) {
  int n = device_count();
  if (device < 0 || device >= n)
    throw InvalidArgument("device " + std::to_string(device) + " does not exist (" +
                          std::to_string(n) + " CUDA device" + (n == 1 ? "" : "s") + ")");
}

}  // namespace

void set_device(int device) {
  check_device_exists(device);
  check(cudaSetDevice(device), "cudaSetDevice");
}

// Asks without making the device current: the caller's current device stays,
// and no device gets a context only because its facts were read.
DeviceInfo device_info(int device) {
  check_device_exists(device);
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
  DeviceInfo d;
  d.index = device;
  d.name = p.name;
  d.total_memory_bytes = p.totalGlobalMem;
  d.pci_bus_id = pci_bus_id(device);
  d.cc_major = p.major;
  d.cc_minor = p.minor;
  d.multiprocessors = p.multiProcessorCount;
  d.async_engine_count = p.asyncEngineCount;
  d.can_map_host_memory = p.canMapHostMemory;
  auto attr = [&](cudaDeviceAttr a) {
    int v = 0;
    return cudaDeviceGetAttribute(&v, a, device) == cudaSuccess ? v : -1;
  };
  d.host_native_atomic_supported = attr(cudaDevAttrHostNativeAtomicSupported);
  d.pageable_memory_access = attr(cudaDevAttrPageableMemoryAccess);
  d.concurrent_managed_access = attr(cudaDevAttrConcurrentManagedAccess);
  d.host_register_supported = attr(cudaDevAttrHostRegisterSupported);
  d.numa_node = attr(cudaDevAttrNumaId);
  cudaGetLastError();
  return d;
}

std::string pci_bus_id(int device) {
  char bus[32] = {};
  check(cudaDeviceGetPCIBusId(bus, sizeof bus, device), "cudaDeviceGetPCIBusId");
  return bus;
}

}  // namespace ferry::cuda
