// device.h — CUDA devices and versions, as plain C++ values (no CUDA types).
#pragma once

#include <string>
#include <vector>

namespace ferry::cuda {

struct Versions {
  int runtime = 0;  // CUDART_VERSION ferry was built with, e.g. 13000
  int driver = 0;   // 0 when no driver is installed
};

struct DeviceInfo {
  int index = 0;
  std::string name;
  size_t total_memory_bytes = 0;
  std::string pci_bus_id;  // "0000:00:05.0"
  int cc_major = 0, cc_minor = 0;
  int multiprocessors = 0;
  int async_engine_count = 0;
  int host_native_atomic_supported = 0;
  int pageable_memory_access = 0;
  int concurrent_managed_access = 0;
  int can_map_host_memory = 0;
  int host_register_supported = 0;
  // cudaDevAttrNumaId: the node of the GPU's own memory where it is one
  // (coherent platforms); -1 when unknown. Not the host node nearest the GPU:
  // that is numa_home(pci_bus_id) (pool/numa_home.h).
  int numa_node = -1;
};

Versions versions() noexcept;

// Throws NoDevice (with the reason) when there is no driver or device.
int device_count();
DeviceInfo device_info(int device);

// "0000:0A:00.0" (cudaDeviceGetPCIBusId); the device must exist.
std::string pci_bus_id(int device);

// Makes `device` current on this thread; InvalidArgument for a bad index. Code
// that runs on a caller's thread keeps the caller's device (ScopedDevice).
void set_device(int device);


}  // namespace ferry::cuda
