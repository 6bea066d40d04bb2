// node_region.h — the bytes every process of a node pool maps: a header, the
// members, the named blocks, one owner and one length per granule, then the
// data. Everything a process needs to allocate, free, or find who holds what
// lies here, in the memfd, so that no process is special: the pool works on
// while any member lives, and a member killed at any instruction leaves state
// the next lock holder can repair.
//
// Locking: Header::lock, a robust process-shared mutex, guards everything in
// the region but the data and the user's signal words. A holder that dies
// leaves it EOWNERDEAD: the next locker calls repair(), which rebuilds every
// derived field from the granule arrays (the truth) and drops what a
// half-done step left. No system call but fcntl/futex under it; no CUDA.
//
// A block: granules [first, first + count). Committed when head[first] ==
// count (written last on allocation, cleared first on free); owner[g] names
// its holder for every granule: member slot + 1, or kNamedOwner for a named
// block (held by a set of members, freed when the last lets go).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <pthread.h>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::node {

constexpr uint64_t kMagic = 0x3150444f4e595246ull;  // "FRYNODP1", little end first
constexpr uint32_t kVersion = 2;  // 2: Header::page_bytes
constexpr uint32_t kMaxMembers = 256;
constexpr uint32_t kMaxNamed = 1024;
constexpr size_t kLabelBytes = 40;
constexpr size_t kKeyBytes = 72;
constexpr uint16_t kNamedOwner = 0xFFFF;
constexpr uint64_t kNone = ~uint64_t{0};

struct Member {  // one process attached to the region
  uint32_t live;   // 1 while a process holds this slot
  int32_t pid;     // in the pid namespace of the process that attached
  uint64_t bytes;  // unnamed blocks it owns
  uint32_t blocks;
  uint32_t named;  // named blocks it holds
  char label[kLabelBytes];
};
static_assert(sizeof(Member) == 64);

struct Named {  // a block found by key; held by a set of members
  uint32_t used;
  uint32_t pad;
  uint64_t first, count;
  uint64_t holders[kMaxMembers / 64];
  char key[kKeyBytes];
};
static_assert(sizeof(Named) == 128);

struct Header {
  uint64_t magic;
  uint32_t version;
  uint32_t creator_pid;
  uint64_t capacity;      // data bytes: the node-wide budget
  uint64_t granule;       // allocation unit and alignment, bytes
  uint64_t granules;      // capacity / granule
  uint64_t owner_offset;  // uint16_t[granules]
  uint64_t head_offset;   // uint32_t[granules]
  uint64_t data_offset;   // 2 MiB aligned
  uint64_t file_bytes;    // a multiple of 2 MiB (a hugetlb file's must be)
  uint64_t page_bytes;    // the file's pages: 2 MiB (hugetlb) or 4 KiB (shmem, THP or not)
  uint64_t used_granules;
  uint64_t next_fit;      // where the next search starts
  uint64_t repairs;       // times a dead lock holder was repaired after
  pthread_mutex_t lock;
};

struct HolderInfo {  // "who holds what", for messages and stats
  uint32_t slot;
  int pid;
  std::string label;
  uint64_t bytes;
  uint32_t blocks;
  uint32_t named;
};

// The bytes of the longest prefix of `text` that fits `max_bytes`, stops
// before any NUL and does not split a UTF-8 character (every process decodes
// the labels: a label cut inside a character made Python's stats() fail in
// all of them, issue 38). Text that is not UTF-8 is cut at max_bytes.
size_t utf8_prefix_bytes(std::string_view text, size_t max_bytes);

// A view of a mapped region. Every method but layout/init/header_problem/lock
// requires the lock held.
class Region {
 public:
  struct Layout {
    uint64_t granules, owner_offset, head_offset, data_offset, file_bytes;
  };
  static Layout layout(uint64_t capacity, uint64_t granule);

  explicit Region(void* base) : base_(static_cast<char*>(base)) {}
  // Writes an empty region over zeroed memory (the creator, before anyone can attach).
  void init(uint64_t capacity, uint64_t granule, int creator_pid, uint64_t page_bytes);
  // Why the header is not one init() wrote for a file of `file_bytes` ("" if it
  // is): an attacher checks the region it was handed before it trusts an offset.
  std::string header_problem(uint64_t file_bytes) const;

  Header& header() const { return *reinterpret_cast<Header*>(base_); }
  Member& member(uint32_t slot) const;
  Named& named(uint32_t index) const;
  char* data() const { return base_ + header().data_offset; }

  // Lock the region; returns true when the previous holder died holding it
  // (repair() has run then).
  bool lock();
  // The same, waiting at most timeout_ns (negative: no limit): 0, or
  // ETIMEDOUT. *repaired: as lock() returns.
  int lock_for(int64_t timeout_ns, bool* repaired);
  void unlock();

  // label: cut to kLabelBytes - 1 bytes at a character boundary (utf8_prefix_bytes).
  uint32_t claim_member(int pid, const std::string& label);  // kMaxMembers when full
  bool has_live_member() const;
  void release_member(uint32_t slot);                          // frees what it owns, drops its holds

  uint64_t allocate(uint32_t slot, uint64_t count);  // first granule, or kNone when no run is free
  // The block starting at granule `first`: its count, and its owner; 0 count: none.
  uint64_t block_count(uint64_t first) const;
  uint16_t block_owner(uint64_t first) const;
  void free_block(uint64_t first);  // a committed unnamed block
  void give(uint64_t first, uint32_t slot);  // an unnamed block changes owner

  uint32_t find_named(const std::string& key) const;  // kMaxNamed when absent
  uint32_t create_named(const std::string& key, uint64_t first, uint64_t count, uint32_t slot);
  uint32_t named_of_block(uint64_t first) const;       // kMaxNamed when none
  void hold_named(uint32_t index, uint32_t slot);
  bool holds_named(uint32_t index, uint32_t slot) const;
  void drop_named(uint32_t index, uint32_t slot);      // frees the block after the last holder

  uint64_t largest_free_run() const;
  std::vector<HolderInfo> holders() const;
  // Rebuilds counters, owners, named entries and members' totals from the
  // committed blocks; frees granules no committed block covers.
  void repair();

 private:
  uint16_t* owner() const { return reinterpret_cast<uint16_t*>(base_ + header().owner_offset); }
  uint32_t* head() const { return reinterpret_cast<uint32_t*>(base_ + header().head_offset); }
  void free_granules(uint64_t first, uint64_t count);

  char* base_;
};

}  // namespace ferry::node
