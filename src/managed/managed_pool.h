// managed_pool.h — the bookkeeping of ferry's pooled device-side allocator
// (the `managed_pool` PyTorch allocator): size-class blocks carved from big
// chunks, with stream-ordered reuse. No CUDA here: chunks come from a callback
// (cudaMallocManaged in src/cuda/managed/managed_allocator.cpp, plain host memory in the
// tests), and "the freeing stream's work is done" is an opaque Fence that the
// CUDA layer implements with an event recorded on the freeing stream.
//
// Sizes. A request of n bytes takes a block of size_class(n): at least 512 B;
// four classes per power of two (waste <= 25%); above 2 MiB also every multiple
// of 2 MiB, whichever is smaller (a 4.6 GiB tensor wastes < 2 MiB). Requests
// of classes <= 1 MiB ("small") are carved from chunks of 2 MiB, larger ones
// from chunks of max(chunk_bytes, class rounded up to 2 MiB); small and large
// blocks never share a chunk, so small tensors do not pin big chunks (trim).
//
// States of a block (the chunk is tiled by its blocks, in address order):
//   allocated  handed out; remembers its stream and the requested size.
//   pending    freed on stream S with fence F: reusable at once by S (stream
//              order covers the earlier work), by another stream only when
//              F.ready(), or when F.order_before(other) made that stream wait.
//   idle       freed and its fence seen ready (or freed with no fence):
//              reusable by any stream.
// Transitions: allocate: idle|pending -> allocated (split off the rest, which
// keeps its state); deallocate: allocated -> pending (fence) | idle (none);
// poll: pending -> idle when its fence is ready. Adjacent free blocks merge
// when both are idle, or both pending on the same stream (the merged block
// keeps the later fence: on one stream a later event covers the earlier).
// Invariant (check() verifies it): no two neighbours are mergeable.
//
// Allocation order: poll other streams' fences (pending -> idle where ready;
// fences of one stream must complete in the order they were made, as events
// on one stream do, so only the latest of a stream is queried when it is
// ready); best fit among idle blocks and the stream's own pending blocks; else
// (stream_wait) take another stream's pending block after making this stream
// wait on its fence; else a new chunk; if the chunk source throws
// OutOfMemory, trim() and retry once.
//
// Locking: one mutex (mu_) protects everything below it. Fence::ready() and
// Fence::order_before() are called with mu_ held: they must not block and must
// not call back into the pool (cudaEventQuery / cudaStreamWaitEvent qualify;
// PyTorch's CUDACachingAllocator queries its events under its mutex too).
// Fences are destroyed after mu_ is released. The chunk source is called with
// mu_ released.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pool/pool.h"  // Counter

namespace ferry {

// A stream's identity (the cudaStream_t value in the CUDA layer).
using StreamId = std::uintptr_t;

// "The work enqueued on the freeing stream before the free is done."
class Fence {
 public:
  virtual ~Fence() = default;
  // Non-blocking: true once that work is complete.
  virtual bool ready() noexcept = 0;
  // Make `stream` wait for that work (its later work runs after it). False
  // when it cannot; then the block is not taken.
  virtual bool order_before(StreamId stream) noexcept = 0;
};

// Where chunks come from. obtain() may throw (ferry::OutOfMemory makes the
// pool trim and retry once); the memory must be at least 512-byte aligned.
// release() gets back exactly what obtain() gave.
struct ChunkSource {
  std::function<void*(size_t bytes, StreamId stream)> obtain;
  std::function<void(void* base, size_t bytes)> release;  // must not throw
};

struct ManagedPoolOptions {
  size_t chunk_bytes = 64u << 20;       // large chunks; multiple of 2 MiB
  size_t small_chunk_bytes = 2u << 20;  // chunks of small blocks; multiple of 2 MiB
  bool stream_wait = true;              // reuse other streams' pending blocks via order_before
};

struct ManagedPoolStats {
  Counter allocated;  // bytes in allocated blocks (class sizes)
  Counter requested;  // bytes asked for by the live allocations
  Counter reserved;   // bytes in chunks
  uint64_t allocations = 0, frees = 0;
  uint64_t chunk_obtains = 0, chunk_releases = 0, chunk_failures = 0;
  uint64_t reuse_same_stream = 0;  // pending blocks reused by their own stream
  uint64_t reuse_after_fence = 0;  // blocks that became idle because their fence was ready
  uint64_t reuse_by_wait = 0;      // other streams' blocks taken after order_before
  uint64_t prefetched_bytes = 0, prefetches = 0;  // noted by the caller (note_prefetch)
  size_t chunks = 0, idle_blocks = 0, pending_blocks = 0, live_blocks = 0;
};

class ManagedPool {
 public:
  static constexpr size_t kMinBlock = 512;
  static constexpr size_t kGranule = 2u << 20;
  static constexpr size_t kSmallMax = 1u << 20;  // classes up to this are "small"

