// copy_engine.h — copies between any host memory (pageable or pinned) and
// device memory, in both directions, at close to the pinned DMA rate.
//
// One call picks a strategy (copy/strategy.h) and enqueues the WHOLE copy on
// the engine's lane stream before it returns, so the caller's stream can be
// ordered after it with an ordinary event:
//
//   staged H2D, chunk i (slot s = gen % slots):
//     worker:  wait done[s] >= gen - slots (the slot's previous DMA ended),
//              memcpy user -> slot, release-store ready[s] = gen
//     stream:  wait ready[s] >= gen; DMA slot -> device; write done[s] = gen
//   staged D2H, chunk i:
//     stream:  wait drained[s] >= gen - slots; DMA device -> slot; write filled[s] = gen
//     worker:  wait filled[s] >= gen; memcpy slot -> user; release-store drained[s] = gen
//   then:      stream waits until every chunk of this copy is drained,
//              records the copy's event; the caller's stream waits on it.
//
// Pin-in-place (and the pinned share of hybrid) registers pieces in the calling
// thread, so that call returns once every piece is registered and its DMA
// enqueued; the engine's pinner thread unregisters pieces behind their DMAs. No
// GPU stream waits on a flag set after a cudaHostUnregister, which waits for
// the device's outstanding work (a deadlock otherwise).
//
// Flags live in mapped pinned memory; the GPU reads and writes them with stream
// memory operations, the CPU with acquire loads and release stores only (the
// GPU has no host-native atomics). Generations grow forever per lane, so a lane
// is shared safely by consecutive copies.
//
// Async contract for pageable memory: the engine's threads read the source
// (H2D) or write the destination (D2H) after copy_async returns; the caller
// may touch that host memory again once the Completion is done (wait() returned
// or query() is true). Device memory follows stream order on the caller's stream.
//
// Errors: bad pointers, size 0, overlap and host<->host are refused before any
// work is enqueued. A failure mid-copy (a CUDA error, an injected fault) aborts
// the copy: its pending flags are released so that no stream and no worker
// stays blocked, and wait() throws the first error. The destination is then
// undefined.
//
// Locking: each lane's mutex is held while one copy's stream operations are
// enqueued (so generations are in stream order); no lock is held while waiting.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "copy/strategy.h"

typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;

namespace ferry::cuda {

struct CopyOp {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
};

struct CopyState;  // shared between the caller's Completion and the engine's workers

// The handle of one (async) copy or batch.
class Completion {
 public:
  Completion() = default;
  explicit Completion(std::shared_ptr<CopyState> state) : state_(std::move(state)) {}
  void wait();                  // blocks; throws the copy's first error
  bool query();                 // true when done (throws its error if it failed)
  cudaEvent_t event() const;    // recorded when the copy is done (GPU side and host side)
  Strategy strategy() const;    // for a batch: the strategy of its largest op
  size_t bytes() const;
  double seconds() const;       // call to completion, once done
  bool valid() const noexcept { return state_ != nullptr; }

 private:
  std::shared_ptr<CopyState> state_;
};

struct CopyEngineOptions {
  int device = 0;
  MachineProfile profile = MachineProfile::defaults();
  Strategy strategy = Strategy::automatic;  // default for calls that ask for automatic
  int workers = 0;                          // 0: profile.workers, else cores (<= 16)
  // Read FERRY_COPY_STRATEGY, FERRY_COPY_WORKERS and the profile file.
  static CopyEngineOptions from_environment(int device);
};

struct CopyEngineStats {
  uint64_t copies = 0, bytes = 0;
  uint64_t by_strategy[kStrategyCount] = {};  // copies, indexed by Strategy
  uint64_t chunks = 0;
  uint64_t pinned_pieces = 0;    // pin-in-place registrations
};

class CopyEngine {
 public:
  explicit CopyEngine(CopyEngineOptions options);
  ~CopyEngine();  // waits for every copy in flight
  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;

  // Any pair of host (pageable or pinned) and device pointers. stream may be
  // nullptr (the legacy default stream).
  Completion copy_async(void* dst, const void* src, size_t bytes, cudaStream_t stream,
                        Strategy strategy = Strategy::automatic);
  void copy(void* dst, const void* src, size_t bytes, Strategy strategy = Strategy::automatic);

  // Many copies in one call; pinned<->device ops go to the copy engines as one
  // cudaMemcpyBatchAsync (or, with Strategy::sm, to a copy kernel on a few
  // SMs), pageable ones through copy_async's strategies.
  Completion copy_batch_async(std::span<const CopyOp> ops, cudaStream_t stream,
                              Strategy strategy = Strategy::automatic);

  // Creates the lanes and staging memory now (else on first use).
  void warm_up();

  // The strategy copy_async would pick for this call (for tests, `ferry bench`).
  Strategy plan(void* dst, const void* src, size_t bytes, Strategy strategy = Strategy::automatic);

  CopyEngineStats stats() const;
  const CopyEngineOptions& options() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::cuda
