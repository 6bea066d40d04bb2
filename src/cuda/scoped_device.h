// scoped_device.h — makes a device current for a scope and gives the caller's
// thread its previous device back, so that no ferry call leaves the caller's
// current device changed.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/cuda_check.h"

namespace ferry::cuda {

class ScopedDevice {
 public:
  // Throws (CudaError, NoDevice) if the device cannot be made current.
  explicit ScopedDevice(int device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ == device) return;
    check(cudaSetDevice(device), "cudaSetDevice");
    changed_ = true;
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
