// copy_engine.h — copies between any host memory (pageable or pinned) and
// device memory, in both directions, at close to the pinned DMA rate, one
// buffer or many per call.
//
// Paths (copy/strategy.h's choose_route picks one per item, in one place;
// copy_engine.cpp dispatches, engine_impl.h lists the files of each path):
//   direct   pinned host memory (or device<->device): DMAs on the caller's stream.
//   staged, eager (cuda/copy/eager_copy.h): synchronous copies, and async
//            host->device copies below profile.eager_async_below_bytes. The
//            caller's thread stages chunks (with the crew, copy/copy_crew.h)
//            and issues each chunk's DMA on the caller's stream once it is
//            staged; no GPU stream waits for a CPU thread.
//   staged, stream-ordered: other async copies. The WHOLE copy is enqueued on a
//            lane stream before the call returns, so the caller's stream is
//            ordered after it with an ordinary event; CPU workers and the GPU
//            hand off chunks through flags in mapped memory:
//
//   H2D, chunk i (slot s = gen % slots):
//     worker:  wait done[s] >= gen - slots (the slot's previous DMA ended),
//              memcpy user -> slot, release-store ready[s] = gen
//     stream:  wait ready[s] >= gen; DMA slot -> device; write done[s] = gen
//   D2H, chunk i:
//     stream:  wait drained[s] >= gen - slots; DMA device -> slot; write filled[s] = gen
//     worker:  wait filled[s] >= gen; memcpy slot -> user; release-store drained[s] = gen
//   then:      stream waits until every chunk of this copy is drained,
//              records the copy's event; the caller's stream waits on it.
//
//            Flags live in mapped pinned memory; the GPU reads and writes them
//            with stream memory operations, the CPU with acquire loads and
//            release stores only. Generations grow forever per lane.
//   pin-in-place (and the pinned share of hybrid): the calling thread registers
//            pieces, each DMA enqueued as soon as its piece is pinned; the
//            pinner thread unregisters pieces behind their DMAs.
//
// Rules the paths keep (each broke once on the H200):
//   - Submit a piece's worker task BEFORE any stream operation waits on its
//     flag. Otherwise a device-synchronizing call in another thread (cudaFree)
//     takes the driver's lock and waits for the stream, the stream waits for
//     the task, and the thread that would submit it waits for the lock.
//   - No GPU stream waits on a flag set after a cudaHostUnregister, which waits
//     for the device's outstanding work.
//   - No CUDA call while holding an engine mutex that a CUDA call's completion
//     could need (see Locking).
//
// Async contract for pageable memory: an eager host->device copy has read its
// sources when the call returns; otherwise the engine's threads read the
// source (H2D) or write the destination (D2H) after copy_async returns, and the
// caller may touch that host memory again once the Completion is done.
// Device memory follows stream order on the caller's stream. A synchronous
// copy() runs on `stream` (default: the legacy default stream, like
// cudaMemcpy) and returns when the bytes are in place.
//
// Errors: bad pointers, size 0, overlap, host<->host and device memory of
// another device are refused before any work is enqueued (a batch names the
// item). A failure mid-copy (a CUDA error, an injected fault) aborts the copy:
// its pending flags are released so that no stream and no worker stays
// blocked, and wait() throws the first error. The destination is then undefined.
//
// No call leaves the caller's current device changed.
//
// Locking (each mutex a leaf: none is held while another is taken, and no
// CUDA call runs under any of them, PyTorch's rule; the H200 hangs came from
// a CUDA call under an engine lock):
//   Lender::mu_      (core/lender.h) one per LanePool direction and one per
//                    AreaPool: which lanes or staging areas are free, how
//                    many are made, and each area's `pending`. Lanes and
//                    areas are made (CUDA calls) outside it; a lane or area is
//                    then lent to one copy at a time, so a lane's next_gen and
//                    the order of its stream operations belong to the holder
//                    and need no lock while it enqueues.
//   CopyState::mu    (copy_state.h) one copy's first error. `abort` is an
//                    atomic; `parts` is written by the thread that builds the
//                    copy before the Completion is returned.
//   Impl::stats_mu   stats (counters only; engine_impl.h).
//   Impl::workers_started (a once_flag) starts the stream-ordered workers.
//   EventPool::mu_ (event_pool.h), Crew::mu_, WorkerPool's State::mu,
//   TaskGroup::mu_ (src/core): their own fields.
// Pin-in-place takes no engine lock: the calling thread registers its pieces
// and the pinner thread (one per engine) unregisters them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "copy/strategy.h"

typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;

namespace ferry {
class Crew;
}

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
  int workers = 0;                          // 0: profile.workers, else cores (<= kDefaultThreadCap)
  // Read FERRY_COPY_STRATEGY, FERRY_COPY_WORKERS and the profile file.
  static CopyEngineOptions from_environment(int device);
};

struct CopyEngineStats {
  uint64_t copies = 0, bytes = 0;
  uint64_t by_strategy[kStrategyCount] = {};  // copies, indexed by Strategy
  uint64_t chunks = 0;           // stream-ordered chunks
  uint64_t pinned_pieces = 0;    // pin-in-place registrations
  uint64_t eager_runs = 0;       // eager staged runs (one per call)
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
  // Returns when the bytes are in place; ordered on `stream` like an async copy.
  // Arguments in copy_async's order (every copy call: what, then where it is
  // ordered, then how).
  void copy(void* dst, const void* src, size_t bytes, cudaStream_t stream = nullptr,
            Strategy strategy = Strategy::automatic);

  // Many items in one call, any mix of pageable, registered and pinned host
  // memory with device memory, both directions: pinned items go to the copy
  // engines as one cudaMemcpyBatchAsync (small ones, averaging below
  // profile.batch_sm_below_bytes, to a copy kernel on a few SMs), pageable
  // items through ONE eager staged run (item i+1 is staged while item i moves;
  // small items share chunks). An async call returns once the host->device
  // sources are staged; device->host items of an async call take the
  // stream-ordered pipeline, one copy each. Errors name the item's index.
  // Pinned<->device items are checked by allocation range and merged where
  // both sides continue the previous item (many_plan.h). stream == nullptr:
  // the engine's stream for the call's direction, after the work queued on
  // the legacy stream before the call; nothing later waits for it but the
  // Completion (see impl_copy_many). cudaStreamLegacy is the legacy stream
  // itself (later work there waits for the copy): Python passes it where a
  // stream was named, torch's default stream included.
  Completion copy_many_async(std::span<const CopyOp> ops, cudaStream_t stream,
                             Strategy strategy = Strategy::automatic);
  void copy_many(std::span<const CopyOp> ops, cudaStream_t stream = nullptr,
                 Strategy strategy = Strategy::automatic);

  // Creates the lanes and staging memory now (else on first use).
  void warm_up();

  // The strategy copy_async would pick for this call (for tests, `ferry bench`).
  Strategy plan(void* dst, const void* src, size_t bytes, Strategy strategy = Strategy::automatic);

  CopyEngineStats stats() const;
  const CopyEngineOptions& options() const;
  // Where the engine serves its device from, fixed at creation: the host NUMA
  // node (pool/numa_home.h; -1 on a one-node host or when unknown) and the
  // crew of that node (copy/copy_crew.h) its staged copies run on.
  int numa_node() const;
  const Crew& crew() const;

  struct Impl;

 private:
  Completion impl_copy_many(std::span<const CopyOp> ops, cudaStream_t stream, Strategy strategy, bool wait);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::cuda
