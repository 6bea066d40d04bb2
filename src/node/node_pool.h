// node_pool.h — one pool of host memory per node, shared by every process
// (rank) that opens it by name: what one allocates, all can reach by a handle
// (the block's offset), and allocations of all count against one budget.
//
// How: the creator makes a memfd (no /dev/shm, no file) holding a Region
// (node/node_region.h) and its data; every member maps it MAP_SHARED, so the
// data pages exist once. Processes meet in a directory only this user may
// enter (node/node_dir.h: FERRY_NODE_DIR, else /tmp/ferry-<euid>, mode 0700):
// every member listens on a Unix socket there, <name>.<slot>, and hands the
// memfd (SCM_RIGHTS) to a peer of its own uid; the attacher checks the
// member's uid too (SO_PEERCRED) and that the memfd is its uid's, so no other
// user can serve, block or stall an open. An open holds the pool's open lock
// (<name>.lock, a record lock) from its first look at the members until it
// serves, so two processes never both decide "nobody serves it, create" and
// nobody creates while an attacher is on its way in; an attacher that finds
// the region's last member gone by the time it joins drops it and looks again.
// A member that cannot serve (no descriptor left for its socket) fails its
// open. Every wait of an open (the lock, a member's answer, the region's
// lock) ends at the open's deadline (attach_timeout_s). Every member serves
// from one idle thread, so the pool outlives its creator.
// Each member holds a POSIX record lock on its slot's byte of the memfd: the
// kernel drops it when the process dies, SIGKILL included, which is how the
// others tell a dead member (F_GETLK) and reclaim its blocks. The memory goes
// away when the last member closes or exits.
//
// Blocks: allocate() gives an unnamed block owned by this process (freed when
// it frees it, or when the owner exits or dies; take() moves ownership, so a
// consumer can keep what a producer made); allocate_named() finds or makes a
// block by key, held by every process that asked for it and freed when the
// last lets go. Signal words (add, wait_at_least) are 32-bit counters in the
// data that any member can bump and wait on (futex), for completions.
//
// Pinning is not here (no CUDA in this layer): the CUDA layer registers the
// ranges a process touches (cuda/node_registrar.h).
//
// Fork: the mapping is hidden from children (os/dont_fork.h: a tombstone in
// the child); a NodePool used in a forked child raises NotSupported, and its
// destruction there releases nothing (the serving thread's handle is
// forgotten: that thread exists only in the parent).
//
// Locking: Region's robust mutex guards the shared state (node_region.h);
// this object's own fields are set at open and read-only after, but for
// server_ (the serving thread, joined once, in the destructor) and stopping_.
// The process-wide registry of open pools has its own mutex, held across fork.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "node/node_region.h"
#include "pool/pool_options.h"

namespace ferry::node {

constexpr size_t kZeroedHeadBytes = 4096;

// A timeout of no limit. Timeouts are seconds: infinity, or anything over
// 10^9 s (31 years), is no limit (the clock never overflows); NaN and
// negative ones are refused, but for wait_at_least's (see there).
constexpr double kForever = std::numeric_limits<double>::infinity();

struct NodePoolOptions {
  // The creator's: the node-wide budget (bytes of data; rounded up to the
  // granule) and the allocation unit. An attacher's 0 means "whatever it is";
  // a non-zero one that differs from the pool's is refused.
  size_t capacity = 0;
  size_t granule = size_t{64} << 10;
  std::string label;            // this process in messages (e.g. "rank 3"); default "pid N"
                                // (cut to 39 bytes at a UTF-8 character boundary)
  // The longest the open waits, in all: for another process's open of the same
  // name to finish (a concurrent creator), for a member to answer, for the
  // region's lock. kForever: no limit; negative or NaN: InvalidArgument.
  double attach_timeout_s = 10;
  // Where processes meet (node/node_dir.h); "": FERRY_NODE_DIR, else /tmp/ferry-<euid>.
  std::string dir;
  // The creator's: the data's pages. automatic: 2 MiB hugetlb pages when
  // enough are free for the whole file, else shmem with MADV_HUGEPAGE (THP
  // where shmem_enabled allows it, 4 KiB pages otherwise); hugetlb: those or
  // NotSupported; thp: shmem with MADV_HUGEPAGE; off: plain shmem. Huge pages
  // pin 2.5x faster (docs/findings.md) and fault 512x less often.
  HugePolicy huge_pages = HugePolicy::automatic;
};

struct NodeBlock {
  uint64_t offset = 0;  // from the start of the data: the handle other processes open it by
  uint64_t bytes = 0;   // whole granules
};

struct NodePoolStats {
  uint64_t capacity = 0, granule = 0, used = 0, largest_free = 0, repairs = 0;
  uint64_t page_bytes = 0;  // 2 MiB: hugetlb; 4 KiB: shmem (THP, where allowed, is not told apart)
  uint32_t slot = 0;
  bool created = false;  // this process made the region
  std::vector<HolderInfo> members;
};

class NodePool {
 public:
  // Attaches to the pool `name` if a live member serves it, else creates it
  // (then options.capacity must be > 0). One object per name per process:
  // a second open() of the same name returns the first (options must agree).
  // name: 1-64 characters of [A-Za-z0-9._-]. OsError(ETIMEDOUT) when live
  // members do not answer (stopped, in a debugger) or another open of the
  // name does not finish by the deadline: never a second pool of the name.
  static std::shared_ptr<NodePool> open(const std::string& name, const NodePoolOptions& options);
  ~NodePool();
  NodePool(const NodePool&) = delete;
  NodePool& operator=(const NodePool&) = delete;

