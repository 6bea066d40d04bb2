// file_writer.h — the CUDA side of a save (load/save_file.h): device bytes
// into the ring's pinned slots through the process's copy engines
// (cuda/copy/copy_engine.h), the read direction's twin of file_loader.h's
// DeviceTarget. load/layout_source.h stays CUDA-free: it hands each slot's
// device->host copies to this DeviceReads.
//
// Ordering: one stream per device, made for the save; at its start it waits
// for the work queued on the caller's stream of that device (torch's current
// stream: the save reads what was queued before the call). A slot's copies
// are one copy_many_async on that stream (pinned destinations: DMAs, no
// staging); the slot's writer waits for their Completions before writing.
// Copies of later slots queue behind while the disk writes earlier ones.
//
// Ownership: the engines are the process's (never destroyed); the streams
// are this object's, synchronized and destroyed by its destructor, which also
// waits for any copy still queued (a failed save). No Python here.
//
// Locking: none. read() on the run's thread; wait(slot) on the slot's writer
// after the pipeline's queue handed the slot over (pending_[slot] is touched
// by one thread at a time, in that order); abort() after every writer returned.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "cuda/copy/copy_engine.h"
#include "load/layout_source.h"

namespace ferry::cuda {

struct SaveDevice {
  int device = -1;
  CopyEngine* engine = nullptr;    // the process's engine for `device`
  cudaStream_t caller = nullptr;   // the caller's stream (nullptr: the legacy default stream)
};

class EngineReads final : public load::DeviceReads {
 public:
  // Makes the streams and orders each after its caller's stream. NoDevice /
  // CudaError / InvalidArgument (a device listed twice, no engine).
  EngineReads(std::vector<SaveDevice> devices, size_t slots);
  ~EngineReads() override;
  EngineReads(const EngineReads&) = delete;
  EngineReads& operator=(const EngineReads&) = delete;

  void read(size_t slot, std::span<const load::DeviceCopy> copies) override;
  void wait(size_t slot) override;
  void abort() noexcept override;

 private:
  struct Lane {
    int device = -1;
    CopyEngine* engine = nullptr;
    cudaStream_t stream = nullptr;  // ours
  };
  Lane& lane_of(int device);
  void destroy() noexcept;

  std::vector<Lane> lanes_;
  struct Pending {
    int device;
    Completion copy;
  };
  std::vector<std::vector<Pending>> pending_;  // per slot: its queued copies
  std::vector<CopyOp> ops_;                       // read()'s scratch
};

}  // namespace ferry::cuda
