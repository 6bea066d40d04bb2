// copy_engine.cpp — the copy engine: pointer checks, strategy choice, the
// direct path, the eager staged path (cuda/copy/eager_copy.h), the stream-ordered
// pipeline (see the protocol in copy_engine.h), pin-in-place, and many items
// in one call.
#include "cuda/copy/copy_engine.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "copy/copy_crew.h"
#include "copy/numa_home.h"
#include "copy/host_copy.h"
#include "copy/plan.h"
#include "copy/staging_plan.h"
#include "core/error.h"
#include "core/fork.h"
#include "core/fault.h"
#include "core/crew.h"
#include "core/options.h"
#include "core/worker_pool.h"
#include "cuda/copy/block_copy.h"
#include "cuda/cuda_check.h"
#include "cuda/device.h"
#include "cuda/driver_entry.h"
#include "cuda/copy/eager_copy.h"
#include "cuda/event_pool.h"
#include "cuda/pinned_pool.h"
#include "cuda/pointer_lookup.h"
#include "cuda/scoped_device.h"
#include "cuda/copy/staging_area.h"
#include "os/affinity.h"
#include "os/mapping.h"
#include "os/sysfs.h"

namespace ferry::cuda {

using Clock = std::chrono::steady_clock;

// ---- shared state of one copy ---------------------------------------------------

struct CopyState {
  Strategy strategy = Strategy::automatic;
  size_t bytes = 0;
  Clock::time_point started = Clock::now();
  std::atomic<int64_t> finished_ns{-1};  // since `started`, set by the first wait/query that sees it done
  cudaEvent_t done = nullptr;            // recorded after the whole copy
  TaskGroup host_tasks;                  // worker tasks of this copy
  std::atomic<bool> abort{false};
  std::mutex mu;
  std::exception_ptr error;              // guarded by mu
  std::vector<Completion> parts;         // a batch's pageable copies; set before it is returned
  const uint64_t generation = fork_generation();

  bool forked() const noexcept { return generation != fork_generation(); }
  void fail(std::exception_ptr e) noexcept {
    std::lock_guard lock(mu);
    if (!error) error = e;
    abort = true;
  }
  ~CopyState() {
    if (done && !forked()) cudaEventDestroy(done);  // no CUDA call in a forked child
  }
};

void Completion::wait() {
  if (!state_) throw InvalidArgument("wait() on an empty Completion");
  if (state_->forked()) throw NotSupported(forked_child_message("this ferry copy"));
  for (auto& part : state_->parts) {
    try {
      part.wait();
    } catch (...) {
      state_->fail(std::current_exception());
    }
  }
  try {
    state_->host_tasks.wait();
  } catch (...) {
    state_->fail(std::current_exception());
  }
  cudaError_t err = cudaEventSynchronize(state_->done);
  if (err != cudaSuccess) {
    try {
      check(err, "cudaEventSynchronize (copy completion)");
    } catch (...) {
      state_->fail(std::current_exception());
    }
  }
  int64_t expected = -1;
  state_->finished_ns.compare_exchange_strong(
      expected, std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - state_->started).count());
  std::lock_guard lock(state_->mu);
  if (state_->error) std::rethrow_exception(state_->error);
}

bool Completion::query() {
  if (!state_) throw InvalidArgument("query() on an empty Completion");
  if (state_->forked()) throw NotSupported(forked_child_message("this ferry copy"));
  for (auto& part : state_->parts)
    if (!part.query()) return false;
  if (!state_->host_tasks.finished()) return false;
  cudaError_t err = cudaEventQuery(state_->done);
  if (err == cudaErrorNotReady) return false;
  wait();  // done (or failed): settle the error and the time
  return true;
}

cudaEvent_t Completion::event() const { return state_ ? state_->done : nullptr; }
Strategy Completion::strategy() const { return state_ ? state_->strategy : Strategy::automatic; }
size_t Completion::bytes() const { return state_ ? state_->bytes : 0; }
double Completion::seconds() const {
  if (!state_ || state_->finished_ns < 0) return -1;
  return state_->finished_ns / 1e9;
}

// ---- pointers --------------------------------------------------------------------

