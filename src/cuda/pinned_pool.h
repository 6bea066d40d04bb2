// pinned_pool.h — a Pool whose chunks are registered (pinned) with the CUDA
// driver once, with ONE cudaHostRegister each, started while the chunk is
// still being first-touched (pool.h, register_lead_bytes); allocations are
// then pinned at no further driver call, and each lies inside one
// registration (PyTorch's non_blocking copies fail over a range that spans
// two: docs/findings.md).
//
// Chunks are 2 MiB aligned and sized in whole 2 MiB (or 1 GiB) pages, so a
// registration never covers part of a huge page (a partial pin makes the kernel
// split it). Trim and destroy unregister before unmapping (ChunkHooks).
#pragma once

#include <memory>

#include "pool/pool.h"

namespace ferry::cuda {

// Throws NoDevice / InvalidArgument when `device` is not usable. With
// options.numa_node == -1 the chunks are bound to the GPU's host NUMA node on
// a host with several nodes (pool/numa_home.h).
std::unique_ptr<Pool> make_pinned_pool(PoolOptions options, int device);

}  // namespace ferry::cuda