  // Throws InvalidArgument for bad options or a source without both callbacks.
  ManagedPool(ManagedPoolOptions options, ChunkSource source);
  // Releases every chunk (live blocks become invalid).
  ~ManagedPool();
  ManagedPool(const ManagedPool&) = delete;
  ManagedPool& operator=(const ManagedPool&) = delete;

  // The block size a request of n bytes takes. InvalidArgument for 0 or absurd n.
  static size_t size_class(size_t n);

  struct Block {
    void* ptr = nullptr;
    size_t size = 0;          // size_class(n)
    bool new_chunk = false;   // carved from a chunk obtained for this request
    // The part of the chunk this block should prefetch: from the first to the
    // last 2 MiB granule it covers that no earlier block prefetched (clipped
    // to the chunk; empty when all were). The pool marks them at once, so a
    // reused block never prefetches again: re-prefetching resident memory
    // still costs the driver time in proportion to its size.
    void* prefetch_ptr = nullptr;
    size_t prefetch_bytes = 0;
  };
  // Preconditions: n > 0. Throws InvalidArgument (n), or what the source threw.
  Block allocate(size_t n, StreamId stream);

  // Frees p on `stream`. fence: the freeing stream's work up to now (nullptr:
  // already done, the block is idle at once). A pointer that is not a live
  // allocation of this pool (foreign, interior, double free) throws
  // InvalidArgument and changes nothing.
  void deallocate(void* p, StreamId stream, std::unique_ptr<Fence> fence);

  // Releases every chunk that is wholly free once ready fences are polled;
  // returns the bytes released. Chunks with pending work are kept.
  size_t trim();

  // Size of the live allocation at p (its block), or 0 if p is not one.
  size_t allocation_size(const void* p) const;

  void set_options(const ManagedPoolOptions& options);  // applies to later chunks
  ManagedPoolOptions options() const;

  void note_prefetch(size_t bytes) noexcept;
  ManagedPoolStats stats() const;

  // "" when every invariant holds, else the first violation (tests).
  std::string check() const;

 private:
  struct Chunk;
  struct Node {
    uintptr_t addr = 0;
    size_t size = 0;
    Chunk* chunk = nullptr;
    Node* prev = nullptr;  // address neighbours inside the chunk
    Node* next = nullptr;
    enum class State { allocated, idle, pending } state = State::idle;
    StreamId stream = 0;             // allocated: allocating stream; pending: freeing stream
    std::unique_ptr<Fence> fence;    // pending only (may be null only when idle)
    uint64_t seq = 0;                // pending: order of the free (later covers earlier)
    size_t requested = 0;            // allocated only
  };
  struct Chunk {
    uintptr_t base = 0;
    size_t size = 0;
    bool small = false;
    Node* first = nullptr;
    std::vector<bool> prefetched;  // per kGranule from base: handed out to a block before
  };
  using Key = std::pair<size_t, uintptr_t>;  // (size, address): best fit, deterministic
  using FreeSet = std::set<Key>;
  using Graveyard = std::vector<std::unique_ptr<Fence>>;  // destroyed after mu_ is released

  static void validate(const ManagedPoolOptions& o);
  Node* find_locked(size_t cls, bool small, StreamId stream, Graveyard& g);
  Block carve_locked(Node* n, size_t cls, size_t requested, StreamId stream, Graveyard& g);
  void claim_prefetch_locked(const Node& n, Block& b);
  void insert_free_locked(Node* n);
  void erase_free_locked(Node* n);
  Node* coalesce_locked(Node* n, Graveyard& g);
  bool mergeable(const Node* a, const Node* b) const;
  Node* merge_locked(Node* a, Node* b, Graveyard& g);  // a directly before b
  size_t poll_locked(int kind, StreamId except, bool all_streams, Graveyard& g);
  Node* add_chunk_locked(void* base, size_t bytes, bool small);
  std::vector<std::pair<void*, size_t>> take_free_chunks_locked(Graveyard& g);

  ChunkSource source_;

  mutable std::mutex mu_;  // protects everything below
  ManagedPoolOptions opts_;
  std::map<uintptr_t, std::unique_ptr<Chunk>> chunks_;
  std::unordered_map<uintptr_t, std::unique_ptr<Node>> nodes_;  // every block, by address
  std::unordered_map<uintptr_t, Node*> live_;                   // allocated blocks
  FreeSet idle_[2];                                             // [small?1:0]
  std::unordered_map<StreamId, FreeSet> pending_[2];            // by freeing stream
  uint64_t seq_ = 0;
  ManagedPoolStats stats_;
};

}  // namespace ferry
