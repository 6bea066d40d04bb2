// pool.h — ferry's host memory pool: exact-size allocations carved from
// huge-or-small chunks that the arena reserves from the OS, recycled on free,
// returned to the OS only on trim() or by the background releaser.
//
// This is the contract the layers above (CUDA pinned pool, C API, Python) use.
// No CUDA here: a pinned pool is this pool plus ChunkHooks that register each
// chunk with the driver once (src/cuda/pinned_pool.*).
//
// Invariants (checked by the tests after every operation):
//   reserved  = committed + released         (per kind)
//   committed = in_use + cached               (per kind)
//   huge and small allocations never share a chunk.
// Free paths never throw except for a pointer the pool did not hand out
// (InvalidArgument; nothing is changed).
//
// The lifecycle of a range (free, in use, cached, releasing, released), the
// locks and the lock order are written down in pool/pool_impl.h; the chunk
// backing policy and its remembered fallbacks in pool/arena.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pool/pool_options.h"

namespace ferry {

// Called by the pool OUTSIDE its lock. A pinned pool registers chunks here.
class ChunkHooks {
 public:
  virtual ~ChunkHooks() = default;
  // The chunk is mapped read-write and reads as zero; the pool's threads may
  // still be first-touching it, front to back (PoolOptions::register_lead_bytes:
  // a registration that starts behind the touch overlaps it). Called once per
  // chunk, on the thread that prepares it. Throw ferry::Error to refuse the
  // chunk: the pool then unmaps it and the allocation that needed it fails
  // with that error.
  virtual void on_chunk_ready(void* base, size_t bytes) = 0;
  // The chunk is about to be unmapped (trim, background release, destroy).
  virtual void on_chunk_release(void* base, size_t bytes) noexcept = 0;
};

struct Counter {
  uint64_t current = 0, peak = 0, total = 0;  // total: sum of all increases
};

struct KindStats {
  Counter reserved;   // address space held in chunks
  Counter committed;  // touched and not released
  Counter in_use;     // handed out (sizes rounded to the alignment asked)
  Counter cached;     // committed, free, recyclable
  Counter released;   // part of a live chunk, returned to the OS (MADV_DONTNEED)
};

struct PoolStats {
  KindStats kind[2];  // indexed by PageKind
  uint64_t allocations = 0;
  uint64_t frees = 0;
  uint64_t recycles = 0;            // allocations served from cached (used before) memory
  uint64_t chunk_reservations = 0;
  uint64_t chunk_releases = 0;
  uint64_t fallbacks = 0;           // times a wanted backing was refused and another used
  uint64_t touch_ns = 0;            // time spent first-touching chunks (wall time per chunk, summed)
  uint64_t register_ns = 0;         // time spent in ChunkHooks::on_chunk_ready (overlaps touch_ns)
  uint64_t target_ns = 0;           // from creation until the target chunk was in; 0 = none (yet)
  uint64_t zeroed_bytes = 0;        // recycled bytes cleared on allocation (zero_recycled or zero=true)
  uint64_t zero_ns = 0;             // time that clearing took, in the allocating threads
  uint64_t chunks_by_backing[4] = {};  // live chunks, indexed by Backing
  std::vector<std::string> notes;   // fallbacks remembered, e.g. "hugetlb 2 MiB: 0 free pages; using THP"
};

class Pool {
 public:
  explicit Pool(PoolOptions options, std::shared_ptr<ChunkHooks> hooks = nullptr);
  ~Pool();  // waits for background work, releases every chunk (hooks first)
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  // bytes >= 1; alignment a power of two, 1 .. 2 MiB. Throws InvalidArgument
  // or OutOfMemory (naming the limit when that is the cause). Thread-safe.
  // The memory is uninitialized where it is recycled, unless `zero` or
  // options.zero_recycled: then it reads as zero (only recycled bytes are
  // cleared; memory fresh from the OS, or released to it, is zero already).
  void* allocate(size_t bytes, size_t alignment = 256, HugeWant huge = HugeWant::automatic, bool zero = false);

  // Like allocate(), but only from free memory the pool holds now: returns
  // nullptr where allocate() would reserve a chunk or wait for the target.
  // Makes no system call and never waits for more than the pool's lock (for
  // callers that hold a lock of their own, such as Python's GIL); clears
  // recycled bytes in the calling thread alone when asked. Throws as allocate().
  void* allocate_cached(size_t bytes, size_t alignment = 256, HugeWant huge = HugeWant::automatic,
                        bool zero = false);

  // p must be a pointer returned by allocate() and not yet freed. Throws
  // InvalidArgument (double free, foreign or interior pointer) and changes nothing.
  void deallocate(void* p);

  // Return free memory to the OS until at most keep_bytes stay cached. Returns
  // the bytes released. Never runs on the free path.
  size_t trim(size_t keep_bytes = 0);

  // Size (rounded) of the live allocation that starts at p, or 0.
  size_t allocation_size(const void* p) const;

  // Blocks until the target_bytes given at creation are reserved and ready.
  void wait_ready();

  PoolStats stats() const;
  const PoolOptions& options() const;

  // Where p lies in a memfd-backed chunk (options.memfd): the chunk's
  // descriptor (owned by the pool, open while the chunk lives; map it in
  // another process to share the memory) and p's offset in it. fd is -1 when
  // p is not inside a memfd-backed chunk of this pool.
  struct SharedLocation {
    int fd = -1;
    size_t offset = 0;
  };
  SharedLocation shared_location(const void* p) const;

  // The pool's chunks, for a transfer library that registers memory (NIXL,
  // RDMA): each live chunk's range and the generation at which its pages last
  // changed: when it was inserted, or when trim() returned part of it to the
  // OS (MADV_DONTNEED: a registration that pinned the old pages is stale
  // then, so redo it). Any allocation lies inside one chunk.
  struct ChunkView {
    uintptr_t base = 0;
    size_t bytes = 0;
    uint64_t generation = 0;
  };
  // A snapshot of the live chunks, by address; chunks being prepared or
  // released are not in it. Thread-safe (takes the pool's lock briefly).
  std::vector<ChunkView> chunks() const;
  // Moves (grows) whenever chunks() would change: a chunk inserted, one taken
  // out for release, part of one returned to the OS. Lock-free: poll it and
  // call chunks() when it moved. Starts at 0.
  uint64_t chunk_generation() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry
