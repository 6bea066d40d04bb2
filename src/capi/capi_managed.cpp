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
#include "cuda/managed_allocator.h"
#include "pool/managed_options.h"

using ferry::ManagedKind;
using ferry::capi::guarded;
using ferry::capi::require;

namespace {

std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

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
  try {
    try {
      ferry::cuda::managed_deallocate(kind, ptr, device, stream);
    } catch (const std::exception& e) {
      report(kind,
             std::string(ferry::managed_kind_name(kind)) + " allocator: free of " + hex(ptr) +
                 " on device " +
                 std::to_string(device) + " failed: " + e.what(),
             false);
    }
  } catch (...) {
    report(kind, "free failed", false);
  }
}

ManagedKind kind_of(const char* name) {
  require(name, "name");
  return ferry::parse_managed_kind(name);
}

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

ferry_status_t ferry_managed_configure(const char* name, const char* options) {
  return guarded([&] { ferry::cuda::managed_configure(kind_of(name), options ? options : ""); });
}

ferry_status_t ferry_managed_get_stats(const char* name, int device, ferry_managed_stats_t* out) {
  return guarded([&] {
    require(out, "out");
    const ManagedKind kind = kind_of(name);
    ferry::cuda::ManagedStats s = ferry::cuda::managed_stats(kind, device);
    *out = ferry_managed_stats_t{};
    out->allocated = s.allocated;
    out->allocated_peak = s.allocated_peak;
    out->requested = s.requested;
    out->reserved = s.reserved;
    out->reserved_peak = s.reserved_peak;
    out->allocations = s.allocations;
    out->frees = s.frees;
    out->failures = s.failures;
    out->prefetched_bytes = s.prefetched_bytes;
    out->prefetches = s.prefetches;
    out->chunks = s.chunks;
    out->reuse_same_stream = s.reuse_same_stream;
    out->reuse_after_fence = s.reuse_after_fence;
    out->reuse_by_wait = s.reuse_by_wait;
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
