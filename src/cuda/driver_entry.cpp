// driver_entry.cpp — driver entry points fetched through the runtime.
#include "cuda/driver_entry.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <mutex>

#include "core/error.h"
#include "cuda/cuda_check.h"

namespace ferry::cuda {
namespace {

struct Entry {
  PFN_cuStreamWaitValue64_v11070 wait = nullptr;
  PFN_cuStreamWriteValue64_v11070 write = nullptr;
  PFN_cuDeviceGetAttribute_v2000 attribute = nullptr;
  PFN_cuMemGetAddressRange_v3020 address_range = nullptr;
};

const Entry& entry() {
  static Entry e;
  static std::once_flag once;
  std::call_once(once, [] {
    cudaDriverEntryPointQueryResult q;
    cudaGetDriverEntryPointByVersion("cuStreamWaitValue64", reinterpret_cast<void**>(&e.wait), 11070,
                                     cudaEnableDefault, &q);
    cudaGetDriverEntryPointByVersion("cuStreamWriteValue64", reinterpret_cast<void**>(&e.write), 11070,
                                     cudaEnableDefault, &q);
    cudaGetDriverEntryPointByVersion("cuDeviceGetAttribute", reinterpret_cast<void**>(&e.attribute),
                                     2000, cudaEnableDefault, &q);
    cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", reinterpret_cast<void**>(&e.address_range),
                                     3020, cudaEnableDefault, &q);
    cudaGetLastError();
  });
  if (!e.wait || !e.write)
    throw NotSupported("the CUDA driver has no cuStreamWaitValue64/cuStreamWriteValue64");
  return e;
}

void check_driver(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  throw CudaError(std::string(what) + " failed: CUresult " + std::to_string(static_cast<int>(r)),
                  static_cast<int>(r));
}

}  // namespace

void stream_wait_geq(cudaStream_t stream, const volatile uint64_t* flag, uint64_t value) {
  void* dev = nullptr;
  check(cudaHostGetDevicePointer(&dev, const_cast<uint64_t*>(flag), 0), "cudaHostGetDevicePointer");
  check_driver(entry().wait(reinterpret_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(dev), value,
                            CU_STREAM_WAIT_VALUE_GEQ),
               "cuStreamWaitValue64");
}

void stream_write(cudaStream_t stream, volatile uint64_t* flag, uint64_t value) {
  void* dev = nullptr;
  check(cudaHostGetDevicePointer(&dev, const_cast<uint64_t*>(flag), 0), "cudaHostGetDevicePointer");
  check_driver(entry().write(reinterpret_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(dev), value,
                             CU_STREAM_WRITE_VALUE_DEFAULT),
               "cuStreamWriteValue64");
}

bool stream_memops_supported(int device) {
  try {
    const Entry& e = entry();
    int v = 0;
    if (!e.attribute) return false;
    return e.attribute(&v, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, device) == CUDA_SUCCESS && v;
  } catch (const Error&) {
    return false;
  }
}

size_t device_bytes_after(const void* p) noexcept {
  try {
    const Entry& e = entry();
    if (!e.address_range) return 0;
    CUdeviceptr base = 0;
    size_t size = 0;
    if (e.address_range(&base, &size, reinterpret_cast<CUdeviceptr>(p)) != CUDA_SUCCESS) return 0;
    return base + size - reinterpret_cast<CUdeviceptr>(p);
  } catch (const Error&) {
    return 0;
  }
}

}  // namespace ferry::cuda
