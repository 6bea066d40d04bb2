// pointer_lookup.cpp — one cuPointerGetAttributes per allocation, cached.
#include "cuda/pointer_lookup.h"

#include <cstdint>

#include "cuda/driver_entry.h"

namespace ferry::cuda {

PointerAttributes query_pointer(const void* p) {
  CUpointer_attribute attributes[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,     CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                      CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                      CU_POINTER_ATTRIBUTE_DEVICE_POINTER,   CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                      CU_POINTER_ATTRIBUTE_BUFFER_ID};
  unsigned int memory_type = 0;
  unsigned int managed = 0;  // the driver writes a bool or an int: zeroed either way
  CUdeviceptr start = 0, device = 0;
  size_t size = 0;
  int ordinal = -1;
  unsigned long long buffer_id = 0;
  void* data[] = {&memory_type, &managed, &start, &size, &device, &ordinal, &buffer_id};
  PointerAttributes q;
  q.status = driver_pointer_attributes()(7, attributes, data, reinterpret_cast<CUdeviceptr>(p));
  if (q.status != CUDA_SUCCESS) return q;
  q.memory_type = memory_type;
  q.managed = managed != 0;
  q.ordinal = ordinal;
  q.range_start = start;
  q.range_size = size;
  q.device_pointer = device;
  q.buffer_id = buffer_id;
  return q;
}

PointerInfo PointerLookup::find(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  if (const auto* r = cache_.find(a)) return r->value;
  const PointerAttributes q = query_pointer(p);
  ++queries_;
  PointerInfo info;  // pageable unless the driver says otherwise
  info.start = info.device_start = a;
  // Unknown host memory is not an error here (all attributes come back 0); an
  // error is treated as the runtime's error was: not CUDA memory.
  if (q.status != CUDA_SUCCESS) return info;
  const bool managed = q.managed;
  const unsigned int memory_type = q.memory_type;
  const int ordinal = q.ordinal;
  const uintptr_t start = q.range_start, device = q.device_pointer;
  const size_t size = q.range_size;
  if (managed || memory_type == CU_MEMORYTYPE_DEVICE) {
    info.kind = Memory::device;
    if (!managed) info.device = ordinal;
  } else if (memory_type == CU_MEMORYTYPE_HOST)
    info.kind = Memory::pinned_host;
  else
    return info;
  if (info.kind == Memory::pinned_host) {
    // No device pointer: no context is current yet (the driver answers 0 in a
    // thread that never made one current). p as is, as before, but not cached:
    // copy_async asks for the kernel's view again once it has set the device.
    if (!device) return info;
    info.device_start = device;
  }
  if (size == 0 || a - start >= size) return info;  // no range: answer for p alone, not cached
  info.device_start -= a - start;
  info.start = start;
  info.size = size;
  cache_.add(start, size, info);
  return info;
}

Memory PointerLookup::classify(const void* p, size_t bytes) {
  const Memory first = find(p).kind;
  if (first != Memory::pinned_host) return first;
  return find(static_cast<const char*>(p) + bytes - 1).kind == Memory::pinned_host ? first
                                                                                    : Memory::pageable_host;
}

size_t PointerLookup::pinned_bytes_after(const void* p) {
  const PointerInfo info = find(p);
  if (info.kind != Memory::pinned_host || info.size == 0) return SIZE_MAX;
  return info.start + info.size - reinterpret_cast<uintptr_t>(p);
}

size_t PointerLookup::device_bytes_after(const void* p) {
  const PointerInfo info = find(p);
  return info.kind == Memory::device && info.size ? info.start + info.size - reinterpret_cast<uintptr_t>(p) : 0;
}

void* PointerLookup::device_view(const void* p) {
  const PointerInfo info = find(p);
  return reinterpret_cast<void*>(info.device_start + (reinterpret_cast<uintptr_t>(p) - info.start));
}

}  // namespace ferry::cuda
