// pool_impl.h — the pool's state: the lifecycle of a range, the locks, and
// the lock that guards each field. Only pool.cpp and pool_release.cpp include it.
//
// Range states. Every byte of every chunk is in exactly one of them:
//   free       in a chunk, never handed out; zero (fresh from the OS, and the
//              first touch writes zero). RangeSet span state `zero`.
//   in use     handed out by allocate(); an entry of `live`.
//   cached     freed by deallocate(): committed and dirty (cleared before it
//              is handed out again if zero_recycled or allocate(zero=true);
//              else handed out as it is, like torch.empty). RangeSet span state
//              `dirty`.
//   releasing  taken out of the free sets while its memory goes back to the OS
//              outside the lock; held by the releasing thread, in no set: a
//              part of a chunk is counted in the Chunk's `releasing_bytes`; a
//              whole chunk is extracted from `chunks` (its node held by the
//              releasing thread), so that the kernel may hand its address to
//              a new chunk before the release is accounted.
//   released   returned with MADV_DONTNEED (MADV_REMOVE for memfd) inside a
//              live chunk, reads as zero (RangeSet span state `released`); or
//              the whole chunk unmapped (it leaves `chunks`).
// Transitions:
//   free -> in use                   allocate
//   in use -> cached                 deallocate
//   cached -> in use                 allocate, a "recycle" (cleared outside the lock when asked)
//   free/cached -> releasing -> released
//                                    trim (whole idle chunks, hooks->on_chunk_release
//                                    first; without hooks also page-aligned parts of
//                                    partly used chunks), background releaser and the
//                                    limit path (whole idle chunks only)
//   released -> in use               allocate (committed again; it reads as zero)
// An allocation may span free, cached and released bytes of one run; free
// and cached ranges coalesce with neighbours of the same state, and all
// available states of one chunk form one run for best fit (range_set.h).
//
// Accounting (PoolStats, per kind): reserved = bytes of inserted chunks;
// released = released bytes; committed = reserved - released; in_use = sum
// of live sizes; cached = free + cached bytes. A releasing range keeps its
// previous accounting until its release is finished, under the lock, so the
// invariants of pool.h hold in every snapshot. A chunk being prepared is not
// in the stats until it is inserted; meanwhile its bytes are in pending_bytes,
// booked under the lock before mapping, so that concurrent reservations never
// exceed limit_bytes (given back if the reservation fails).
//
// Chunk preparation (prepare_chunk, outside mu; the same for the target
// chunk and for a caller's new chunk, a big allocation's own included):
//   mapped       arena.map_chunk(): backing chosen, advised, bound; bytes
//                booked in pending_bytes; in no set, not in `chunks`
//   touching     FirstTouch's threads commit 2 MiB units front to back
//   registering  once register_lead_bytes are touched, the preparing thread
//                calls on_chunk_ready(base, whole chunk) while the touch goes
//                on: cudaHostRegister pins from the base, behind the touch
//                front (faulting in itself whatever it overtakes)
//   in           touch and hook both done: insert_chunk_locked() puts every
//                byte in the free set (state zero) at once.
// So no byte is handed out before the one registration covers the whole
// chunk, and a registration never covers two chunks.
//
// The target chunk (target_bytes > 0): ONE chunk of target_bytes rounded up
// to 2 MiB, one mapping, ONE registration over all of it, prepared by the
// target worker. One allocation must never span two registrations (measured
// on the H200: a tensor over two adjacent, separately registered ranges says
// is_pinned(), yet PyTorch's non_blocking copy_ over it fails with
// cudaErrorInvalidValue), and the target must serve one allocation of its
// whole size; runs of different chunks never merge (range_set.h), so only one
// chunk can. While target_running, an allocation of the target's kind that
// fits its size and finds no free range waits on target_cv instead of
// reserving a chunk of its own (allocate_cached() returns nullptr instead).
// shutdown() sets cancel_target: a preparation that has not yet called the
// hook gives the chunk up (stops touching where it waits for its lead, or
// skips the hook after a whole touch) and unmaps it; one whose registration
// runs finishes it (a cudaHostRegister cannot be interrupted), and the chunk
// goes in and is released with the others.
//
// Locks, in this order:
//   1. Impl::mu, the pool's mutex: every field marked "mu".
//   2. Arena::mu_, a leaf: remembered refusals and notes; taken under mu
//      only by stats().
// Rule: no system call and no hook call while holding mu. Reserving a chunk
// books its bytes, drops mu, maps/binds/touches it and calls on_chunk_ready,
// then retakes mu to insert it. Releasing takes ranges out of the free sets
// under mu, drops mu for on_chunk_release/munmap/madvise, retakes it to
// account. The fast paths (recycling allocate, deallocate) make no system
// call at all: O(log n) map operations under mu.
//
// Threads: callers; the background releaser (release_delay_ms > 0); the
// target worker (target_bytes > 0, a FinishingThread: it ends when the target
// chunk is in); FirstTouch's helpers, started and joined inside one
// prepare_chunk(). ~Pool stops and joins (or waits for) them all before it
// releases the chunks. zeroed_bytes and zero_ns are atomics, outside mu;
// chunk_generation is an atomic written under mu and read without it.
//
// fork(): in a forked child those threads do not exist and mu may be held by
// one of them, so a pool created before the fork refuses every operation
// there (NotSupported), deallocate does nothing, and ~Pool abandons the Impl
// without joining, locking or unmapping anything (core/fork.h).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/finishing_thread.h"
#include "core/fork.h"
#include "pool/arena.h"
#include "pool/pool.h"
#include "pool/range_set.h"

namespace ferry {

using Clock = std::chrono::steady_clock;

// The slot of a PageKind in the per-kind arrays (`available`).
inline int index(PageKind k) { return static_cast<int>(k); }

struct Chunk {
  MappedChunk mapping;             // immutable once inserted
  size_t live_allocations = 0;     // mu
  size_t released_bytes = 0;       // mu: bytes in span state released
  size_t releasing_bytes = 0;      // mu: parts out for MADV_DONTNEED right now
  Clock::time_point idle_since{};  // mu: when live_allocations last became 0
  uint64_t generation = 0;         // mu: chunk_generation when inserted or when pages of it were last released

  bool idle() const { return live_allocations == 0 && releasing_bytes == 0; }
  uintptr_t end() const { return mapping.base + mapping.bytes; }
};

struct Allocation {
  size_t size;   // rounded to the alignment asked
  Chunk* chunk;  // stable: std::map nodes do not move
};

// Recently freed allocation starts, to tell "already freed" from "foreign".
// Bounded: the oldest of kCapacity records are forgotten.
class FreedHistory {
 public:
  void remember(uintptr_t start, size_t size);
  // Size of the allocation last freed at `start`, or 0 if none is remembered.
  size_t find(uintptr_t start) const;

 private:
  static constexpr size_t kCapacity = 4096;
  struct Record {
    size_t size;
    uint64_t sequence;
  };
  std::map<uintptr_t, Record> by_start_;
  std::deque<std::pair<uintptr_t, uint64_t>> order_;  // (start, sequence), oldest first
  uint64_t next_sequence_ = 0;
};

struct Pool::Impl {
  Impl(PoolOptions options, std::shared_ptr<ChunkHooks> hooks);

  // The public operations (Pool forwards to these). Locking: take mu.
  // `size` already rounded; `dirty` (when given) receives the recycled spans
  // to clear; cached_only: nullptr instead of reserving a chunk or waiting.
  void* allocate(size_t size, size_t alignment, PageKind kind, std::vector<Span>* dirty, bool cached_only);
  // Pool::allocate and allocate_cached: checks, allocate(), clears what is
  // asked outside the lock. Locking: takes mu (in allocate()).
  void* allocate_public(size_t bytes, size_t alignment, HugeWant huge, bool zero, bool cached_only);
  // HugeWant resolved for a request of `size` (rounded) bytes (pool.h).
  PageKind kind_for(HugeWant want, size_t size) const;
  void deallocate(uintptr_t p);
  size_t trim(size_t keep_bytes);
  PoolStats stats() const;
  void wait_ready();
  // Stops and joins the background threads, then releases every chunk.
  void shutdown() noexcept;

