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

PFN_cuPointerGetAttributes_v7000 driver_pointer_attributes() {
  static const PFN_cuPointerGetAttributes_v7000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    check(cudaGetDriverEntryPointByVersion("cuPointerGetAttributes", &f, 7000, cudaEnableDefault,
                                           &found),
          "cudaGetDriverEntryPointByVersion(cuPointerGetAttributes)");
    if (found != cudaDriverEntryPointSuccess || !f)
      throw CudaError("the CUDA driver has no cuPointerGetAttributes", cudaErrorNotSupported);
    return reinterpret_cast<PFN_cuPointerGetAttributes_v7000>(f);
  }();
  return fn;
}

}  // namespace ferry::cuda
