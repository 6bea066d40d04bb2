// file_writer.cpp — EngineReads: a save's device->host copies (file_writer.h).
#include "cuda/load/file_writer.h"

#include <cuda_runtime_api.h>

#include "core/error.h"
#include "cuda/cuda_check.h"
#include "cuda/scoped_device.h"

namespace ferry::cuda {
namespace {

// `stream` waits for the work queued on `caller` before now.
void order_after(cudaStream_t stream, cudaStream_t caller) {
  cudaEvent_t ready = nullptr;
  check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
  cudaError_t err = cudaEventRecord(ready, caller);
  if (err == cudaSuccess) err = cudaStreamWaitEvent(stream, ready, 0);
  cudaEventDestroy(ready);  // the wait is enqueued; destroying the event does not undo it
  check(err, "ordering the save after the caller's stream (cudaEventRecord / cudaStreamWaitEvent)");
}

}  // namespace

EngineReads::EngineReads(std::vector<SaveDevice> devices, size_t slots) : pending_(slots) {
  ScopedDevice restore;
  try {
    for (const SaveDevice& d : devices) {
      if (!d.engine) throw InvalidArgument("save: no copy engine for cuda:" + std::to_string(d.device));
      for (const Lane& l : lanes_)
        if (l.device == d.device) throw InvalidArgument("save: cuda:" + std::to_string(d.device) + " listed twice");
      check(cudaSetDevice(d.device), "cudaSetDevice");
      Lane lane{d.device, d.engine, nullptr};
      check(cudaStreamCreateWithFlags(&lane.stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
      lanes_.push_back(lane);
      order_after(lane.stream, d.caller);
    }
  } catch (...) {
    destroy();
    throw;
  }
}

EngineReads::~EngineReads() {
  abort();
  destroy();
}

void EngineReads::destroy() noexcept {
  ScopedDevice restore;
  for (Lane& l : lanes_) {
    if (!l.stream) continue;
    cudaSetDevice(l.device);
    cudaStreamSynchronize(l.stream);
    cudaStreamDestroy(l.stream);
    l.stream = nullptr;
  }
  cudaGetLastError();
}

EngineReads::Lane& EngineReads::lane_of(int device) {
  for (Lane& l : lanes_)
    if (l.device == device) return l;
  throw InvalidArgument("save: a tensor is on cuda:" + std::to_string(device) +
                        ", a device this save was not given (a ferry bug: please report it)");
}

void EngineReads::read(size_t slot, std::span<const load::DeviceCopy> copies) {
  std::vector<Pending>& pending = pending_.at(slot);
  for (const load::DeviceCopy& c : copies) lane_of(c.device);  // every copy has its lane, before any is queued
  for (Lane& lane : lanes_) {
    ops_.clear();
    for (const load::DeviceCopy& c : copies)
      if (c.device == lane.device) ops_.push_back(CopyOp{c.dst, c.src, c.bytes});
    if (!ops_.empty()) pending.push_back(Pending{lane.device, lane.engine->copy_many_async(ops_, lane.stream)});
  }
}

// A writer thread: the copy's device made current first (as the loader's
// wait_slot_free does), so that a thread that never bound a context waits
// on the right one.
void EngineReads::wait(size_t slot) {
  std::vector<Pending>& pending = pending_.at(slot);
  for (Pending& p : pending) {
    check(cudaSetDevice(p.device), "cudaSetDevice");
    p.copy.wait();
  }
  pending.clear();
}

void EngineReads::abort() noexcept {
  ScopedDevice restore;  // the caller's thread: its current device stays
  for (std::vector<Pending>& pending : pending_) {
    for (Pending& p : pending) {
      try {
        cudaSetDevice(p.device);
        p.copy.wait();
      } catch (...) {  // the run's first error is already on its way
      }
    }
    pending.clear();
  }
}

}  // namespace ferry::cuda