  // Calls on_chunk_ready (timed into m.register_ns). Returns false and sets
  // *error if it throws. Locking: mu not held (hook call).
  bool register_chunk(MappedChunk& m, std::exception_ptr* error);
  // Maps, touches and registers a chunk, the registration overlapping the
  // touch (see "Chunk preparation"). Throws; then nothing stays mapped or
  // registered. `cancel` (may be null) stops it before the hook is called.
  // Locking: mu not held.
  MappedChunk prepare_chunk(size_t bytes, PageKind kind, const std::atomic<bool>* cancel = nullptr);
  // Adds a prepared chunk to `chunks`, its bytes to the free set (state
  // zero) and to the stats.
  Chunk& insert_chunk_locked(const MappedChunk& m);
  // Records a carved range as a live allocation and accounts for it.
  void* hand_out_locked(const Carved& carved, PageKind kind);
  uint64_t reserved_locked() const;
  uint64_t cached_locked() const;
  bool fits_limit_locked(size_t chunk_bytes) const;
  // "ferry pool limit of 1 GiB reached: 960 MiB reserved (512 MiB in use),
  // <what> needs a new 128 MiB chunk".
  std::string limit_message_locked(const std::string& what, size_t chunk_bytes) const;
  bool should_wait_for_target_locked(size_t size, PageKind kind) const;
  std::string diagnose_free_locked(uintptr_t p) const;
  // Idle chunks, oldest idle first, idle since `idle_before` or earlier.
  std::vector<Chunk*> idle_chunks_locked(Clock::time_point idle_before) const;
  // Takes `victims` (idle chunks) out of the free sets and out of `chunks`,
  // drops the lock for on_chunk_release and munmap, retakes it and accounts
  // for them. Returns the committed bytes given back.
  // Locking: called and returns with `lock` held; drops it meanwhile.
  uint64_t release_chunks_locked(std::unique_lock<std::mutex>& lock, const std::vector<Chunk*>& victims);
  // The same for page-aligned parts of the free sets (trim without hooks), at
  // most `max_bytes`. Parts whose madvise fails return to their old state.
  uint64_t release_parts_locked(std::unique_lock<std::mutex>& lock, uint64_t max_bytes);
  void account_chunk_release_locked(const Chunk& c);
  // The next chunk_generation, stored and returned (Pool::chunks()).
  uint64_t bump_generation_locked();

  // Created before a fork() of this process: see "fork()" above.
  bool forked() const noexcept { return generation != fork_generation(); }
  void refuse_if_forked() const {
    if (forked()) throw NotSupported(forked_child_message("this ferry pool"));
  }

  void run_releaser();
  void run_target(Clock::time_point created);

  const PoolOptions options;
  const std::shared_ptr<ChunkHooks> hooks;
  const uint64_t generation = fork_generation();
  const PageKind target_kind;
  // target_bytes rounded up to 2 MiB: the size of the one target chunk.
  const size_t target_chunk_bytes;
  Arena arena;  // its own leaf lock

  mutable std::mutex mu;
  std::condition_variable target_cv;   // a target chunk is in, the pipeline changed state, queue moved
  std::condition_variable release_cv;  // wakes the releaser to stop
  std::map<uintptr_t, Chunk> chunks;   // mu: by base; live chunks only (not releasing)
  RangeSet available[2];               // mu: by PageKind
  std::map<uintptr_t, Allocation> live;  // mu: by start
  FreedHistory freed;                  // mu
  PoolStats counters;                  // mu: all but notes and fallbacks (the arena's)
  size_t pending_bytes = 0;            // mu: booked for chunks being prepared
  bool stopping = false;               // mu

  bool target_running = false;            // mu: the target chunk is being prepared
  std::exception_ptr target_error;        // mu: why the target failed
  std::atomic<bool> cancel_target{false};  // no lock: set by shutdown(), polled by the target's preparation

  std::atomic<uint64_t> zeroed_bytes{0}, zero_ns{0};  // no lock: counted by allocating threads
  // Pool::chunk_generation(): bumped under mu with every change of `chunks`
  // or of a chunk's pages (bump_generation_locked), read without a lock.
  std::atomic<uint64_t> chunk_generation{0};

  // Started by the constructor; no lock (owner only). shutdown() joins the
  // releaser and waits for the target worker, which is detached and gone once
  // the target chunk is in or failed (core/finishing_thread.h: a finished,
  // unjoined thread inherited by a forked child is a TSan "thread leak").
  std::thread releaser;
  FinishingThread target_worker;
};

}  // namespace ferry
