// block_copy.h — copies of many small blocks between pinned host memory and
// device memory done by a few SMs instead of the copy engines: each thread
// block takes whole blocks and moves them with 16-byte loads and stores
// through the host memory's device mapping. For the KV-cache pattern (1024
// blocks of 16-256 KiB scattered on both sides), where per-copy DMA setup
// costs more than the bytes.
#pragma once

#include <cstddef>

typedef struct CUstream_st* cudaStream_t;

namespace ferry::cuda {

struct BlockCopy {
  void* dst;        // device pointer, or a pinned host pointer's device mapping
  const void* src;  // likewise
  size_t bytes;
};

// Enqueues all copies on `stream` using at most `max_sms` thread blocks
// (0 = 16). Preconditions: every pointer is device-accessible (device memory,
// or pinned host memory with canUseHostPointerForRegisteredMem / its device
// pointer); ranges do not overlap. Launches in groups that fit the 32 KiB
// kernel parameter space. Throws CudaError on a launch failure.
void launch_block_copies(const BlockCopy* copies, size_t count, cudaStream_t stream, int max_sms = 0);

}  // namespace ferry::cuda
