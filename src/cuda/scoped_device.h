// scoped_device.h — gives the caller's thread its current device back at the end
// of a scope in which ferry makes another device current, so that no ferry call
// leaves the caller's current device changed. The one device guard of the CUDA
// layer (the copy engine, the channel, the managed allocators and the loader).
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/cuda_check.h"

namespace ferry::cuda {

class ScopedDevice {
 public:
  // Makes `device` current for the scope. Throws (CudaError, NoDevice) if it
  // cannot; the caller checks the index first where a bad one is the user's.
  explicit ScopedDevice(int device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ == device) return;
    check(cudaSetDevice(device), "cudaSetDevice");
    changed_ = true;
  }
  // Changes nothing now; restores the current device at the end of a scope whose
  // calls (set_device, creating streams on another device) may change it. Never
  // throws: with no driver there is nothing to restore.
  ScopedDevice() noexcept {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      cudaGetLastError();
      return;
    }
    changed_ = true;  // not known yet: restore at the end
  }
  ~ScopedDevice() {
    if (changed_ && cudaSetDevice(previous_) != cudaSuccess) cudaGetLastError();
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

}  // namespace ferry::cuda
