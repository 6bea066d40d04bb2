// engine_impl.h — the copy engine's state (CopyEngine::Impl), shared by the
// files that each hold one of its paths:
//   copy_engine.cpp    creation, the strategy's dispatch, copy_many, stats
//   streamed_copy.cpp  the stream-ordered pipeline (protocol in copy_engine.h)
//   pin_in_place.cpp   pin-in-place and hybrid
//   eager_copy.cpp     the eager staged copy (run_eager_items wraps it)
// and, outside Impl: copy_state.h (a copy's shared state), pointer_checks.h,
// lane_pool.h, placement.h, many_plan.h.
//
// Locking: see copy_engine.h. stats_mu guards stats; every other field is
// set at creation (placement, pools) or guarded by its own class.
#pragma once

#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "copy/plan.h"
#include "copy/staging_plan.h"
#include "copy/strategy.h"
#include "core/error.h"
#include "core/fork.h"
#include "core/worker_pool.h"
#include "cuda/copy/copy_engine.h"
#include "cuda/copy/copy_state.h"
#include "cuda/copy/eager_copy.h"
#include "cuda/copy/lane_pool.h"
#include "cuda/copy/area_pool.h"
#include "cuda/copy/block_copy.h"
#include "cuda/copy/op_buffers.h"
#include "cuda/event_pool.h"

namespace ferry {
class Pool;
}

namespace ferry::cuda {

class PointerLookup;

struct CopyEngine::Impl {
  CopyEngineOptions options;
  int numa_node = -1;    // the host node that serves the device (pool/numa_home.h), -1: none
  Crew* crew = nullptr;  // that node's crew (copy/copy_crew.h), shared with other engines
  std::unique_ptr<Pool> staging;  // pinned pool of the slots and areas, bound to numa_node
  // Stream-ordered workers, one pool per direction: a worker blocks until the
  // GPU reaches a flag, so tasks waiting on one direction's stream never hold
  // up the other direction's. Started on the first stream-ordered copy.
  std::once_flag workers_started;
  std::unique_ptr<WorkerPool> workers[2];
  std::unique_ptr<LanePool> lanes;
  std::unique_ptr<AreaPool> areas;     // eager staged copies
  EventPool events;                    // sync copies wait on one of these
  OpBuffers op_buffers;                // the block-copy kernel's block lists
  // copy_many with no stream: one non-blocking stream per direction, so that
  // two threads (or two async calls) copying opposite ways overlap instead of
  // queueing on the legacy default stream. Made once (side_made), destroyed
  // with the engine.
  std::once_flag side_made;
  cudaStream_t side[2] = {nullptr, nullptr};
  std::unique_ptr<WorkerPool> pinner;  // one thread that unregisters pieces behind their DMA
  mutable std::mutex stats_mu;
  CopyEngineStats stats;  // stats_mu
  const uint64_t generation = fork_generation();  // a forked child refuses it (core/fork.h)

  bool forked() const noexcept { return generation != fork_generation(); }
  void refuse_if_forked() const {
    if (forked()) throw NotSupported(forked_child_message("this ferry copy engine"));
  }
  int worker_count() const;
  WorkerPool& workers_for(Direction d);
  // Chunks of a stream-ordered copy: small copies are cut finer so that every
  // worker has a chunk (64 MiB in 8 MiB chunks kept half the workers idle).
  size_t staged_chunk_bytes(size_t bytes) const;

  // Validates the pair and asks copy/strategy.h's choose_route how it moves.
  Route route(void* dst, const void* src, size_t bytes, Strategy strategy, CallKind call, PointerLookup& lookup);
  // Enqueues one validated copy along `r` (the engine's device current).
  Completion start(void* dst, const void* src, size_t bytes, cudaStream_t stream, const Route& r,
                   PointerLookup& lookup);
  void count(Strategy s, size_t bytes, size_t chunks, size_t pieces, size_t eager);

  // The no-stream copy_many's stream for direction d (made on first use).
  cudaStream_t side_stream(Direction d);
  // The block-copy kernel over `ops` (device views; cut into pieces of at
  // most kBlockPieceBytes) on `stream`: one list in an op buffer, one launch.
  void launch_kernel(std::span<const BlockCopy> ops, cudaStream_t stream);

  // DMAs of pinned memory on `stream`, waited for.
  void dma_and_wait(void* dst, const void* src, size_t n, cudaStream_t stream, PointerLookup& lookup);
  // One eager staged run on an area of its own.
  void run_eager_items(Direction dir, std::span<const EagerItem> items, cudaStream_t stream, bool wait);
  // The stream-ordered pipeline for `pieces` of one copy (each at most one slot).
  void run_streamed(const std::shared_ptr<CopyState>& st, Direction dir, void* dst, const void* src,
                    const std::vector<Piece>& pieces, cudaStream_t caller);
  // Pin-in-place (pinned_share 1) or hybrid.
  void run_pin_in_place(const std::shared_ptr<CopyState>& st, Direction dir, void* dst, const void* src,
                        size_t n, double pinned_share, cudaStream_t caller);
  // Its steps: the parts that go through the pipeline, in chunks (*staged_bytes
  // their sum); one body piece pinned, copied and queued for unpinning.
  std::vector<Piece> staged_chunks_of(PinPlan& plan, double pinned_share, size_t n, size_t* staged_bytes) const;
  bool pin_piece(const std::shared_ptr<CopyState>& st, Direction dir, char* h, char* d, size_t bytes,
                 cudaStream_t caller, const std::shared_ptr<TaskGroup>& unpinned, std::exception_ptr* error);
};

}  // namespace ferry::cuda