namespace {

void check_device_range(PointerLookup& lookup, const void* p, size_t bytes, const char* role) {
  size_t after = lookup.device_bytes_after(p);
  if (after != 0 && after < bytes)
    throw InvalidArgument(std::string(role) + " " + format_address(p) + ": the device allocation holds " +
                          format_bytes(after) + " from there, the copy needs " + format_bytes(bytes));
}

void check_host_range(const void* p, size_t bytes, const char* role) {
  if (os::range_is_mapped(p, bytes) != 0)
    throw InvalidArgument(std::string(role) + " " + format_address(p) + " (+" + format_bytes(bytes) +
                          ") is neither device memory nor mapped host memory");
}

// Polls a flag the GPU writes (acquire loads), spinning briefly, then yielding,
// then sleeping. Returns false if the copy was aborted meanwhile.
bool wait_flag(const volatile uint64_t* flag, uint64_t value, CopyState& st) {
  auto reached = [&] {
    uint64_t v = std::atomic_ref<const uint64_t>(*const_cast<const uint64_t*>(flag)).load(std::memory_order_acquire);
    return static_cast<int64_t>(v - value) >= 0;
  };
  for (int i = 0; i < 2000; ++i) {
    if (reached()) return true;
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  auto start = Clock::now();
  for (int i = 0;; ++i) {
    if (reached()) return true;
    if (st.abort) return false;
    if (i < 64)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    if (Clock::now() - start > std::chrono::seconds(60))
      throw CudaError("copy engine: the GPU did not reach a staging flag within 60 s (device hung or stream blocked)",
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

}  // namespace

// ---- lanes (the stream-ordered pipeline) -------------------------------------------

// One stream and its staging slots. A lane is held by one copy while that copy
// enqueues (LanePool hands it out), so its generations are in stream order
// without a lock around CUDA calls; copies on the same lane follow each other
// on its stream.
struct Lane {
  Direction dir;
  cudaStream_t stream = nullptr;
  std::vector<unsigned char*> slots;
  size_t slot_bytes = 0;
  volatile uint64_t* cpu_flags = nullptr;  // h2d: ready[s]; d2h: drained[s] (CPU writes)
  volatile uint64_t* gpu_flags = nullptr;  // h2d: done[s];  d2h: filled[s]  (GPU writes)
  void* flag_block = nullptr;
  uint64_t next_gen = 1;  // the holder's
};

// Lanes per direction, made on demand (at most kMaxLanes each), lent to one
// copy at a time. Locking: mu_ guards free_ and count_; CUDA calls (making a
// lane) run outside it.
class LanePool {
 public:
  static constexpr int kMaxLanes = 2;
  LanePool(Pool& staging, const MachineProfile& profile, int device)
      : staging_(staging), profile_(profile), device_(device) {}
  ~LanePool();
  Lane& acquire(Direction d);
  void release(Lane& lane) noexcept;

 private:
  std::unique_ptr<Lane> make(Direction d);
  Pool& staging_;
  const MachineProfile& profile_;
  const int device_;
  std::mutex mu_;
  std::condition_variable returned_;
  std::vector<Lane*> free_[2];                // mu_
  std::vector<std::unique_ptr<Lane>> all_;    // mu_
  int count_[2] = {0, 0};                     // mu_: made or being made
};

std::unique_ptr<Lane> LanePool::make(Direction d) {
  auto l = std::make_unique<Lane>();
  l->dir = d;
  const int n = std::max(2, profile_.staging_slots);
  l->slot_bytes = profile_.staging_chunk_bytes;
  try {
    for (int i = 0; i < n; ++i)
      l->slots.push_back(static_cast<unsigned char*>(staging_.allocate(l->slot_bytes, 4096, HugeWant::yes)));
    check(cudaStreamCreateWithFlags(&l->stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    check(cudaHostAlloc(&l->flag_block, 2 * n * sizeof(uint64_t), cudaHostAllocMapped | cudaHostAllocPortable),
          "cudaHostAlloc (copy engine flags)");
  } catch (...) {  // leave nothing behind; the next call tries again
    for (auto* p : l->slots) staging_.deallocate(p);
    if (l->stream) cudaStreamDestroy(l->stream);
    throw;
  }
  std::memset(l->flag_block, 0, 2 * n * sizeof(uint64_t));
  l->cpu_flags = static_cast<volatile uint64_t*>(l->flag_block);
  l->gpu_flags = l->cpu_flags + n;
  return l;
}

Lane& LanePool::acquire(Direction d) {
  const int di = static_cast<int>(d);
  std::unique_lock lock(mu_);
  for (;;) {
    if (!free_[di].empty()) {
      Lane* l = free_[di].back();
      free_[di].pop_back();
      return *l;
    }
    if (count_[di] < kMaxLanes) {
      ++count_[di];
      lock.unlock();
      std::unique_ptr<Lane> made;
      try {
        made = make(d);
      } catch (...) {
        lock.lock();
        --count_[di];
        throw;
      }
      lock.lock();
      all_.push_back(std::move(made));
      return *all_.back();
    }
    returned_.wait(lock);
  }
}

void LanePool::release(Lane& lane) noexcept {
  {
    std::lock_guard lock(mu_);
    free_[static_cast<int>(lane.dir)].push_back(&lane);
  }
  returned_.notify_one();
}

LanePool::~LanePool() {
  for (auto& l : all_) {
    cudaStreamSynchronize(l->stream);
    cudaStreamDestroy(l->stream);
    cudaFreeHost(l->flag_block);
    for (auto* slot : l->slots) staging_.deallocate(slot);
  }
  cudaGetLastError();
}

// Holds a lane for a scope.
class HeldLane {
 public:
  HeldLane(LanePool& pool, Direction d) : pool_(pool), lane_(pool.acquire(d)) {}
  ~HeldLane() { pool_.release(lane_); }
  HeldLane(const HeldLane&) = delete;
  HeldLane& operator=(const HeldLane&) = delete;
  Lane& operator*() const { return lane_; }

 private:
  LanePool& pool_;
  Lane& lane_;
};

struct CopyEngine::Impl {
  CopyEngineOptions options;
  int numa_node = -1;    // the host node that serves the device (copy/numa_home.h), -1: none
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
  std::unique_ptr<WorkerPool> pinner;  // one thread that unregisters pieces behind their DMA
  mutable std::mutex stats_mu;
  CopyEngineStats stats;  // guarded by stats_mu
  const uint64_t generation = fork_generation();  // a forked child refuses it (core/fork.h)

  bool forked() const noexcept { return generation != fork_generation(); }
  void refuse_if_forked() const {
    if (forked()) throw NotSupported(forked_child_message("this ferry copy engine"));
  }
  int worker_count() const {
    int w = options.workers > 0 ? options.workers : options.profile.workers;
    const int cores = crew->cpus().empty() ? os::usable_cores() : static_cast<int>(crew->cpus().size());
    return w > 0 ? w : std::min(cores, 16);
  }
  WorkerPool& workers_for(Direction d) {
    std::call_once(workers_started, [&] {
      for (auto& w : workers)  // on the crew's CPUs too: they memcpy into the node's staging memory
        w = std::make_unique<WorkerPool>(worker_count(), ThreadAffinity{crew->cpus(), &os::bind_thread_to_cpus});
    });
    return *workers[static_cast<int>(d)];
  }
  // Chunks of a stream-ordered copy: small copies are cut finer so that every
  // worker has a chunk (64 MiB in 8 MiB chunks kept half the workers idle).
  size_t staged_chunk_bytes(size_t bytes) const {
    const size_t per_worker = bytes / (2 * static_cast<size_t>(worker_count()));
    const size_t chunk = std::max<size_t>(256u << 10, (per_worker + 4095) & ~size_t{4095});
    return std::min(chunk, options.profile.staging_chunk_bytes);
  }
  Strategy decide(void* dst, const void* src, size_t bytes, Strategy strategy, Direction* dir,
                  PointerLookup& lookup);
  void count(Strategy s, size_t bytes, size_t chunks, size_t pieces, size_t eager);
  std::shared_ptr<CopyState> begin(Strategy s, size_t bytes);

  // DMAs of pinned memory on `stream`, waited for.
  void dma_and_wait(void* dst, const void* src, size_t n, cudaStream_t stream);
  // One eager staged run on an area of its own.
  void run_eager_items(Direction dir, std::span<const EagerItem> items, cudaStream_t stream, bool wait);
  void run_streamed(const std::shared_ptr<CopyState>& st, Direction dir, void* dst, const void* src,
                    const std::vector<Piece>& pieces, cudaStream_t caller);
  void run_pin_in_place(const std::shared_ptr<CopyState>& st, Direction dir, void* dst, const void* src,
                        size_t n, double pinned_share, cudaStream_t caller);
};

void CopyEngine::Impl::count(Strategy s, size_t bytes, size_t chunks, size_t pieces, size_t eager) {
  std::lock_guard lock(stats_mu);
  ++stats.copies;
  stats.bytes += bytes;
  ++stats.by_strategy[static_cast<int>(s)];
  stats.chunks += chunks;
  stats.pinned_pieces += pieces;
  stats.eager_runs += eager;
}

std::shared_ptr<CopyState> CopyEngine::Impl::begin(Strategy s, size_t bytes) {
  auto st = std::make_shared<CopyState>();
  st->strategy = s;
  st->bytes = bytes;
  check(cudaEventCreateWithFlags(&st->done, cudaEventDisableTiming), "cudaEventCreate");
  return st;
}

void CopyEngine::Impl::dma_and_wait(void* dst, const void* src, size_t n, cudaStream_t stream) {
  PooledEvent done(events);
  check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, stream), "cudaMemcpyAsync");
  check(cudaEventRecord(done.get(), stream), "cudaEventRecord");
  check(cudaEventSynchronize(done.get()), "cudaEventSynchronize (copy)");
}

void CopyEngine::Impl::run_eager_items(Direction dir, std::span<const EagerItem> items, cudaStream_t stream,
                                       bool wait) {
  StagingArea* area = areas->acquire();
  bool pending = true;  // on error, assume the area's slots may still be read
  try {
    pending = run_eager(dir, items, *area, *crew, stream, wait);
  } catch (...) {
    areas->release(area, true);
    throw;
  }
  areas->release(area, pending);
}

// The stream-ordered pipeline for `pieces` of one copy (each at most one
// slot). The caller's stream work before this call is waited for; the copy's
// event is recorded on the lane when all is done, and the caller's stream
// waits on it.
namespace {

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
  std::vector<Piece> staged;
  if (plan.head.bytes) staged.push_back(plan.head);
  split_hybrid(plan, pinned_share, staged);
  if (plan.tail.bytes) staged.push_back(plan.tail);
  std::vector<Piece> staged_chunks;
  size_t staged_bytes = 0;
  for (const Piece& p : staged) {
    staged_bytes += p.bytes;
    for (const Piece& c : split_even(p.bytes, staged_chunk_bytes(n)))
      staged_chunks.push_back({p.offset + c.offset, c.bytes});
  }
  if (plan.body.empty()) {
    run_streamed(st, dir, dst, src, staged_chunks, caller);
    return;
  }
  std::shared_ptr<CopyState> staged_part;
  if (!staged_chunks.empty()) {
    staged_part = begin(Strategy::staged, staged_bytes);
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
    try {
      if (fault_injected(FaultPoint::register_host))
        throw CudaError("cudaHostRegister (pin in place) failed: injected fault (FERRY_FAULT_INJECT)",
                        cudaErrorMemoryAllocation);
      check(cudaHostRegister(h, piece.bytes, cudaHostRegisterDefault), "cudaHostRegister (pin in place)");
    } catch (...) {
      error = std::current_exception();
      break;
    }
    ++pieces;
    cudaEvent_t dma_done = nullptr;
    cudaError_t err = cudaEventCreateWithFlags(&dma_done, cudaEventDisableTiming);
    if (err == cudaSuccess)
      err = dir == Direction::h2d ? cudaMemcpyAsync(d, h, piece.bytes, cudaMemcpyDefault, caller)
                                  : cudaMemcpyAsync(h, d, piece.bytes, cudaMemcpyDefault, caller);
    if (err == cudaSuccess) err = cudaEventRecord(dma_done, caller);
    if (err != cudaSuccess) {
      try {
        check(err, "cudaMemcpyAsync (pinned in place)");
      } catch (...) {
        error = std::current_exception();
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

// ---- the engine -------------------------------------------------------------------

CopyEngineOptions CopyEngineOptions::from_environment(int device) {
  CopyEngineOptions o;
  o.device = device;
  const Options& env = ferry::options();
  o.strategy = parse_strategy(env.text("FERRY_COPY_STRATEGY"));
  o.workers = static_cast<int>(env.integer("FERRY_COPY_WORKERS"));
  std::string path = env.text("FERRY_PROFILE");
  bool explicit_path = !path.empty();
  if (path.empty()) {
    const char* cache = std::getenv("XDG_CACHE_HOME");
    const char* home = std::getenv("HOME");
    if (cache && *cache) path = std::string(cache) + "/ferry/profile.txt";
    else if (home && *home) path = std::string(home) + "/.cache/ferry/profile.txt";
  }
  if (path.empty()) return o;
  // A profile is a few hundred bytes; 64 KiB bounds the read (FERRY_PROFILE=/dev/zero
  // read without end), and read_file refuses a directory, a FIFO or a device.
  std::string text;
  const int err = os::read_file(path.c_str(), &text, size_t{64} << 10);
  if (err == ENOENT && !explicit_path) return o;  // no calibration yet: the defaults
  if (err) {
    const std::string why = err == E2BIG    ? "larger than 64 KiB, not a profile"
                            : err == EISDIR ? "a directory, not a profile"
                            : err == EINVAL ? "not a regular file"
                                            : std::strerror(err);
    throw InvalidArgument((explicit_path ? "FERRY_PROFILE='" + path + "'" : path) + ": cannot read the profile: " + why);
  }
  try {
    o.profile = parse_profile(text);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(path + ": " + e.what() + " (run `ferry bench copy --calibrate` to rewrite it)");
  }
  return o;
}

CopyEngine::CopyEngine(CopyEngineOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.options = options;
  const MachineProfile& p = m.options.profile;
  if (p.staging_chunk_bytes == 0 || p.staging_slots < 2)
    throw InvalidArgument("copy engine profile: staging_chunk_bytes must be > 0 and staging_slots >= 2");
  if (p.eager_chunk_bytes == 0 || p.eager_chunk_bytes % kFragmentAlign || p.eager_slots < 1 || p.eager_areas < 1)
    throw InvalidArgument("copy engine profile: eager_chunk_bytes must be a multiple of 256 and eager_slots, "
                          "eager_areas >= 1");
  ScopedDevice on(options.device);  // throws NoDevice / InvalidArgument
  if (!stream_memops_supported(options.device))
    throw NotSupported("device " + std::to_string(options.device) +
                       " does not support 64-bit stream memory operations, which the copy engine needs");
  // Placement, once: the device's host node, its crew (started now, options
  // checked) and staging memory bound to it. One-node hosts: -1, no binding.
  m.numa_node = numa_home(pci_bus_id(options.device));
  m.crew = &copy_crew(m.numa_node);
  PoolOptions staging;
  staging.chunk_bytes = 64u << 20;
  staging.numa_node = m.numa_node >= 0 ? m.numa_node : -2;
  m.staging = make_pinned_pool(staging, options.device);
  m.lanes = std::make_unique<LanePool>(*m.staging, m.options.profile, options.device);
  StagingGeometry g;
  g.chunk_bytes = p.eager_chunk_bytes;
  g.slots = static_cast<uint32_t>(p.eager_slots);
  m.areas = std::make_unique<AreaPool>(*m.staging, g, p.eager_areas);
  m.pinner = std::make_unique<WorkerPool>(1);
}

CopyEngine::~CopyEngine() {
  if (impl_->forked()) {  // no join, no CUDA call in a forked child
    abandon_in_child(impl_);
    return;
  }
  Impl& m = *impl_;
  try {
    ScopedDevice on(m.options.device);
    m.pinner.reset();   // joins after the queued pin jobs
    for (auto& w : m.workers) w.reset();  // joins after the queued chunk tasks
    m.lanes.reset();    // synchronizes each lane's stream
    m.areas.reset();    // waits for each slot's last DMA
  } catch (...) {  // no device to switch to: nothing of ours can still run on it
  }
  cudaGetLastError();
}

void CopyEngine::warm_up() {
  impl_->refuse_if_forked();
  ScopedDevice on(impl_->options.device);
  impl_->areas->release(impl_->areas->acquire(), false);
}

namespace {

struct Classified {
  Direction dir;
  bool host_pinned;
  bool device_to_device;
  const void* host;
};

void check_device_owner(const PointerInfo& info, int device, const void* p, const char* role) {
  if (info.kind == Memory::device && info.device >= 0 && info.device != device)
    throw InvalidArgument(std::string(role) + " " + format_address(p) + " is memory of device " + std::to_string(info.device) +
                          ", but this engine copies for device " + std::to_string(device));
}

Classified classify_pair(void* dst, const void* src, size_t bytes, PointerLookup& lookup, int device) {
  if (!dst || !src) throw InvalidArgument(std::string(!dst ? "dst" : "src") + " must not be NULL");
  if (bytes == 0) throw InvalidArgument("copy of 0 bytes");
  const auto d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
  if (d + bytes < d || s + bytes < s) throw InvalidArgument("copy range wraps around the address space");
  if (d < s + bytes && s < d + bytes)
    throw InvalidArgument("source " + format_address(src) + " and destination " + format_address(dst) + " overlap (" +
                          format_bytes(bytes) + ")");
  Memory md = lookup.classify(dst, bytes), ms = lookup.classify(src, bytes);
  if (md == Memory::device) {
    check_device_owner(lookup.find(dst), device, dst, "destination");
    check_device_range(lookup, dst, bytes, "destination");
  }
  if (ms == Memory::device) {
    check_device_owner(lookup.find(src), device, src, "source");
    check_device_range(lookup, src, bytes, "source");
  }
  if (md == Memory::device && ms == Memory::device) return {Direction::h2d, false, true, nullptr};
  if (md != Memory::device && ms != Memory::device)
    throw InvalidArgument("neither " + format_address(src) + " nor " + format_address(dst) +
                          " is device memory: ferry copies between host and device (use memcpy on the host)");
  Classified c;
  c.device_to_device = false;
  c.dir = md == Memory::device ? Direction::h2d : Direction::d2h;
  Memory host_kind = c.dir == Direction::h2d ? ms : md;
  c.host = c.dir == Direction::h2d ? src : dst;
  c.host_pinned = host_kind == Memory::pinned_host;
  if (!c.host_pinned) check_host_range(c.host, bytes, c.dir == Direction::h2d ? "source" : "destination");
  return c;
}

}  // namespace

Strategy CopyEngine::plan(void* dst, const void* src, size_t bytes, Strategy strategy) {
  Direction dir;
  PointerLookup lookup;
  return impl_->decide(dst, src, bytes, strategy, &dir, lookup);
}

Strategy CopyEngine::Impl::decide(void* dst, const void* src, size_t bytes, Strategy strategy, Direction* dir,
                                  PointerLookup& lookup) {
  refuse_if_forked();  // every copy call decides first
  Classified c = classify_pair(dst, src, bytes, lookup, options.device);
  *dir = c.dir;
  if (c.device_to_device) return Strategy::direct;
  Strategy requested = strategy != Strategy::automatic ? strategy : options.strategy;
  // The page backing is not read here: /proc/self/smaps costs 15-20 ms in a
  // process with many mappings (measured on the H200 machine), as much as the
  // copy of 1 GiB itself. Callers that know it pass it to choose_strategy.
  HostBacking backing = c.host_pinned ? HostBacking::pinned : HostBacking::unknown;
  return choose_strategy(c.dir, bytes, backing, options.profile, requested);
}

Completion CopyEngine::copy_async(void* dst, const void* src, size_t bytes, cudaStream_t stream,
                                  Strategy strategy) {
  Impl& m = *impl_;
  Direction dir;
  PointerLookup lookup;
  Strategy s = m.decide(dst, src, bytes, strategy, &dir, lookup);  // validates everything first
  ScopedDevice on(m.options.device);
  auto st = m.begin(s, bytes);
  size_t chunks = 0, eager = 0;
  switch (s) {
    case Strategy::direct:
    case Strategy::cuda:
      check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream), "cudaMemcpyAsync");
      check(cudaEventRecord(st->done, stream), "cudaEventRecord");
      break;
    case Strategy::staged:
      if (dir == Direction::h2d && bytes < m.options.profile.eager_async_below_bytes) {
        EagerItem item{dst, src, bytes};
        m.run_eager_items(dir, {&item, 1}, stream, /*wait=*/false);
        check(cudaEventRecord(st->done, stream), "cudaEventRecord");
        eager = 1;
      } else {
        auto pieces = split_even(bytes, m.staged_chunk_bytes(bytes));
        chunks = pieces.size();
        m.run_streamed(st, dir, dst, src, pieces, stream);
      }
      break;
    case Strategy::pin_in_place:
      m.run_pin_in_place(st, dir, dst, src, bytes, 1.0, stream);
      break;
    case Strategy::hybrid:
      m.run_pin_in_place(st, dir, dst, src, bytes,
                         m.options.profile.hybrid_pinned_share[static_cast<int>(dir)], stream);
      break;
    case Strategy::sm: {
      BlockCopy op{lookup.device_view(dst), lookup.device_view(src), bytes};
      launch_block_copies(&op, 1, stream);
      check(cudaEventRecord(st->done, stream), "cudaEventRecord");
      break;
    }
    case Strategy::automatic:
      throw InvalidArgument("internal: strategy not chosen");
  }
  m.count(s, bytes, chunks, 0, eager);
  return Completion(st);
}

void CopyEngine::copy(void* dst, const void* src, size_t bytes, Strategy strategy, cudaStream_t stream) {
  Impl& m = *impl_;
  Direction dir;
  PointerLookup lookup;
  Strategy s = m.decide(dst, src, bytes, strategy, &dir, lookup);
  ScopedDevice on(m.options.device);
  switch (s) {
    case Strategy::direct:
    case Strategy::cuda:
      m.dma_and_wait(dst, src, bytes, stream);
      break;
    case Strategy::staged: {
      EagerItem item{dst, src, bytes};
      m.run_eager_items(dir, {&item, 1}, stream, /*wait=*/true);
      m.count(s, bytes, 0, 0, 1);
      return;
    }
    default:
      copy_async(dst, src, bytes, stream, s).wait();  // counted there
      return;
  }
  m.count(s, bytes, 0, 0, 0);
}

// ---- many items ---------------------------------------------------------------------

namespace {

// The items of one copy_many call, sorted by the path that moves them.
struct ManyPlan {
  std::vector<void*> dsts;  // direct: one cudaMemcpyBatchAsync
  std::vector<const void*> srcs;
  std::vector<size_t> sizes;
  std::vector<BlockCopy> kernel_ops;   // sm: the block-copy kernel
  std::vector<EagerItem> eager[2];     // staged, by direction: one eager run each
  std::vector<size_t> streamed;        // indices: one stream-ordered copy each
  size_t total = 0, largest = 0;
  Strategy main = Strategy::direct;    // the path of the largest item
};

}  // namespace

Completion CopyEngine::copy_many_async(std::span<const CopyOp> ops, cudaStream_t stream, Strategy strategy) {
  return impl_copy_many(ops, stream, strategy, /*wait=*/false);
}

void CopyEngine::copy_many(std::span<const CopyOp> ops, cudaStream_t stream, Strategy strategy) {
  impl_copy_many(ops, stream, strategy, /*wait=*/true).wait();
}

Completion CopyEngine::impl_copy_many(std::span<const CopyOp> ops, cudaStream_t stream, Strategy strategy,
                                      bool wait) {
  Impl& m = *impl_;
  m.refuse_if_forked();
  if (ops.empty()) throw InvalidArgument("copy_many: no items");
  // Validate every item before anything is enqueued; one lookup asks the
  // driver once per allocation, not several times per item.
  PointerLookup lookup;
  std::vector<Strategy> chosen(ops.size());
  std::vector<Direction> dirs(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    try {
      chosen[i] = m.decide(ops[i].dst, ops[i].src, ops[i].bytes, strategy, &dirs[i], lookup);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument("item " + std::to_string(i) + " of " + std::to_string(ops.size()) + ": " + e.what());
    }
  }
  // Small pinned blocks go to the SM kernel unless a strategy was asked for.
  if (strategy == Strategy::automatic && m.options.strategy == Strategy::automatic) {
    size_t direct_bytes = 0, direct_ops = 0;
    for (size_t i = 0; i < ops.size(); ++i)
      if (chosen[i] == Strategy::direct) direct_bytes += ops[i].bytes, ++direct_ops;
    if (direct_ops && direct_bytes / direct_ops < m.options.profile.batch_sm_below_bytes)
      for (auto& c : chosen)
        if (c == Strategy::direct) c = Strategy::sm;
  }
  ManyPlan p;
  for (size_t i = 0; i < ops.size(); ++i) {
    const CopyOp& op = ops[i];
    p.total += op.bytes;
    if (op.bytes > p.largest) p.largest = op.bytes, p.main = chosen[i];
    const bool streamed_d2h = !wait && dirs[i] == Direction::d2h;
    if (chosen[i] == Strategy::sm)
      p.kernel_ops.push_back({lookup.device_view(op.dst), lookup.device_view(op.src), op.bytes});
    else if (chosen[i] == Strategy::direct)
      p.dsts.push_back(op.dst), p.srcs.push_back(op.src), p.sizes.push_back(op.bytes);
    else if (chosen[i] == Strategy::staged && !streamed_d2h)
      p.eager[static_cast<int>(dirs[i])].push_back({op.dst, op.src, op.bytes});
    else
      p.streamed.push_back(i);
  }
  ScopedDevice on(m.options.device);
  auto st = m.begin(p.main, p.total);
  if (!p.dsts.empty()) {
    if (stream == nullptr) {  // the batch API refuses the legacy stream: one call each
      for (size_t i = 0; i < p.dsts.size(); ++i)
        check(cudaMemcpyAsync(p.dsts[i], p.srcs[i], p.sizes[i], cudaMemcpyDefault, stream), "cudaMemcpyAsync (batch)");
    } else {
      cudaMemcpyAttributes attr{};
      attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      size_t attr_index = 0;
      check(cudaMemcpyBatchAsync(p.dsts.data(), const_cast<const void**>(p.srcs.data()), p.sizes.data(),
                                 p.dsts.size(), &attr, &attr_index, 1, stream),
            "cudaMemcpyBatchAsync");
    }
  }
  if (!p.kernel_ops.empty()) launch_block_copies(p.kernel_ops.data(), p.kernel_ops.size(), stream);
  // Host->device first: its DMAs queue behind the pinned ones while the CPU
  // stages; device->host (synchronous calls) after.
  size_t eager_runs = 0;
  for (int d : {0, 1}) {
    if (p.eager[d].empty()) continue;
    m.run_eager_items(static_cast<Direction>(d), p.eager[d], stream, wait);
    ++eager_runs;
  }
  std::vector<Completion> parts;
  try {
    for (size_t i : p.streamed)
      parts.push_back(copy_async(ops[i].dst, ops[i].src, ops[i].bytes, stream, chosen[i]));
    // Streamed items recorded their own events, which the caller's stream
    // already waits on; the call's event follows them on that stream.
    check(cudaEventRecord(st->done, stream), "cudaEventRecord");
  } catch (...) {
    // Nothing of this call may touch the caller's buffers once it throws.
    for (auto& c : parts) {
      try {
        c.wait();
      } catch (...) {
      }
    }
    cudaStreamSynchronize(stream);
    cudaGetLastError();
    throw;
  }
  st->parts = std::move(parts);
  m.count(p.main, p.total, 0, 0, eager_runs);
  return Completion(st);
}

CopyEngineStats CopyEngine::stats() const {
  impl_->refuse_if_forked();
  std::lock_guard lock(impl_->stats_mu);
  return impl_->stats;
}

const CopyEngineOptions& CopyEngine::options() const { return impl_->options; }

int CopyEngine::numa_node() const { return impl_->numa_node; }

const Crew& CopyEngine::crew() const { return *impl_->crew; }

}  // namespace ferry::cuda
