// managed_allocator.h — ferry's device-side allocators for PyTorch's
// CUDAPluggableAllocator (the extern "C" entry points are in
// src/capi/capi_managed.cpp):
//   device        cudaMalloc / cudaFree (the study's plain baseline);
//   managed       cudaMallocManaged per allocation; optional prefetch to the
//                 device on the allocating stream and cudaMemAdvise;
//   managed_pool  ManagedPool (managed/managed_pool.h) over cudaMallocManaged
//                 chunks; prefetch of each allocation (or each new chunk) on
//                 its stream; events recorded on the freeing stream as fences.
// Options and the oversubscription guard: managed/managed_options.h (pure).
//
// Every allocator is a process-wide singleton that is never destroyed: PyTorch
// frees tensors during interpreter shutdown, after static destructors may have
// run. Each keeps its own record of live allocations, so the size PyTorch
// passes to free is not trusted (it has differed from the allocated size:
// pytorch/pytorch#153109).
//
// Locking: per allocator, one mutex for options, records and counters; the
// managed pool has its own (see managed_pool.h); one mutex per device
// serializes the budget check with cudaMallocManaged, so two threads cannot
// both pass the check for the same free memory. CUDA calls are made without
// the allocator mutex held, except cudaEventQuery / cudaStreamWaitEvent under
// the pool's lock (non-blocking).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "managed/managed_options.h"

namespace ferry::cuda {

struct ManagedStats {
  uint64_t allocated = 0, allocated_peak = 0;  // bytes in live allocations (pool: class sizes)
  uint64_t requested = 0;                      // bytes asked for by live allocations
  uint64_t reserved = 0, reserved_peak = 0;    // bytes obtained from CUDA
  uint64_t allocations = 0, frees = 0, failures = 0;
  uint64_t prefetched_bytes = 0, prefetches = 0;
  uint64_t chunks = 0;  // managed_pool: chunks held
  uint64_t reuse_same_stream = 0, reuse_after_fence = 0, reuse_by_wait = 0;  // managed_pool
};

// Replaces the options of allocator `kind` (text: managed/managed_options.h);
// applies to later allocations and chunks. InvalidArgument for bad text.
void managed_configure(ManagedKind kind, std::string_view options);
// The canonical text of the current options.
std::string managed_options_text(ManagedKind kind);

// Preconditions: n > 0. Throws ferry::Error: NoDevice, OutOfMemory (with the
// guard's message), NotSupported (prefetch/advice without
// concurrentManagedAccess), CudaError.
void* managed_allocate(ManagedKind kind, size_t n, int device, cudaStream_t stream);
// Frees p, which `kind` allocated on `device`; `stream` is the stream PyTorch
// says it was used on. Never throws (a free path): false, with *error set, for
// a pointer `kind` did not hand out (nothing changed) or when CUDA refuses (the
// record is dropped).
bool managed_deallocate(ManagedKind kind, void* p, int device, cudaStream_t stream, std::string* error) noexcept;

// managed_pool: returns chunks with no live block and no pending work on
// `device` (-1: every device) to CUDA; the bytes released. Others: 0.
size_t managed_trim(ManagedKind kind, int device);

// device -1: the sum over devices. InvalidArgument for a device out of range.
ManagedStats managed_stats(ManagedKind kind, int device);

// Keeps the message of a failed allocation (allocation: also counts it in
// `failures`) or free: the C entry points return NULL to PyTorch, which does
// not say why.
void managed_record_failure(ManagedKind kind, const std::string& message, bool allocation) noexcept;
std::string managed_last_failure(ManagedKind kind);

// The file libferry.so was loaded from (dladdr), "" if unknown.
std::string library_path();

}  // namespace ferry::cuda
