// registration.cpp — cudaHostRegister of a widened, huge-page-whole range.
#include "cuda/registration.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>

#include "core/error.h"
#include "core/fault.h"
#include "core/fork.h"
#include "cuda/cuda_check.h"
#include "cuda/device.h"
#include "cuda/scoped_device.h"
#include "os/mapping.h"

namespace ferry::cuda {

Registration::Registration(void* ptr, size_t bytes, int device)
    : device_(device), generation_(fork_generation()) {
  if (!ptr) throw InvalidArgument("register: ptr must not be NULL");
  if (bytes == 0) throw InvalidArgument("register: size 0");
  if (os::range_is_mapped(ptr, bytes) != 0)
    throw InvalidArgument("register: the range is not (fully) mapped host memory");
  ScopedDevice restore;  // the caller keeps its current device
  set_device(device);
  const uintptr_t begin = reinterpret_cast<uintptr_t>(ptr), end = begin + bytes;
  for (uintptr_t align : {uintptr_t{2} << 20, uintptr_t{4096}}) {
    uintptr_t b = begin & ~(align - 1), e = (end + align - 1) & ~(align - 1);
    if (align == 4096 || os::range_is_mapped(reinterpret_cast<void*>(b), e - b) == 0) {
      base_ = reinterpret_cast<void*>(b);
      bytes_ = e - b;
      break;
    }
  }
  char what[96];
  std::snprintf(what, sizeof what, "cudaHostRegister(%p, %s)", base_, format_bytes(bytes_).c_str());
  if (fault_injected(FaultPoint::register_host))
    throw CudaError(std::string(what) + " failed: injected fault (FERRY_FAULT_INJECT)", cudaErrorMemoryAllocation);
  check(cudaHostRegister(base_, bytes_, cudaHostRegisterDefault), what);
}

Registration::~Registration() {
  if (generation_ != fork_generation()) return;  // a forked child: the registration is the parent's
  ScopedDevice restore;
  cudaSetDevice(device_);
  cudaHostUnregister(base_);
  cudaGetLastError();
}

}  // namespace ferry::cuda
