// baselines.h — the CUDA runtime's own ways of doing what ferry does, timed the
// same way, so that `ferry bench` and `ferry doctor` print ferry beside them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ferry::cuda {

struct AllocFreeSeconds {
  double alloc = 0, free = 0;
};

// cudaHostAlloc(bytes) then cudaFreeHost, each timed once (first use in this
// process pays the context creation: call warm_up() first).
AllocFreeSeconds time_cuda_host_alloc(size_t bytes, int device);

// Per-iteration nanoseconds of cudaHostAlloc+cudaFreeHost of `bytes`.
std::vector<uint64_t> time_cuda_host_alloc_free_ns(size_t bytes, int iterations, int device);

// cudaHostRegister of an existing range, then cudaHostUnregister, timed once.
AllocFreeSeconds time_cuda_host_register(void* ptr, size_t bytes, int device);

// Creates the device's primary context so that later timings exclude it.
void warm_up(int device);

}  // namespace ferry::cuda
