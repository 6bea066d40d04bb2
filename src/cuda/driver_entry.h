// driver_entry.h — driver calls the CUDA runtime does not wrap
// (cuStreamWaitValue64, cuStreamWriteValue64, cuMemGetAddressRange): fetched once with cudaGetDriverEntryPointByVersion so
// that libferry never links libcuda directly (it must load without a driver).
//
// The copy engine uses them to enqueue a whole pipelined copy at call time: the
// GPU waits on flags in mapped pinned memory that CPU workers release as each
// staging slot is filled, and writes flags back as each DMA ends.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ferry::cuda {

// Blocks `stream` until (int64_t)(*flag - value) >= 0. flag: mapped host memory.
void stream_wait_geq(cudaStream_t stream, const volatile uint64_t* flag, uint64_t value);
// Writes `value` to *flag once all earlier work of `stream` is done (with a
// system-scope fence before the write).
void stream_write(cudaStream_t stream, volatile uint64_t* flag, uint64_t value);

// True when the device supports 64-bit stream memory operations.
bool stream_memops_supported(int device);

// Bytes of the device allocation that contains p, from p to its end; 0 when p
// is not in a device allocation (cuMemGetAddressRange).
size_t device_bytes_after(const void* p) noexcept;

}  // namespace ferry::cuda
