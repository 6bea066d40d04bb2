// pin_in_place.cpp — pin-in-place and hybrid copies (see run_pin_in_place).
// No engine lock is taken: the calling thread registers pieces and enqueues
// their DMAs, the engine's pinner thread unregisters them behind the DMAs.
#include <cuda_runtime_api.h>

#include "copy/plan.h"
#include "core/fault.h"
#include "cuda/copy/engine_impl.h"
#include "cuda/cuda_check.h"

namespace ferry::cuda {

// Pin-in-place: the calling thread registers the aligned body of the host
// buffer piece by piece, each DMA enqueued on the caller's stream as soon as
// its piece is pinned (registration of piece i+1 overlaps the DMA of piece i),
// and the engine's pinner thread unregisters each piece once its DMA ended.
// Head, tail and the share of the body not pinned go through the
// stream-ordered pipeline at the same time, as a part of this copy with its
// own event. The copy's event is recorded on the caller's stream after the
// last pinned DMA and the staged part's event.
void CopyEngine::Impl::run_pin_in_place(const std::shared_ptr<CopyState>& st, Direction dir, void* dst,
                                        const void* src, size_t n, double pinned_share, cudaStream_t caller) {
  const void* host = dir == Direction::h2d ? src : dst;
  PinPlan plan = plan_pin_in_place(reinterpret_cast<uintptr_t>(host), n, options.profile.pin_piece_bytes);
  size_t staged_bytes = 0;
  const std::vector<Piece> staged_chunks = staged_chunks_of(plan, pinned_share, n, &staged_bytes);
  if (plan.body.empty()) {
    run_streamed(st, dir, dst, src, staged_chunks, caller);
    return;
  }
  std::shared_ptr<CopyState> staged_part;
  if (!staged_chunks.empty()) {
    staged_part = begin_copy(Strategy::staged, staged_bytes);
    run_streamed(staged_part, dir, dst, src, staged_chunks, caller);
    st->parts.push_back(Completion(staged_part));
  }

  auto unpinned = std::make_shared<TaskGroup>();  // this copy's unregister jobs, for the error path
  std::exception_ptr error;
  size_t pieces = 0;
  for (const Piece& piece : plan.body) {
    char* h = const_cast<char*>(static_cast<const char*>(host)) + piece.offset;
    char* d = dir == Direction::h2d ? static_cast<char*>(dst) + piece.offset
                                    : const_cast<char*>(static_cast<const char*>(src)) + piece.offset;
    if (!pin_piece(st, dir, h, d, piece.bytes, caller, unpinned, &error)) break;
    ++pieces;
    if (error) break;
  }
  {
    std::lock_guard s_lock(stats_mu);
    stats.pinned_pieces += pieces;
  }
  cudaError_t err = staged_part ? cudaStreamWaitEvent(caller, staged_part->done, 0) : cudaSuccess;
  if (err == cudaSuccess) err = cudaEventRecord(st->done, caller);
  if (!error && err != cudaSuccess) {
    try {
      check(err, "cudaEventRecord (pin in place)");
    } catch (...) {
      error = std::current_exception();
    }
  }
  if (error) {
    unpinned->wait();  // no page of the buffer stays registered when this throws
    st->fail(error);
    std::rethrow_exception(error);
  }
}

// Head, the share of the body the hybrid leaves unpinned (moved out of
// plan.body) and tail, each cut into the stream-ordered pipeline's chunks.
std::vector<Piece> CopyEngine::Impl::staged_chunks_of(PinPlan& plan, double pinned_share, size_t n,
                                                      size_t* staged_bytes) const {
  std::vector<Piece> staged;
  if (plan.head.bytes) staged.push_back(plan.head);
  split_hybrid(plan, pinned_share, staged);
  if (plan.tail.bytes) staged.push_back(plan.tail);
  std::vector<Piece> staged_chunks;
  for (const Piece& p : staged) {
    *staged_bytes += p.bytes;
    for (const Piece& c : split_even(p.bytes, staged_chunk_bytes(n)))
      staged_chunks.push_back({p.offset + c.offset, c.bytes});
  }
  return staged_chunks;
}

// One body piece: registered, its DMA enqueued on the caller's stream, its
// unregister queued on the pinner thread behind the DMA. False when the
// registration failed (nothing enqueued); *error holds the failure, also a
// failed DMA enqueue after which the piece is still unregistered.
bool CopyEngine::Impl::pin_piece(const std::shared_ptr<CopyState>& st, Direction dir, char* h, char* d,
                                 size_t bytes, cudaStream_t caller, const std::shared_ptr<TaskGroup>& unpinned,
                                 std::exception_ptr* error) {
  try {
    if (fault_injected(FaultPoint::register_host))
      throw CudaError("cudaHostRegister (pin in place) failed: injected fault (FERRY_FAULT_INJECT)",
                      cudaErrorMemoryAllocation);
    check(cudaHostRegister(h, bytes, cudaHostRegisterDefault), "cudaHostRegister (pin in place)");
  } catch (...) {
    *error = std::current_exception();
    return false;
  }
  cudaEvent_t dma_done = nullptr;
  cudaError_t err = cudaEventCreateWithFlags(&dma_done, cudaEventDisableTiming);
  if (err == cudaSuccess)
    err = dir == Direction::h2d ? cudaMemcpyAsync(d, h, bytes, cudaMemcpyDefault, caller)
                                : cudaMemcpyAsync(h, d, bytes, cudaMemcpyDefault, caller);
  if (err == cudaSuccess) err = cudaEventRecord(dma_done, caller);
  if (err != cudaSuccess) {
    try {
      check(err, "cudaMemcpyAsync (pinned in place)");
    } catch (...) {
      *error = std::current_exception();
    }
  }
  // Unpin behind the DMA, on the pinner thread.
  unpinned->add(1);
  st->host_tasks.add(1);
  pinner->submit([device = options.device, st, h, dma_done, unpinned] {
    cudaSetDevice(device);  // the pinner thread's own device: it serves this engine only
    if (dma_done) {
      cudaEventSynchronize(dma_done);
      cudaEventDestroy(dma_done);
    }
    cudaHostUnregister(h);
    cudaGetLastError();
    st->host_tasks.done();
    unpinned->done();
  });
  return true;
}

}  // namespace ferry::cuda
