// capi_managed.cpp — the C side of ferry's PyTorch allocators: the
// configuration and stats calls of ferry.h, and the extern "C" entry points
// that torch.cuda.memory.CUDAPluggableAllocator loads by name.
//
// Signatures of the entry points: torch/csrc/cuda/CUDAPluggableAllocator.h
// (PyTorch) calls alloc as void*(size_t, int, cudaStream_t) and free as
// void(void*, size_t, int, cudaStream_t); its documentation ("Using custom
// memory allocators for CUDA") declares them
//   extern "C" void* my_malloc(ssize_t size, int device, cudaStream_t stream);
//   extern "C" void my_free(void* ptr, ssize_t size, int device, cudaStream_t stream);
// which is what these are. Nothing is thrown across them: a failure returns
// NULL (alloc) or nothing (free), with the message on stderr, in
// ferry_last_error() of that thread and in the allocator's stats.
#include <sys/types.h>

#include <cstdio>
#include <string>

#include "capi/guard.h"
#include "capi/struct_size.h"
#include "cuda/managed/managed_allocator.h"
#include "managed/managed_options.h"

using ferry::ManagedKind;
using ferry::format_address;
using ferry::capi::guarded;
using ferry::capi::require;

namespace {

void report(ManagedKind kind, const std::string& message, bool allocation) noexcept {
  ferry::capi::set_last_error(message);
  ferry::cuda::managed_record_failure(kind, message, allocation);
  std::fprintf(stderr, "ferry: %s\n", message.c_str());
}

void* torch_alloc(ManagedKind kind, ssize_t size, int device, cudaStream_t stream) noexcept {
  if (size == 0) return nullptr;  // PyTorch asks for 0 bytes for empty tensors
  try {
    try {
      if (size < 0) throw ferry::InvalidArgument("negative size " + std::to_string(size));
      return ferry::cuda::managed_allocate(kind, static_cast<size_t>(size), device, stream);
    } catch (const std::exception& e) {
      report(kind,
             std::string(ferry::managed_kind_name(kind)) + " allocator: allocation of " +
                 std::to_string(size) + " B on device " + std::to_string(device) +
                 " failed, returning NULL to PyTorch: " + e.what(),
             true);
    }
  } catch (...) {  // building the message failed (out of host memory)
    report(kind, "allocation failed", true);
  }
  return nullptr;
}

void torch_free(ManagedKind kind, void* ptr, int device, cudaStream_t stream) noexcept {
  if (!ptr) return;
  std::string error;
  if (ferry::cuda::managed_deallocate(kind, ptr, device, stream, &error)) return;
  try {
    report(kind,
           std::string(ferry::managed_kind_name(kind)) + " allocator: free of " + format_address(ptr) + " on device " +
               std::to_string(device) + " failed: " + error,
           false);
  } catch (...) {  // building the message failed (out of host memory)
    report(kind, "free failed", false);
  }
}

ManagedKind kind_of(const char* name) {
  require(name, "name");
  return ferry::parse_managed_kind(name);
}

static_assert(static_cast<int>(ManagedKind::device) == FERRY_MANAGED_DEVICE &&
              static_cast<int>(ManagedKind::managed) == FERRY_MANAGED_MANAGED &&
              static_cast<int>(ManagedKind::managed_pool) == FERRY_MANAGED_MANAGED_POOL &&
              ferry::kManagedKinds == 3);

}  // namespace

extern "C" {

// ---- PyTorch entry points (see the top of this file) ---------------------------

FERRY_API void* ferry_torch_alloc_device(ssize_t size, int device, cudaStream_t stream) {
  return torch_alloc(ManagedKind::device, size, device, stream);
}
FERRY_API void ferry_torch_free_device(void* ptr, ssize_t, int device, cudaStream_t stream) {
  torch_free(ManagedKind::device, ptr, device, stream);
}
FERRY_API void* ferry_torch_alloc_managed(ssize_t size, int device, cudaStream_t stream) {
  return torch_alloc(ManagedKind::managed, size, device, stream);
}
FERRY_API void ferry_torch_free_managed(void* ptr, ssize_t, int device, cudaStream_t stream) {
  torch_free(ManagedKind::managed, ptr, device, stream);
}
FERRY_API void* ferry_torch_alloc_managed_pool(ssize_t size, int device, cudaStream_t stream) {
  return torch_alloc(ManagedKind::managed_pool, size, device, stream);
}
FERRY_API void ferry_torch_free_managed_pool(void* ptr, ssize_t, int device, cudaStream_t stream) {
  torch_free(ManagedKind::managed_pool, ptr, device, stream);
}

// ---- ferry.h ------------------------------------------------------------------

const char* ferry_managed_kind_name(ferry_managed_kind_t kind) {
  const int k = static_cast<int>(kind);
  return k >= 0 && k < ferry::kManagedKinds ? ferry::managed_kind_name(static_cast<ManagedKind>(k)) : nullptr;
}

ferry_status_t ferry_managed_kind_from_name(const char* name, ferry_managed_kind_t* out) {
  return guarded([&] {
    require(out, "out");
    *out = static_cast<ferry_managed_kind_t>(static_cast<int>(kind_of(name)));
  });
}

ferry_status_t ferry_managed_configure(const char* name, const char* options) {
  return guarded([&] { ferry::cuda::managed_configure(kind_of(name), options ? options : ""); });
}

ferry_status_t ferry_managed_get_stats(const char* name, int device, ferry_managed_stats_t* out) {
  return guarded([&] {
    require(out, "out");
    ferry::capi::caller_struct_size(out, "out");  // before the work
    const ManagedKind kind = kind_of(name);
    ferry::cuda::ManagedStats s = ferry::cuda::managed_stats(kind, device);
    ferry_managed_stats_t c{};
    c.allocated = s.allocated;
    c.allocated_peak = s.allocated_peak;
    c.requested = s.requested;
    c.reserved = s.reserved;
    c.reserved_peak = s.reserved_peak;
    c.allocations = s.allocations;
    c.frees = s.frees;
    c.failures = s.failures;
    c.prefetched_bytes = s.prefetched_bytes;
    c.prefetches = s.prefetches;
    c.chunks = s.chunks;
    c.reuse_same_stream = s.reuse_same_stream;
    c.reuse_after_fence = s.reuse_after_fence;
    c.reuse_by_wait = s.reuse_by_wait;
    ferry::capi::write_struct(out, c, "out");
  });
}

ferry_status_t ferry_managed_trim(const char* name, int device, size_t* released) {
  return guarded([&] {
    const ManagedKind kind = kind_of(name);
    const size_t n = ferry::cuda::managed_trim(kind, device);
    if (released) *released = n;
  });
}

}  // extern "C"
