// pool_options.h — what a pool is asked for: chunk backing and kind, the
// huge page policy, and PoolOptions (validated in pool_options.cpp). Below the
// pool: the arena takes these, and knows nothing of the pool itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ferry {

class Options;

// What a chunk is backed by; fixed when the chunk is reserved.
enum class Backing { small_pages, thp, hugetlb_2m, hugetlb_1g };
const char* backing_name(Backing b) noexcept;

// Accounting kind: huge (THP or hugetlb chunks) or small (MADV_NOHUGEPAGE).
enum class PageKind { small = 0, huge = 1 };

// What an allocation asks for. automatic = huge for >= 2 MiB; below 2 MiB
// small, except in a pool with a target, where it is the target's kind (so a
// target serves small allocations too instead of a new small chunk).
enum class HugeWant { automatic, yes, no };

// How huge chunks get their huge pages.
enum class HugePolicy { automatic, hugetlb, thp, off };
// "auto", "hugetlb", "thp", "off" (FERRY_HUGE_PAGES's words); else InvalidArgument.
HugePolicy parse_huge_policy(const std::string& text);

inline constexpr int kMaxNumaNode = 1023;  // Linux: at most 1024 NUMA nodes
// PoolOptions::numa_node for "no binding, not even the GPU's node": -1 already
// means the GPU's node for pinned pools, so "none" needs its own value.
inline constexpr int kNumaNeverBind = -2;

struct PoolOptions {
  size_t chunk_bytes = 64u << 20;     // multiple of 2 MiB
  bool memfd = false;                 // back chunks by memfd (MAP_SHARED) instead of anonymous memory
  HugePolicy huge_pages = HugePolicy::automatic;
  size_t limit_bytes = 0;             // hard limit on reserved bytes; 0 = none
  bool zero_recycled = false;         // zero every recycled range before handing it out (else only where allocate(zero=true) asks)
  int touch_threads = 0;              // 0 = one per core, at most 16
  int64_t release_delay_ms = 0;       // background release of chunks free this long; 0 = off
  size_t release_batch_bytes = 128u << 20;  // cap per background round
  int numa_node = -1;                 // bind chunks to this node (mbind), 0 .. 1023; -1 = no binding
                                      // (pinned pools: the GPU's node), kNumaNeverBind
  // The target: ONE chunk of target_bytes (rounded up to 2 MiB), reserved,
  // touched and registered (one registration) in the background at creation;
  // it serves any allocation up to its size, or many smaller ones.
  size_t target_bytes = 0;
  HugeWant target_kind = HugeWant::yes;  // kind of the target chunk
  // With hooks: the hook (registration) of a new chunk starts once this many
  // bytes from its base are touched, while the rest is touched. 0 = at once;
  // >= the chunk's size = after the whole chunk is touched (so chunks of the
  // default 64 MiB register after their touch; a target or a big
  // allocation's own chunk overlaps the two).
  size_t register_lead_bytes = 64u << 20;

  // Throws InvalidArgument naming the field and quoting the value when one is
  // out of range (chunk_bytes, touch_threads, release_delay_ms, numa_node), and
  // OutOfMemory when target_bytes exceeds the machine's memory. Pool() calls it.
  void validate() const;

  // Defaults from the FERRY_* options (core/options.h); throws InvalidArgument.
  static PoolOptions from_environment();
  // The same from parsed options (pure; from_environment() is from_options(options())).
  static PoolOptions from_options(const Options& options);
};

}  // namespace ferry
