// file_loader.h — byte ranges of files (safetensors tensors, or anything) to
// device memory: load/pipeline.h's reader threads and slot ring with a
// DeviceTarget that DMAs each filled slot on the loader's own stream (an event
// per slot fences its reuse) and, for the mapped share, registers the file's
// page-cache pages read-only (cudaHostRegisterReadOnly) and DMAs straight from
// them on a second stream.
//
// Why the mapped share: from the page cache, the staged path costs a host
// memcpy per byte (pread copies into the slot), bounded by the host's memcpy
// rate (about 40 GB/s on the H200 machine's 16 cores), below the link (55).
// DMA from registered file pages costs no memcpy, only the registration (page
// walks in the driver, serialized). Both run at once; the split is a
// parameter (mapped_share) until measurements pick a default.
//
// Host memory: the pinned slots (staging_bytes, allocated once per Loader and
// reused), plus at most mapped_inflight_bytes of registered page-cache pages
// (already resident: pinning adds none). Never a copy of a file.
//
// A load is synchronous: it returns when every byte is in device memory. It
// starts after the work queued on `stream` before the call (the destinations
// may be memory that stream was still using). One load at a time per Loader
// (a second concurrent call gets InvalidArgument); use one Loader per thread.
//
// Errors: the first failure (short read, read error, CUDA error) fails the
// whole load with a message naming the file and the byte range; by then no
// worker is busy, every DMA has ended and nothing is registered. The
// destinations' contents are then undefined.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

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
  int threads = 0;                           // reader threads; 0 = one per core, at most 16
  load::DirectIo direct_io = load::DirectIo::automatic;
  double mapped_share = 0.0;                 // experimental: 0..1 of page-cache bytes DMA'd from registered mappings
  size_t mapped_inflight_bytes = size_t{1} << 30;  // registered file pages held at once
  Progress progress = Progress::automatic;

  // FERRY_LOAD_STAGING, FERRY_LOAD_SLOT, FERRY_LOAD_THREADS, FERRY_LOAD_DIRECT_IO,
  // FERRY_LOAD_MAPPED_PERCENT. Throws InvalidArgument.
  static LoaderOptions from_environment(int device);
  static LoaderOptions from_options(const Options& options, int device);  // pure
};

struct LoadStats : load::PipelineStats {
  uint64_t registrations = 0;      // mapped regions registered
  double register_seconds = 0;     // in cudaHostRegister (mapped path)
  double unregister_seconds = 0;   // in cudaHostUnregister
  size_t staging_bytes = 0;        // pinned slots the loader holds
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
