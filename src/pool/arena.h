// arena.h — chunks from the OS: which backing a new chunk gets, mapping,
// advice and NUMA binding; giving chunks, or parts of them, back.
//
// A chunk is 2 MiB aligned, a multiple of 2 MiB, huge or small for its whole
// life. Backing by policy, first choice first:
//   huge, automatic:  hugetlb 1 GiB (chunk a multiple of 1 GiB, enough free pages)
//                     -> hugetlb 2 MiB (enough free pages) -> THP -> small pages
//   huge, hugetlb:    hugetlb 1 GiB -> hugetlb 2 MiB, else NotSupported / OsError
//   huge, thp:        THP -> small pages;   huge, off: small pages, no advice
//   small:            small pages with MADV_NOHUGEPAGE
// THP is MADV_HUGEPAGE on anonymous memory (enabled=always|madvise) or on a
// memfd (shmem_enabled=always|within_size|advise|force).
// Fork: a chunk that will be pinned (the pool has ChunkHooks) and is
// private (anonymous, hugetlb included) is hidden from fork() with
// MADV_DONTFORK, at mapping, before it is touched or pinned: the kernel would
// copy every pinned page of it into each forked child (os/dont_fork.h says
// what the child finds there instead). A memfd chunk is MAP_SHARED: a child
// shares its pages, nothing is copied. Chunks of a pool without hooks are
// ordinary copy-on-write memory, as malloc's.
//
// When the kernel refuses a choice (no hugetlb pool or no free pages, hugetlb
// mmap failed, THP disabled in sysfs, madvise failed, mbind failed) the arena
// takes the next one, REMEMBERS the refusal for its lifetime (mimalloc style:
// the refused feature is not tried again for each chunk), counts a fallback
// and keeps a note "what was refused; what is used instead". Too few (but
// some) free hugetlb pages for one chunk is noted but not remembered, since a
// smaller chunk may fit later; so is a transient madvise failure (EAGAIN,
// ENOMEM): that chunk goes without the advice, the next one asks again.
//
// Locking: mu_ guards the remembered refusals, the notes and the fallback
// count; it is a leaf (the pool may hold its own mutex around notes() and
// fallbacks()) and is never held across a system call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "pool/pool_options.h"

namespace ferry {

struct MappedChunk {
  uintptr_t base = 0;
  size_t bytes = 0;
  PageKind kind = PageKind::small;
  Backing backing = Backing::small_pages;
  int fd = -1;            // the chunk's memfd; -1 for anonymous memory
  uint64_t touch_ns = 0;  // time its first touch took (set by the pool)
  uint64_t register_ns = 0;  // time ChunkHooks::on_chunk_ready took (set by the pool)
};

class Arena {
 public:
  // Preconditions: options validated by the pool. pinned: the pool registers
  // its chunks (ChunkHooks), so private chunks are hidden from fork().
  explicit Arena(const PoolOptions& options, bool pinned = false);

  // Maps a chunk of `bytes` for `kind` and binds it to the NUMA node; its
  // pages are not touched yet (the pool touches them with FirstTouch, so that
  // the registration can overlap the touch). Throws OsError (mmap or
  // memfd_create failed) or NotSupported (hugetlb policy and no usable
  // hugetlb pages); then nothing stays mapped.
  // Preconditions: bytes a nonzero multiple of 2 MiB.
  // Locking: the caller holds no lock (system calls); takes mu_ briefly.
  MappedChunk map_chunk(size_t bytes, PageKind kind);

  // map_chunk() and the first touch of the whole chunk (FirstTouch, all
  // threads), timed into touch_ns. Throws as map_chunk() does, or OsError
  // when the touch fails; then nothing stays mapped.
  MappedChunk reserve(size_t bytes, PageKind kind);

  // Threads that first-touch a chunk (options.touch_threads, or one per core
  // up to 16).
  int touch_threads() const noexcept { return touch_threads_; }

  // Unmaps the chunk and closes its memfd.
  void unmap(const MappedChunk& chunk) noexcept;

  // Gives [begin, begin + bytes) of the chunk back to the OS (MADV_DONTNEED,
  // or MADV_REMOVE for a memfd); it reads as zero afterwards. 0 or an errno.
  // Preconditions: the range lies in the chunk, aligned to page_bytes(backing).
  int release_pages(const MappedChunk& chunk, uintptr_t begin, size_t bytes) noexcept;

  // The page size of a backing: the granule of a partial release.
  static size_t page_bytes(Backing backing) noexcept;

  std::vector<std::string> notes() const;
  uint64_t fallbacks() const;

 private:
  enum Feature { kHugetlb1G, kHugetlb2M, kThp, kNoHugeAdvice, kNumaBinding, kDontFork, kFeatureCount };

  struct Mapping {
    uintptr_t base = 0;
    int fd = -1;
  };

  // A backing choice refused for a chunk: the feature, why, and whether
  // later chunks skip it.
  struct Refusal {
    Feature feature;
    std::string reason;
    bool remember;
  };
  // One try of a backing choice: mapped (with the backing it got) or not,
  // and the refusal to note; a mapped chunk may carry one too (THP advice).
  struct Attempt {
    bool mapped = false;
    Mapping mapping;
    Backing backing = Backing::small_pages;
    std::optional<Refusal> refusal;
  };

  std::vector<Backing> choices(size_t bytes, PageKind kind) const;
  // map_chunk's steps: one choice of backing, by kind of backing; each throws
  // OsError where map_chunk does (a failed mmap of small or THP pages).
  Attempt try_backing(Backing choice, size_t bytes, PageKind kind);
  Attempt map_hugetlb(Backing choice, size_t bytes);
  Attempt map_thp(size_t bytes);
  Attempt map_small_pages(size_t bytes, PageKind kind);
  // map() of small pages, or OsError.
  Mapping map_or_throw(size_t bytes) const;
  // mbind to the arena's NUMA node, if it has one (a refusal is remembered).
  void bind_to_numa_node(const Mapping& m, size_t bytes);
  // A madvise that failed: a transient error (EAGAIN, ENOMEM) noted for this
  // chunk only ("<this_chunk>, the next one tries again"), any other
  // remembered ("<from_now_on>").
  void advice_failed(Feature f, const char* advice, int err, size_t bytes, const char* this_chunk,
                     const char* from_now_on);
  bool refused(Feature f) const;
  // Records a fallback: counts it, adds the note once, remembers the refusal
  // when `remember`.
  void fall_back(Feature f, const std::string& note, bool remember);
  // Why THP cannot be used ("" when it can), reading sysfs on first use.
  std::string thp_unusable();
  // Anonymous or memfd memory with small pages, or with hugetlb pages of
  // huge_page_bytes. 0 or an errno; *call names the call that failed.
  int map(size_t bytes, size_t huge_page_bytes, Mapping* out, const char** call) const;
  void unmap(const Mapping& m, size_t bytes) const noexcept;
  // MADV_DONTFORK for a pinned pool's private chunk (see above).
  void hide_from_fork(const Mapping& m, size_t bytes);

  const bool memfd_;
  const bool pinned_;
  const HugePolicy policy_;
  const int numa_node_;
  const int touch_threads_;

  mutable std::mutex mu_;
  bool refused_[kFeatureCount] = {};  // mu_
  bool thp_checked_ = false;          // mu_: sysfs THP setting read and found usable
  std::vector<std::string> notes_;    // mu_
  uint64_t fallbacks_ = 0;            // mu_
};

}  // namespace ferry
