// cuda_check.h — turns cudaError_t into ferry exceptions. CUDA layer only.
//
// No driver / no device become NoDevice with a sentence a user can act on; an
// allocation failure becomes OutOfMemory; everything else CudaError with the
// error's name and the call that failed.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

namespace ferry::cuda {

// Throws unless err == cudaSuccess. Clears the runtime's sticky last error.
void check(cudaError_t err, const char* call);

// True for the errors that mean "no usable driver or device".
bool is_no_device(cudaError_t err) noexcept;

// "cudaErrorInvalidValue: invalid argument"
std::string describe(cudaError_t err);

}  // namespace ferry::cuda
