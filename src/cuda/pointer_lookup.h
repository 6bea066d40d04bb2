// pointer_lookup.h — what the CUDA driver knows about a pointer: device memory
// (managed included), pinned host memory or pageable host memory, the range of
// its allocation, and the device view of pinned memory.
//
// One cuPointerGetAttributes per allocation: the ranges it reports are kept for
// the life of the object, and a pointer inside one makes no driver call. A
// batch of 1024 blocks of 64 KiB in two allocations so asks the driver twice
// instead of ~7000 times: its call took 1.3 ms of host time before, 72 us after
// (H200). Pageable memory, and pinned memory for which the driver reports no
// range or device pointer, is asked again each time.
//
// Lifetime: the answers hold while the allocations seen stay allocated, so an
// object lives for one copy or batch call (the caller owns its buffers during
// the call). Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/range_cache.h"

namespace ferry::cuda {

enum class Memory { device, pinned_host, pageable_host };

// Everything ferry asks the driver about one address, in one
// cuPointerGetAttributes call: the single pointer query of the CUDA layer
// (PointerLookup and the channel's range checks both use it).
struct PointerAttributes {
  int status = 0;                // the driver's CUresult; nonzero: the rest is unset
  unsigned int memory_type = 0;  // CU_MEMORYTYPE_*; 0: memory the driver does not know
  bool managed = false;
  int ordinal = -1;              // the device of device memory
  uintptr_t range_start = 0;     // the allocation [range_start, range_start + range_size)
  size_t range_size = 0;         // 0: the driver reported no range
  uintptr_t device_pointer = 0;  // pinned host memory: its device mapping (0 without a context)
  unsigned long long buffer_id = 0;
};
PointerAttributes query_pointer(const void* p);

struct PointerInfo {
  Memory kind = Memory::pageable_host;
  uintptr_t start = 0;         // the allocation is [start, start + size)
  size_t size = 0;             // 0: no range reported; start is the pointer asked about
  uintptr_t device_start = 0;  // the device address of start (pinned host: its mapping)
  int device = -1;             // device memory: the device that holds it; -1: host or managed
};

class PointerLookup {
 public:
  PointerInfo find(const void* p);
  // device for device or managed memory; pinned_host only when both ends of
  // [p, p + bytes) are pinned; else pageable_host.
  Memory classify(const void* p, size_t bytes);
  // Bytes from p to the end of its registration when p is pinned host memory
  // with a known range; SIZE_MAX otherwise. One DMA must not cross it: a
  // cudaMemcpyAsync over two adjacent registrations fails (invalid argument),
  // as the node pool's 64 MiB pieces showed on the H200.
  size_t pinned_bytes_after(const void* p);
  // Bytes of p's device allocation from p to its end; 0 when unknown.
  size_t device_bytes_after(const void* p);
  // The address a kernel uses for p: device memory as is, pinned host memory
  // through its device mapping.
  void* device_view(const void* p);

  size_t driver_queries() const { return queries_; }  // for tests

 private:
  RangeCache<PointerInfo> cache_;
  size_t queries_ = 0;
};

}  // namespace ferry::cuda
