// driver_entry.h — driver calls the CUDA runtime does not wrap
// (cuStreamWaitValue64, cuStreamWriteValue64, cuPointerGetAttributes): fetched once with cudaGetDriverEntryPointByVersion so
// that libferry never links libcuda directly (it must load without a driver).
//
// The copy engine uses them to enqueue a whole pipelined copy at call time: the
// GPU waits on flags in mapped pinned memory that CPU workers release as each
// staging slot is filled, and writes flags back as each DMA ends.
// PointerLookup and the channel classify pointers with cuPointerGetAttributes.
#pragma once

#include <cuda_runtime_api.h>
#include <cudaTypedefs.h>

#include <cstdint>

namespace ferry::cuda {

// Blocks `stream` until (int64_t)(*flag - value) >= 0. flag: mapped host memory.
void stream_wait_geq(cudaStream_t stream, const volatile uint64_t* flag, uint64_t value);
// Writes `value` to *flag once all earlier work of `stream` is done (with a
// system-scope fence before the write).
void stream_write(cudaStream_t stream, volatile uint64_t* flag, uint64_t value);

// True when the device supports 64-bit stream memory operations.
bool stream_memops_supported(int device);

// cuPointerGetAttributes (several attributes in one call; the runtime's
// cudaPointerGetAttributes answers fewer). Throws CudaError if the driver lacks it.
PFN_cuPointerGetAttributes_v7000 driver_pointer_attributes();

}  // namespace ferry::cuda
