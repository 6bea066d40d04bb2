// file_loader.h — byte ranges of files (safetensors tensors, or anything) to
// device memory: load/pipeline.h's reader threads and slot ring with a
// DeviceTarget that DMAs each filled slot on the loader's own stream (the
// slot's event fences its reuse).
//
// From the page cache, the path costs a host memcpy per byte (pread copies
// into the slot), bounded by the host's memcpy rate (about 40 GB/s on the
// H200 machine's 16 cores), below the link (55). (DMA straight from
// registered page-cache pages, the "mapped share", was slower at every share
// measured and was removed: issue 24 item 8.)
//
// Host memory: the pinned slots (staging_bytes, allocated once per Loader and
// reused). Never a copy of a file.
//
// Placement follows the copy engine's rules (cuda/copy/copy_engine.h): the
// GPU's host node is numa_home() of its PCI address (pool/numa_home.h); on a
// host with several nodes the slots are bound to that node (make_pinned_pool)
// and the reader threads to its usable CPUs (host_crew_cpus(),
// copy/copy_crew.h), so that pread's copy lands in local memory. The readers
// are the loader's own threads, not the copy crew: they block in pread.
// Threads by default: one per usable core (os::usable_cores(), or the node's
// CPUs), at most kDefaultThreadCap.
//
// The slots are a staging area (cuda/staging_area.h), the same ring of pinned
// slots with an event each that the copy engine lends to its eager copies;
// here the events are cudaEventBlockingSync (SlotWait::sleep): a reader waiting
// for a slot sleeps, since spinning would take the cores pread needs. The ring
// is one allocation of its own pinned pool, on the GPU's node.
//
// A load is synchronous: it returns when every byte is in device memory. It
// starts after the work queued on `stream` before the call (the destinations
// may be memory that stream was still using). One load at a time per Loader
// (a second concurrent call gets InvalidArgument); use one Loader per thread.
//
// Errors: the first failure (short read, read error, CUDA error) fails the
// whole load with a message naming the file and the byte range; by then no
// worker is busy and every DMA has ended. The destinations' contents are
// then undefined.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/thread_counts.h"  // kDefaultThreadCap, the engine's too
#include "load/pipeline.h"
#include "load/read_plan.h"

typedef struct CUstream_st* cudaStream_t;

namespace ferry {
class Options;
}

namespace ferry::cuda {

enum class Progress { automatic, always, never };  // automatic: when stderr is a terminal

struct LoaderOptions {
  int device = 0;
  size_t staging_bytes = size_t{512} << 20;  // pinned slots in all; at most 1 GiB by default
  size_t slot_bytes = size_t{16} << 20;      // one read; a multiple of 4 KiB
  int threads = 0;                           // reader threads; 0 = one per usable core, at most kDefaultThreadCap
  load::DirectIo direct_io = load::DirectIo::automatic;
  Progress progress = Progress::automatic;

  // FERRY_LOAD_STAGING, FERRY_LOAD_SLOT, FERRY_LOAD_THREADS, FERRY_LOAD_DIRECT_IO.
  // Throws InvalidArgument.
  static LoaderOptions from_environment(int device);
  static LoaderOptions from_options(const Options& options, int device);  // pure
};

struct LoadStats : load::PipelineStats {
  size_t staging_bytes = 0;        // pinned slots the loader holds
  int numa_node = -1;              // the GPU's host node the slots and readers are on; -1: no placement
  int threads = 0;
};

class Loader {
 public:
  explicit Loader(LoaderOptions options);  // allocates and pins the slots; NoDevice without a GPU
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // ranges[i].file indexes `files`; ranges[i].dst is device memory of any
  // device (cudaMemcpyHostToDevice copies). stream: see the header comment
  // (may be nullptr, the legacy default stream).
  LoadStats load(std::span<const std::string> files, std::span<const load::FileRange> ranges,
                 cudaStream_t stream = nullptr);

  const LoaderOptions& options() const noexcept { return options_; }

  struct Impl;

 private:
  LoaderOptions options_;
  std::unique_ptr<Impl> impl_;
  std::atomic<bool> busy_{false};
};

}  // namespace ferry::cuda
