// copy_engine.cpp — the copy engine: pointer checks, strategy choice, the
// staged pipeline (see the protocol in copy_engine.h), the direct and CUDA
// paths, pin-in-place, and batches.
#include "cuda/copy_engine.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "copy/plan.h"
#include "core/error.h"
#include "core/fork.h"
#include "core/fault.h"
#include "core/options.h"
#include "core/worker_pool.h"
#include "cuda/block_copy.h"
#include "cuda/cuda_check.h"
#include "cuda/device.h"
#include "cuda/driver_entry.h"
#include "cuda/pinned_pool.h"
#include "cuda/pointer_lookup.h"
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
    if (done && !forked()) cudaEventDestroy(done);
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

std::string hex(const void* p) {
  char b[32];
  std::snprintf(b, sizeof b, "%p", p);
  return b;
}

void check_device_range(PointerLookup& lookup, const void* p, size_t bytes, const char* role) {
  size_t after = lookup.device_bytes_after(p);
  if (after != 0 && after < bytes)
    throw InvalidArgument(std::string(role) + " " + hex(p) + ": the device allocation holds " +
                          format_bytes(after) + " from there, the copy needs " + format_bytes(bytes));
}

void check_host_range(const void* p, size_t bytes, const char* role) {
  if (os::range_is_mapped(p, bytes) != 0)
    throw InvalidArgument(std::string(role) + " " + hex(p) + " (+" + format_bytes(bytes) +
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

// ---- lanes -----------------------------------------------------------------------

// One stream and its staging slots; one lane per direction so both DMA engines
// run at once.
struct Lane {
  Direction dir;
  cudaStream_t stream = nullptr;
  std::vector<unsigned char*> slots;
  size_t slot_bytes = 0;
  volatile uint64_t* cpu_flags = nullptr;  // h2d: ready[s]; d2h: drained[s] (CPU writes)
  volatile uint64_t* gpu_flags = nullptr;  // h2d: done[s];  d2h: filled[s]  (GPU writes)
  void* flag_block = nullptr;
  std::mutex mu;        // held while one copy's stream ops are enqueued
  uint64_t next_gen = 1;  // guarded by mu
};

struct CopyEngine::Impl {
  CopyEngineOptions options;
  std::unique_ptr<Pool> staging;  // pinned pool of the slots
  // Staging workers, one pool per direction: a worker blocks until the GPU
  // reaches a flag, so tasks waiting on one direction's stream never hold up
  // the other direction's (see run_staged for the ordering they rely on).
  std::unique_ptr<WorkerPool> workers[2];
  std::mutex lanes_mu;
  std::unique_ptr<Lane> lanes[2];  // guarded by lanes_mu until created
  std::unique_ptr<WorkerPool> pinner;  // one thread that unregisters pieces behind their DMA
  cudaStream_t pin_stream = nullptr;   // the DMAs of pinned-in-place pieces
  std::mutex pin_mu;                   // held while one copy registers and enqueues its pieces
  mutable std::mutex stats_mu;
  CopyEngineStats stats;  // guarded by stats_mu
  const uint64_t generation = fork_generation();  // a forked child refuses it (core/fork.h)

  bool forked() const noexcept { return generation != fork_generation(); }
  void refuse_if_forked() const {
    if (forked()) throw NotSupported(forked_child_message("this ferry copy engine"));
  }

  Lane& lane(Direction d);
  // Chunks of a staged copy: small copies are cut finer so that every worker
  // has a chunk (64 MiB in 8 MiB chunks kept half the workers idle: 20 GB/s).
  size_t staged_chunk_bytes(size_t bytes) const {
    const size_t per_worker = bytes / (2 * static_cast<size_t>(workers[0]->size()));
    const size_t chunk = std::max<size_t>(256u << 10, (per_worker + 4095) & ~size_t{4095});
    return std::min(chunk, options.profile.staging_chunk_bytes);
  }
  // lookup: the caller's (a batch's) pointer answers; nullptr: a fresh one.
  Strategy decide(void* dst, const void* src, size_t bytes, Strategy strategy, Direction* dir,
                  PointerLookup* lookup = nullptr);
  void count(Strategy s, size_t bytes, size_t chunks, size_t pieces);
  std::shared_ptr<CopyState> begin(Strategy s, size_t bytes);
  void finish_on(const std::shared_ptr<CopyState>& st, cudaStream_t record_on, cudaStream_t caller);

  void run_direct(CopyState& st, void* dst, const void* src, size_t n, cudaStream_t stream);
  void run_staged(const std::shared_ptr<CopyState>& st, Direction dir, void* dst, const void* src,
                  const std::vector<Piece>& pieces, cudaStream_t caller);
  void run_pin_in_place(const std::shared_ptr<CopyState>& st, Direction dir, void* dst, const void* src,
                        size_t n, double pinned_share, cudaStream_t caller);
};

Lane& CopyEngine::Impl::lane(Direction d) {
  std::lock_guard lock(lanes_mu);
  auto& slot = lanes[static_cast<int>(d)];
  if (slot) return *slot;
  auto l = std::make_unique<Lane>();
  l->dir = d;
  const int n = std::max(2, options.profile.staging_slots);
  l->slot_bytes = options.profile.staging_chunk_bytes;
  try {
    set_device(options.device);
    for (int i = 0; i < n; ++i)
      l->slots.push_back(static_cast<unsigned char*>(staging->allocate(l->slot_bytes, 4096, HugeWant::yes)));
    check(cudaStreamCreateWithFlags(&l->stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    check(cudaHostAlloc(&l->flag_block, 2 * n * sizeof(uint64_t), cudaHostAllocMapped | cudaHostAllocPortable),
          "cudaHostAlloc (copy engine flags)");
  } catch (...) {  // leave nothing behind; the next call tries again
    for (auto* p : l->slots) staging->deallocate(p);
    if (l->stream) cudaStreamDestroy(l->stream);
    throw;
  }
  std::memset(l->flag_block, 0, 2 * n * sizeof(uint64_t));
  l->cpu_flags = static_cast<volatile uint64_t*>(l->flag_block);
  l->gpu_flags = l->cpu_flags + n;
  slot = std::move(l);
  return *slot;
}

void CopyEngine::Impl::count(Strategy s, size_t bytes, size_t chunks, size_t pieces) {
  std::lock_guard lock(stats_mu);
  ++stats.copies;
  stats.bytes += bytes;
  ++stats.by_strategy[static_cast<int>(s)];
  stats.chunks += chunks;
  stats.pinned_pieces += pieces;
}

std::shared_ptr<CopyState> CopyEngine::Impl::begin(Strategy s, size_t bytes) {
  auto st = std::make_shared<CopyState>();
  st->strategy = s;
  st->bytes = bytes;
  check(cudaEventCreateWithFlags(&st->done, cudaEventDisableTiming), "cudaEventCreate");
  return st;
}

// Records the copy's event on `record_on` and orders the caller's stream after it.
void CopyEngine::Impl::finish_on(const std::shared_ptr<CopyState>& st, cudaStream_t record_on,
                                 cudaStream_t caller) {
  check(cudaEventRecord(st->done, record_on), "cudaEventRecord");
  if (record_on != caller) check(cudaStreamWaitEvent(caller, st->done, 0), "cudaStreamWaitEvent");
}

void CopyEngine::Impl::run_direct(CopyState& st, void* dst, const void* src, size_t n, cudaStream_t stream) {
  check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, stream), "cudaMemcpyAsync");
  (void)st;
}

// Enqueues the staged pipeline for `pieces` of the copy (each at most one slot)
// and submits the worker tasks. The caller's stream work before this call is
// waited for; the copy's event is recorded on the lane when all is done.
namespace {

// The host side of one staged piece: h2d fills the slot once the GPU has
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
        std::memcpy(ln.slots[s], static_cast<const char*>(src) + piece.offset, piece.bytes);
      }
      store_flag(&ln.cpu_flags[s], gen);
    } else {
      if (!wait_flag(&ln.gpu_flags[s], gen, st)) throw std::runtime_error("aborted");
      if (!st.abort) std::memcpy(static_cast<char*>(dst) + piece.offset, ln.slots[s], piece.bytes);
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

void CopyEngine::Impl::run_staged(const std::shared_ptr<CopyState>& st, Direction dir, void* dst,
                                  const void* src, const std::vector<Piece>& pieces, cudaStream_t caller) {
  Lane& ln = lane(dir);
  const uint64_t nslots = ln.slots.size();
  cudaEvent_t caller_ready = nullptr;
  check(cudaEventCreateWithFlags(&caller_ready, cudaEventDisableTiming), "cudaEventCreate");
  {
    std::lock_guard lock(ln.mu);
    const uint64_t first_gen = ln.next_gen;
    const uint64_t last_gen = first_gen + pieces.size() - 1;  // first_gen - 1 when there are none
    try {
      check(cudaEventRecord(caller_ready, caller), "cudaEventRecord (caller's stream)");
      check(cudaStreamWaitEvent(ln.stream, caller_ready, 0), "cudaStreamWaitEvent");
      // Each piece's task goes to the workers before its stream operations:
      // the lane stream must never wait on a flag whose task is not yet
      // submitted. Otherwise a device-synchronizing call in another thread
      // (cudaFree) takes the driver's lock and waits for the stream, the
      // stream waits for the task, and this thread, which would submit it,
      // waits for the lock (6 threads copying both ways hung so on the H200).
      // Under the lane's lock the workers' FIFO holds this lane's pieces in
      // generation order, so a task only ever waits on earlier ones.
      for (const Piece& piece : pieces) {
        const uint64_t gen = ln.next_gen++;
        const uint64_t s = gen % nslots;
        unsigned char* slot = ln.slots[s];
        st->host_tasks.add(1);
        workers[static_cast<int>(dir)]->submit([st, &ln, dir, dst, src, gen, last_gen, piece] {
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
      cudaEventDestroy(caller_ready);
      throw;
    }
  }
  cudaEventDestroy(caller_ready);  // safe: destruction waits for nothing, the wait is enqueued
}

// Pin-in-place: the calling thread registers the aligned body of the host
// buffer piece by piece, each DMA enqueued on the pin stream as soon as its
// piece is pinned (registration of piece i+1 overlaps the DMA of piece i), and
// the engine's pinner thread unregisters each piece once its DMA ended. Head,
// tail and the share of the body not pinned go through staging at the same
// time, as a part of this copy with its own event.
//
// No GPU stream ever waits on a flag that is set after a cudaHostUnregister:
// cudaHostUnregister waits for the device's outstanding work, so such a wait
// deadlocks (seen on the H200). The copy's event is recorded on the pin stream
// after the last pinned DMA and the staged part's event, both already recorded.
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
    run_staged(st, dir, dst, src, staged_chunks, caller);
    return;
  }
  std::shared_ptr<CopyState> staged_part;
  if (!staged_chunks.empty()) {
    staged_part = begin(Strategy::staged, staged_bytes);
    run_staged(staged_part, dir, dst, src, staged_chunks, caller);
    st->parts.push_back(Completion(staged_part));
  }

  std::lock_guard lock(pin_mu);  // one pin-in-place copy at a time on the pin stream
  cudaEvent_t caller_ready = nullptr;
  check(cudaEventCreateWithFlags(&caller_ready, cudaEventDisableTiming), "cudaEventCreate");
  cudaEventRecord(caller_ready, caller);
  cudaStreamWaitEvent(pin_stream, caller_ready, 0);
  cudaEventDestroy(caller_ready);
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
      err = dir == Direction::h2d ? cudaMemcpyAsync(d, h, piece.bytes, cudaMemcpyDefault, pin_stream)
                                  : cudaMemcpyAsync(h, d, piece.bytes, cudaMemcpyDefault, pin_stream);
    if (err == cudaSuccess) err = cudaEventRecord(dma_done, pin_stream);
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
    pinner->submit([this, st, h, dma_done, unpinned] {
      cudaSetDevice(options.device);
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
  if (staged_part) cudaStreamWaitEvent(pin_stream, staged_part->done, 0);
  cudaError_t err = cudaEventRecord(st->done, pin_stream);
  if (err == cudaSuccess) err = cudaStreamWaitEvent(caller, st->done, 0);
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
  std::ifstream in(path);
  if (in) {
    std::stringstream text;
    text << in.rdbuf();
    try {
      o.profile = parse_profile(text.str());
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(path + ": " + e.what() + " (run `ferry bench copy --calibrate` to rewrite it)");
    }
  } else if (explicit_path) {
    throw InvalidArgument("FERRY_PROFILE='" + path + "': cannot read the file");
  }
  return o;
}

CopyEngine::CopyEngine(CopyEngineOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.options = options;
  if (m.options.profile.staging_chunk_bytes == 0 || m.options.profile.staging_slots < 2)
    throw InvalidArgument("copy engine profile: staging_chunk_bytes must be > 0 and staging_slots >= 2");
  set_device(options.device);  // throws NoDevice / InvalidArgument
  if (!stream_memops_supported(options.device))
    throw NotSupported("device " + std::to_string(options.device) +
                       " does not support 64-bit stream memory operations, which the copy engine needs");
  int workers = options.workers > 0 ? options.workers : options.profile.workers;
  if (workers <= 0) workers = std::min(os::usable_cores(), 16);
  PoolOptions staging;
  staging.chunk_bytes = 64u << 20;
  m.staging = make_pinned_pool(staging, options.device);
  for (auto& w : m.workers) w = std::make_unique<WorkerPool>(workers);
  m.pinner = std::make_unique<WorkerPool>(1);
  check(cudaStreamCreateWithFlags(&m.pin_stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
}

CopyEngine::~CopyEngine() {
  if (impl_->forked()) {  // no join, no CUDA call in a forked child
    abandon_in_child(impl_);
    return;
  }
  Impl& m = *impl_;
  m.pinner.reset();   // joins after the queued pin jobs
  for (auto& w : m.workers) w.reset();  // joins after the queued chunk tasks
  for (auto& l : m.lanes) {
    if (!l) continue;
    cudaStreamSynchronize(l->stream);
    cudaStreamDestroy(l->stream);
    cudaFreeHost(l->flag_block);
    for (auto* slot : l->slots) m.staging->deallocate(slot);
  }
  if (m.pin_stream) {
    cudaStreamSynchronize(m.pin_stream);
    cudaStreamDestroy(m.pin_stream);
  }
  cudaGetLastError();
}

void CopyEngine::warm_up() {
  impl_->refuse_if_forked();
  impl_->lane(Direction::h2d);
  impl_->lane(Direction::d2h);
}

namespace {

struct Classified {
  Direction dir;
  bool host_pinned;
  bool device_to_device;
  const void* host;
};

Classified classify_pair(void* dst, const void* src, size_t bytes, PointerLookup& lookup) {
  if (!dst || !src) throw InvalidArgument(std::string(!dst ? "dst" : "src") + " must not be NULL");
  if (bytes == 0) throw InvalidArgument("copy of 0 bytes");
  const auto d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
  if (d + bytes < d || s + bytes < s) throw InvalidArgument("copy range wraps around the address space");
  if (d < s + bytes && s < d + bytes)
    throw InvalidArgument("source " + hex(src) + " and destination " + hex(dst) + " overlap (" +
                          format_bytes(bytes) + ")");
  Memory md = lookup.classify(dst, bytes), ms = lookup.classify(src, bytes);
  if (md == Memory::device) check_device_range(lookup, dst, bytes, "destination");
  if (ms == Memory::device) check_device_range(lookup, src, bytes, "source");
  if (md == Memory::device && ms == Memory::device) return {Direction::h2d, false, true, nullptr};
  if (md != Memory::device && ms != Memory::device)
    throw InvalidArgument("neither " + hex(src) + " nor " + hex(dst) +
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
  impl_->refuse_if_forked();
  Direction dir;
  return impl_->decide(dst, src, bytes, strategy, &dir);
}

Strategy CopyEngine::Impl::decide(void* dst, const void* src, size_t bytes, Strategy strategy, Direction* dir,
                                  PointerLookup* lookup) {
  PointerLookup local;
  Classified c = classify_pair(dst, src, bytes, lookup ? *lookup : local);
  *dir = c.dir;
  if (c.device_to_device) return Strategy::direct;
  const MachineProfile& prof = options.profile;
  Strategy requested = strategy != Strategy::automatic ? strategy : options.strategy;
  // The page backing is not read here: /proc/self/smaps costs 15-20 ms in a
  // process with many mappings (measured on the H200 machine), as much as the
  // copy of 1 GiB itself. Callers that know it pass it to choose_strategy.
  HostBacking backing = c.host_pinned ? HostBacking::pinned : HostBacking::unknown;
  return choose_strategy(c.dir, bytes, backing, prof, requested);
}

Completion CopyEngine::copy_async(void* dst, const void* src, size_t bytes, cudaStream_t stream,
                                  Strategy strategy) {
  Impl& m = *impl_;
  m.refuse_if_forked();
  Direction dir;
  PointerLookup lookup;
  Strategy s = m.decide(dst, src, bytes, strategy, &dir, &lookup);  // validates everything first
  auto st = m.begin(s, bytes);
  check(cudaSetDevice(m.options.device), "cudaSetDevice");
  size_t chunks = 0;
  switch (s) {
    case Strategy::direct:
    case Strategy::cuda:
      m.run_direct(*st, dst, src, bytes, stream);
      m.finish_on(st, stream, stream);
      break;
    case Strategy::staged: {
      auto pieces = split_even(bytes, m.staged_chunk_bytes(bytes));
      chunks = pieces.size();
      m.run_staged(st, dir, dst, src, pieces, stream);
      break;
    }
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
      m.finish_on(st, stream, stream);
      break;
    }
    case Strategy::automatic:
      throw InvalidArgument("internal: strategy not chosen");
  }
  m.count(s, bytes, chunks, 0);
  return Completion(st);
}

void CopyEngine::copy(void* dst, const void* src, size_t bytes, Strategy strategy) {
  Impl& m = *impl_;
  m.refuse_if_forked();
  set_device(m.options.device);
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  try {
    Completion c = copy_async(dst, src, bytes, stream, strategy);
    c.wait();
  } catch (...) {
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
    cudaGetLastError();
    throw;
  }
  check(cudaStreamDestroy(stream), "cudaStreamDestroy");
}

Completion CopyEngine::copy_batch_async(std::span<const CopyOp> ops, cudaStream_t stream, Strategy strategy) {
  Impl& m = *impl_;
  m.refuse_if_forked();
  if (ops.empty()) throw InvalidArgument("empty batch");
  // Validate every op before anything is enqueued; one lookup asks the driver
  // once per allocation, not several times per op.
  PointerLookup lookup;
  std::vector<Strategy> chosen(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    try {
      Direction dir;
      chosen[i] = m.decide(ops[i].dst, ops[i].src, ops[i].bytes, strategy, &dir, &lookup);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument("batch op " + std::to_string(i) + ": " + e.what());
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
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<size_t> sizes;
  std::vector<BlockCopy> kernel_ops;
  std::vector<Completion> pageable;
  size_t total = 0, largest = 0;
  Strategy main = Strategy::direct;
  for (size_t i = 0; i < ops.size(); ++i) {
    total += ops[i].bytes;
    if (ops[i].bytes > largest) largest = ops[i].bytes, main = chosen[i];
    if (chosen[i] == Strategy::sm) {
      kernel_ops.push_back({lookup.device_view(ops[i].dst), lookup.device_view(ops[i].src), ops[i].bytes});
    } else if (chosen[i] == Strategy::direct) {
      dsts.push_back(ops[i].dst);
      srcs.push_back(ops[i].src);
      sizes.push_back(ops[i].bytes);
    } else {
      pageable.push_back(copy_async(ops[i].dst, ops[i].src, ops[i].bytes, stream, chosen[i]));
    }
  }
  auto st = m.begin(main, total);
  check(cudaSetDevice(m.options.device), "cudaSetDevice");
  if (!dsts.empty()) {
    if (stream == nullptr) {  // the batch API refuses the legacy stream: one call each
      for (size_t i = 0; i < dsts.size(); ++i)
        check(cudaMemcpyAsync(dsts[i], srcs[i], sizes[i], cudaMemcpyDefault, stream), "cudaMemcpyAsync (batch)");
    } else {
      cudaMemcpyAttributes attr{};
      attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      size_t attr_index = 0;
      check(cudaMemcpyBatchAsync(dsts.data(), const_cast<const void**>(srcs.data()), sizes.data(), dsts.size(),
                                 &attr, &attr_index, 1, stream),
            "cudaMemcpyBatchAsync");
    }
  }
  if (!kernel_ops.empty()) launch_block_copies(kernel_ops.data(), kernel_ops.size(), stream);
  // Pageable ops recorded their own events, which the caller's stream already
  // waits on; the batch's event follows them on that stream.
  m.finish_on(st, stream, stream);
  st->parts = std::move(pageable);
  return Completion(st);
}

CopyEngineStats CopyEngine::stats() const {
  impl_->refuse_if_forked();
  std::lock_guard lock(impl_->stats_mu);
  return impl_->stats;
}

const CopyEngineOptions& CopyEngine::options() const { return impl_->options; }

}  // namespace ferry::cuda
