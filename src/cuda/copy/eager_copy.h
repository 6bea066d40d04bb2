// eager_copy.h — the staged copy in which the calling thread issues each DMA
// as soon as its chunk is staged: no GPU stream ever waits for the CPU.
//
//   host->device: the crew and the caller copy pieces of the sources into the
//     area's chunks; once every piece of chunk k is in, the caller enqueues its
//     DMAs on the caller's stream and records the slot's event. A chunk is
//     staged into a slot only once the slot's event is complete.
//   device->host: the caller enqueues the DMAs of chunk k into a free slot and
//     records its event; once the event is complete, the crew and the caller
//     copy the chunk's pieces out (streaming stores). A slot is refilled once
//     every piece of its last chunk is out.
//
// Why: the stream-ordered pipeline (copy_engine.h) makes the GPU wait on CPU
// flags with stream memory operations, which cost ~8 us of GPU time per chunk
// on the H200 machine: small chunks were impossible, and small copies took
// 100+ us. Here the GPU only runs DMAs back to back, chunks are 2 MiB, pieces
// are sized to the copy, and the area stays in the CPU's caches. Because
// nothing on the GPU waits for a CPU thread, a device-synchronizing call in
// another thread (cudaFree) can never deadlock against it.
//
// The cost: the caller's thread drives the copy until its last DMA is
// enqueued, so an async host->device copy returns once its sources are staged
// (they may then be reused at once), and a device->host copy returns only when
// done: the engine uses the stream-ordered pipeline for async device->host.
//
// CUDA calls come from the calling thread only; crew threads only copy bytes.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <span>

#include "copy/strategy.h"

namespace ferry {
class Crew;
}

namespace ferry::cuda {

class StagingArea;

struct EagerItem {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
};

// Moves `items` (all in direction `dir`, host side pageable or any host
// memory) through `area`, DMAs on `stream`. Waits for the last DMA when `wait`
// (always for device->host). Returns true when DMAs may still be in flight.
// On error (a CUDA call failed, an injected fault) throws once no crew thread
// touches the items any more; the destination is then undefined.
// Preconditions: the engine's device is current; items are validated.
bool run_eager(Direction dir, std::span<const EagerItem> items, StagingArea& area, Crew& crew,
               cudaStream_t stream, bool wait);

}  // namespace ferry::cuda
