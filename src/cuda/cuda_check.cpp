// cuda_check.cpp — mapping of CUDA errors to ferry exceptions.
#include "cuda/cuda_check.h"

#include "core/error.h"
#include "core/fork.h"

namespace ferry::cuda {

bool is_no_device(cudaError_t err) noexcept {
  return err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver ||
         err == cudaErrorCallRequiresNewerDriver ||
         err == cudaErrorSystemDriverMismatch || err == cudaErrorCompatNotSupportedOnDevice ||
         err == cudaErrorDevicesUnavailable;
}

std::string describe(cudaError_t err) {
  return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
}

void check(cudaError_t err, const char* call) {
  if (err == cudaSuccess) return;
  cudaGetLastError();  // do not let a non-sticky error leak into the next call
  if (err == cudaErrorInsufficientDriver)
    throw NoDevice(std::string(call) +
                       ": no CUDA driver (libcuda.so.1 is missing or older than the CUDA " +
                       std::to_string(CUDART_VERSION / 1000) + " runtime ferry was built with); " +
                       describe(err),
                   err);
  if (is_no_device(err))
    throw NoDevice(std::string(call) + ": no usable CUDA device; " + describe(err), err);
  if (err == cudaErrorMemoryAllocation)
    throw OutOfMemory(std::string(call) + ": out of memory; " + describe(err));
  // CUDA cannot be used in a child forked after its parent initialized CUDA:
  // every call there fails this way; say so instead of a bare code.
  if (err == cudaErrorInitializationError && fork_generation() > 0)
    throw NotSupported(std::string(call) + " failed: " + describe(err) +
                       ". This process was forked from one that had initialized CUDA, and CUDA cannot "
                       "be used in such a child: start it with the 'spawn' or 'forkserver' method "
                       "(multiprocessing.get_context('spawn'), DataLoader(multiprocessing_context='spawn'))");
  throw CudaError(std::string(call) + " failed: " + describe(err), err);
}

}  // namespace ferry::cuda
