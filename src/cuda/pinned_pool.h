// pinned_pool.h — a Pool whose chunks are registered (pinned) with the CUDA
// driver once, right after they are touched; allocations are then pinned at no
// further driver call.
//
// Chunks are 2 MiB aligned and sized in whole 2 MiB (or 1 GiB) pages, so a
// registration never covers part of a huge page (a partial pin makes the kernel
// split it). Trim and destroy unregister before unmapping (ChunkHooks).
#pragma once

#include <memory>

#include "pool/pool.h"

namespace ferry::cuda {

// Throws NoDevice / InvalidArgument when `device` is not usable. With
// options.numa_node == -1 the chunks are bound to the GPU's NUMA node when the
// driver reports one.
std::unique_ptr<Pool> make_pinned_pool(PoolOptions options, int device);

}  // namespace ferry::cuda
