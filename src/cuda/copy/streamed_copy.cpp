// streamed_copy.cpp — the stream-ordered pipeline (its protocol is in
// copy_engine.h): the whole copy is enqueued on a lane's stream before the
// call returns, and worker threads hand chunks to the GPU through flags in
// mapped pinned memory. Also the workers it runs on and its chunk size.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "copy/host_copy.h"
#include "core/cpu_relax.h"
#include "core/crew.h"
#include "core/fault.h"
#include "core/thread_affinity.h"
#include "cuda/copy/engine_impl.h"
#include "cuda/copy/placement.h"
#include "cuda/cuda_check.h"
#include "cuda/driver_entry.h"
#include "os/affinity.h"

namespace ferry::cuda {

using Clock = std::chrono::steady_clock;

// How a worker waits for a flag the GPU writes (wait_flag): first it spins,
// since a chunk's DMA takes tens of microseconds (4 MiB at 55 GB/s: 76 us) and
// a flag about to be written is caught fastest without a system call; then it
// yields to other threads a few times; then it sleeps in short naps, short
// enough that a late wake-up costs a small share of one chunk's DMA time.
constexpr int kFlagSpinPolls = 2000;               // PAUSEs: ~10-100 us, by CPU model
constexpr int kFlagYieldPolls = 64;                // then sched_yield()s
constexpr auto kFlagNap = std::chrono::microseconds(20);
// No healthy DMA of one chunk takes a second: after this long the device has
// hung or the stream is blocked, and the copy fails instead of hanging.
constexpr auto kFlagTimeout = std::chrono::seconds(60);

int CopyEngine::Impl::worker_count() const {
  return stream_worker_count(options.workers, options.profile.workers, *crew);
}

WorkerPool& CopyEngine::Impl::workers_for(Direction d) {
  std::call_once(workers_started, [&] {
    for (auto& w : workers)  // on the crew's CPUs too: they memcpy into the node's staging memory
      w = std::make_unique<WorkerPool>(worker_count(), ThreadAffinity{crew->cpus(), &os::bind_thread_to_cpus});
  });
  return *workers[static_cast<int>(d)];
}

size_t CopyEngine::Impl::staged_chunk_bytes(size_t bytes) const {
  const size_t per_worker = bytes / (2 * static_cast<size_t>(worker_count()));
  const size_t chunk = std::max<size_t>(256u << 10, (per_worker + 4095) & ~size_t{4095});
  return std::min(chunk, options.profile.staging_chunk_bytes);
}

namespace {

// Polls a flag the GPU writes (acquire loads), spinning briefly, then yielding,
// then sleeping. Returns false if the copy was aborted meanwhile.
bool wait_flag(const volatile uint64_t* flag, uint64_t value, CopyState& st) {
  auto reached = [&] {
    uint64_t v = std::atomic_ref<const uint64_t>(*const_cast<const uint64_t*>(flag)).load(std::memory_order_acquire);
    return static_cast<int64_t>(v - value) >= 0;
  };
  for (int i = 0; i < kFlagSpinPolls; ++i) {
    if (reached()) return true;
    cpu_relax();
  }
  auto start = Clock::now();
  for (int i = 0;; ++i) {
    if (reached()) return true;
    if (st.abort) return false;
    if (i < kFlagYieldPolls)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(kFlagNap);
    if (Clock::now() - start > kFlagTimeout)
      throw CudaError("copy engine: the GPU did not reach a staging flag within " +
                          std::to_string(kFlagTimeout.count()) + " s (device hung or stream blocked)",
                      cudaErrorLaunchTimeout);
  }
}

// Raises a CPU-written flag to `value` (never lowers it: after an abort has
// released a slot, a slower task of the same copy must not pull it back, or
// the GPU would wait forever). CPU threads are its only writers, so the
// read-modify-write stays on the CPU; the GPU only reads the flag.
void store_flag(volatile uint64_t* flag, uint64_t value) {
  std::atomic_ref<uint64_t> f(*const_cast<uint64_t*>(flag));
  uint64_t old = f.load(std::memory_order_relaxed);
  while (static_cast<int64_t>(value - old) > 0 &&
         !f.compare_exchange_weak(old, value, std::memory_order_release, std::memory_order_relaxed)) {
  }
}

// The host side of one streamed piece: h2d fills the slot once the GPU has
// drained it (generation gen - slots), d2h empties it once the GPU has filled it.
void stage_piece(CopyState& st, Lane& ln, Direction dir, void* dst, const void* src, uint64_t gen,
                 uint64_t last_gen, Piece piece) {
  const uint64_t nslots = ln.slots.size();
  const uint64_t s = gen % nslots;
  try {
    if (dir == Direction::h2d) {
      if (gen > nslots && !wait_flag(&ln.gpu_flags[s], gen - nslots, st)) throw std::runtime_error("aborted");
      if (!st.abort) {
        if (fault_injected(FaultPoint::touch)) throw OsError("staging copy (injected fault)", EFAULT);
        copy_to_staging(ln.slots[s], static_cast<const char*>(src) + piece.offset, piece.bytes);
      }
      store_flag(&ln.cpu_flags[s], gen);
    } else {
      if (!wait_flag(&ln.gpu_flags[s], gen, st)) throw std::runtime_error("aborted");
      if (!st.abort) copy_from_staging(static_cast<char*>(dst) + piece.offset, ln.slots[s], piece.bytes);
      store_flag(&ln.cpu_flags[s], gen);
    }
    st.host_tasks.done();
  } catch (...) {
    auto e = std::current_exception();
    st.fail(e);
    // Release every flag this copy may still wait on, on both sides.
    for (uint64_t g = gen; g <= last_gen; ++g) store_flag(&ln.cpu_flags[g % nslots], last_gen);
    st.host_tasks.done(e);
  }
}

}  // namespace

// The stream-ordered pipeline for `pieces` of one copy (each at most one
// slot). The caller's stream work before this call is waited for; the copy's
// event is recorded on the lane when all is done, and the caller's stream
// waits on it.
void CopyEngine::Impl::run_streamed(const std::shared_ptr<CopyState>& st, Direction dir, void* dst,
                                    const void* src, const std::vector<Piece>& pieces, cudaStream_t caller) {
  WorkerPool& pool = workers_for(dir);
  HeldLane held(*lanes, dir);
  Lane& ln = *held;
  const uint64_t nslots = ln.slots.size();
  PooledEvent caller_ready(events);
  const uint64_t first_gen = ln.next_gen;
  const uint64_t last_gen = first_gen + pieces.size() - 1;  // first_gen - 1 when there are none
  try {
    check(cudaEventRecord(caller_ready.get(), caller), "cudaEventRecord (caller's stream)");
    check(cudaStreamWaitEvent(ln.stream, caller_ready.get(), 0), "cudaStreamWaitEvent");
    // Each piece's task goes to the workers before its stream operations
    // (the rule in copy_engine.h). The lane is this copy's while it enqueues,
    // so the workers' FIFO holds its pieces in generation order and a task
    // only ever waits on earlier ones.
    for (const Piece& piece : pieces) {
      const uint64_t gen = ln.next_gen++;
      const uint64_t s = gen % nslots;
      unsigned char* slot = ln.slots[s];
      st->host_tasks.add(1);
      pool.submit([st, &ln, dir, dst, src, gen, last_gen, piece] {
        stage_piece(*st, ln, dir, dst, src, gen, last_gen, piece);
      });
      if (dir == Direction::h2d) {
        stream_wait_geq(ln.stream, &ln.cpu_flags[s], gen);
        check(cudaMemcpyAsync(static_cast<char*>(dst) + piece.offset, slot, piece.bytes, cudaMemcpyDefault,
                              ln.stream),
              "cudaMemcpyAsync (staged H2D)");
        stream_write(ln.stream, &ln.gpu_flags[s], gen);
      } else {
        if (gen > nslots) stream_wait_geq(ln.stream, &ln.cpu_flags[s], gen - nslots);
        check(cudaMemcpyAsync(slot, static_cast<const char*>(src) + piece.offset, piece.bytes,
                              cudaMemcpyDefault, ln.stream),
              "cudaMemcpyAsync (staged D2H)");
        stream_write(ln.stream, &ln.gpu_flags[s], gen);
      }
    }
    if (dir == Direction::d2h && !pieces.empty())  // the event also covers the copies out of the slots
      for (uint64_t g = last_gen; g >= first_gen && g + nslots > last_gen; --g)
        stream_wait_geq(ln.stream, &ln.cpu_flags[g % nslots], g);
    check(cudaEventRecord(st->done, ln.stream), "cudaEventRecord");
    check(cudaStreamWaitEvent(caller, st->done, 0), "cudaStreamWaitEvent (caller's stream)");
  } catch (...) {
    // Stop the tasks already submitted (they touch the caller's buffers,
    // which the caller may free once we throw), release what the lane stream
    // waits on, and wait for those tasks to leave.
    st->abort = true;
    for (uint64_t g = first_gen; g < ln.next_gen; ++g) store_flag(&ln.cpu_flags[g % nslots], ln.next_gen);
    try {
      st->host_tasks.wait();
    } catch (...) {  // their "aborted" errors: the caller gets the enqueue's error
    }
    throw;
  }
}

}  // namespace ferry::cuda
