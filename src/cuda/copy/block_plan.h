// block_plan.h — a fixed set of block copies made once and launched many
// times: the SM kernel's CUDA-graph-capturable form. copy_many's block list
// lives in an op buffer that is reused once its launch has run, so a graph
// that captured it would replay whatever list came next; a plan owns its
// list, in device memory, for its whole life, and launch() is one kernel
// launch and nothing else (no event, no host wait, no allocation), which a
// stream capture records as one kernel node.
//
// The blocks must stay where they are (same addresses, still allocated and
// pinned) as long as the plan or a graph that captured its launch may run;
// their contents may change between launches (that is the point: a KV
// connector's per-step copies between fixed buffers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "cuda/copy/copy_engine.h"

typedef struct CUstream_st* cudaStream_t;

namespace ferry::cuda {

struct BlockCopy;

class BlockPlan {
 public:
  // Checks every op as copy_many does (errors name "item i of n") and refuses
  // any that is not pinned host memory <-> device memory of the engine's
  // device. max_sms: SMs the kernel may use (0: the engine's profile, else its
  // default). Throws InvalidArgument, CudaError, OutOfMemory.
  BlockPlan(CopyEngine& engine, std::span<const CopyOp> ops, int max_sms = 0);
  ~BlockPlan();  // frees the list; precondition: no launch of it is pending
  BlockPlan(const BlockPlan&) = delete;
  BlockPlan& operator=(const BlockPlan&) = delete;

  // Enqueues the copies on `stream` (nullptr: the legacy stream, which a
  // capture cannot record). Makes the plan's device current for the launch
  // and restores the caller's. Refused in a forked child (NotSupported).
  void launch(cudaStream_t stream) const;

  size_t items() const noexcept { return items_; }    // ops given
  size_t pieces() const noexcept { return pieces_; }  // kernel ops after merging and cutting
  size_t bytes() const noexcept { return bytes_; }

 private:
  int device_ = 0;
  int max_sms_ = 0;
  size_t launch_bytes_ = 0;  // MachineProfile::batch_sm_launch_bytes at creation
  uint64_t generation_ = 0;   // fork_generation() at creation: a forked child makes no CUDA call with it
  BlockCopy* ops_ = nullptr;  // device memory: pieces_ ops
  size_t items_ = 0, pieces_ = 0, bytes_ = 0;
};

}  // namespace ferry::cuda