  const std::string& name() const { return name_; }
  char* data() const { return data_; }
  uint64_t capacity() const { return capacity_; }
  uint64_t granule() const { return granule_; }
  uint32_t slot() const { return slot_; }
  void* region_base() const { return map_; }  // the header's address (tests)
  // In a forked child only (inside fork): closes this object's listening
  // socket and memfd, which the child inherited and must not keep.
  void drop_descriptors_in_child() noexcept;

  // Throws OutOfMemory naming every holder when the budget (or a long enough
  // free run) is short, after reclaiming dead members' blocks.
  NodeBlock allocate(size_t bytes);
  // Finds the live block named `key` (sizes must agree) or makes it; this
  // process holds it until release(). *created: whether it was made here.
  // A block made here has its first kZeroedHeadBytes zeroed before any other
  // process can find it (room for signal words); the rest is as it was
  // (memory recycled from earlier blocks is not cleared).
  NodeBlock allocate_named(const std::string& key, size_t bytes, bool* created = nullptr);
  // The live block that starts at `offset` (a handle from another process).
  NodeBlock find(uint64_t offset) const;
  // Unnamed: frees it (any member may). Named: this process lets go.
  void release(uint64_t offset);
  // This process becomes the owner of an unnamed block.
  void take(uint64_t offset);

  // Frees the blocks and holds of members that died; the bytes freed.
  uint64_t reclaim_dead();
  // Reclaims dead members first, so `members` lists the living.
  NodePoolStats stats();
  // "pid 12 (rank 0): 3 blocks, 8.0 GiB; ..." for messages.
  std::string describe_holders() const;

  // Signal words: the 32-bit word at data() + offset (4-byte aligned, inside
  // the data). add() returns the value before and wakes every waiter.
  uint32_t add(uint64_t offset, uint32_t n);
  uint32_t load(uint64_t offset) const;
  // Waits until the word is >= value; false on timeout. timeout_s: seconds;
  // kForever (infinity, or over 10^9 s): no limit; NaN: InvalidArgument.
  // Negative: no limit as well, the C API's documented rule (ferry.h); the
  // Python API refuses negatives before it calls and passes kForever.
  bool wait_at_least(uint64_t offset, uint32_t value, double timeout_s) const;

 private:
  NodePool(std::string name, std::string dir, int fd, void* map, size_t map_bytes, bool created);
  // Takes a member slot (its record lock and label) and serves attachers.
  // Throws RegionGone (node_pool.cpp) when this attacher finds no live member
  // left in the region; any other failure throws and leaves nothing behind.
  void join(const std::string& label, double timeout_s, int64_t timeout_ns);
  void start_serving();
  void stop_serving() noexcept;
  bool leave() noexcept;  // true when no live member is left
  void remove_open_lock_file() noexcept;
  void lock() const;  // the region's lock; reclaims dead members after a repair
  void check_usable(const char* what) const;
  void serve();
  uint32_t* word(uint64_t offset, const char* what) const;
  NodeBlock checked_block(uint64_t offset, const char* what) const;
  uint64_t reclaim_dead_locked();
  std::string out_of_memory(size_t bytes, const char* what) const;

  std::string name_;
  std::string dir_;          // where processes meet (node_dir.h)
  std::string socket_path_;  // this member's socket, once it listens
  int fd_;
  void* map_;
  size_t map_bytes_;
  bool created_;
  mutable Region region_;
  char* data_;  // copied from the header at open: a forked child must not read the region
  uint64_t capacity_, granule_;
  uint32_t slot_ = kMaxMembers;
  int listen_fd_ = -1;
  std::atomic<bool> stopping_{false};  // the destructor is shutting the socket down
  std::thread server_;
  uint64_t generation_;  // fork_generation() at open
};

}  // namespace ferry::node
