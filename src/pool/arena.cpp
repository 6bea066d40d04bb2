// arena.cpp — backing choice with remembered fallbacks, and the chunk's
// mapping, advice, binding and release (the first touch: pool/first_touch.h).
#include "pool/arena.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "core/thread_counts.h"
#include "os/dont_fork.h"
#include "os/memory.h"
#include "os/sysfs.h"
#include "pool/first_touch.h"

namespace ferry {
namespace {

const char* choice_name(Backing b) {
  switch (b) {
    case Backing::small_pages: return "small pages";
    case Backing::thp: return "THP";
    case Backing::hugetlb_2m: return "hugetlb 2 MiB";
    case Backing::hugetlb_1g: return "hugetlb 1 GiB";
  }
  return "?";
}

// A refusal the kernel may not repeat (memory pressure, a busy mm): the chunk
// goes without, the next chunk tries again. Anything else is remembered.
bool transient(int err) { return err == EAGAIN || err == ENOMEM; }

std::string errno_text(int err) { return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")"; }

}  // namespace

Arena::Arena(const PoolOptions& options, bool pinned)
    : memfd_(options.memfd),
      pinned_(pinned),
      policy_(options.huge_pages),
      numa_node_(options.numa_node),
      touch_threads_(options.touch_threads > 0 ? options.touch_threads
                                               : default_thread_count(os::usable_cores())) {}

size_t Arena::page_bytes(Backing backing) noexcept {
  switch (backing) {
    case Backing::small_pages: return os::kSmallPageBytes;
    case Backing::thp:
    case Backing::hugetlb_2m: return os::kHugePage2MBytes;
    case Backing::hugetlb_1g: return os::kHugePage1GBytes;
  }
  return os::kSmallPageBytes;
}

std::vector<Backing> Arena::choices(size_t bytes, PageKind kind) const {
  if (kind == PageKind::small) return {Backing::small_pages};
  std::vector<Backing> out;
  const bool hugetlb_wanted = policy_ == HugePolicy::automatic || policy_ == HugePolicy::hugetlb;
  // 1 GiB pages only when hugetlb is asked for: the kernel zeroes each one on
  // one thread at first touch, so a 1 GiB chunk took 282 ms to touch on the
  // H200 machine against 35 ms with 2 MiB pages touched in parallel.
  if (policy_ == HugePolicy::hugetlb && bytes % os::kHugePage1GBytes == 0) out.push_back(Backing::hugetlb_1g);
  if (hugetlb_wanted) out.push_back(Backing::hugetlb_2m);
  if (policy_ == HugePolicy::automatic || policy_ == HugePolicy::thp) out.push_back(Backing::thp);
  if (policy_ != HugePolicy::hugetlb) out.push_back(Backing::small_pages);
  return out;
}

bool Arena::refused(Feature f) const {
  std::lock_guard lock(mu_);
  return refused_[f];
}

void Arena::fall_back(Feature f, const std::string& note, bool remember) {
  std::lock_guard lock(mu_);
  ++fallbacks_;
  if (remember) refused_[f] = true;
  if (std::find(notes_.begin(), notes_.end(), note) == notes_.end()) notes_.push_back(note);
}

std::vector<std::string> Arena::notes() const {
  std::lock_guard lock(mu_);
  return notes_;
}

uint64_t Arena::fallbacks() const {
  std::lock_guard lock(mu_);
  return fallbacks_;
}

std::string Arena::thp_unusable() {
  {
    std::lock_guard lock(mu_);
    if (thp_checked_) return "";
  }
  std::string setting;
  const int err = memfd_ ? os::read_thp_shmem_enabled(&setting) : os::read_thp_enabled(&setting);
  const char* file = memfd_ ? "shmem_enabled" : "enabled";
  if (err != 0)
    return std::string("THP: cannot read /sys/kernel/mm/transparent_hugepage/") + file + " (" +
           std::strerror(err) + ")";
  const bool usable = memfd_ ? (setting == "always" || setting == "within_size" ||
                                setting == "advise" || setting == "force")
                             : (setting == "always" || setting == "madvise");
  if (!usable)
    return std::string(memfd_ ? "THP for memfd" : "THP") + ": transparent_hugepage/" + file +
           " is " + setting;
  std::lock_guard lock(mu_);
  thp_checked_ = true;
  return "";
}

int Arena::map(size_t bytes, size_t huge_page_bytes, Mapping* out, const char** call) const {
  if (!memfd_) {
    void* p = nullptr;
    *call = "mmap";
    const int err = huge_page_bytes ? os::map_hugetlb(bytes, huge_page_bytes, &p)
                                    : os::map_anonymous(bytes, os::kHugePage2MBytes, &p);
    if (err == 0) *out = Mapping{reinterpret_cast<uintptr_t>(p), -1};
    return err;
  }
  int fd = -1;
  *call = "memfd_create";
  if (int err = os::create_memfd("ferry-pool", bytes, huge_page_bytes, &fd)) return err;
  void* p = nullptr;
  *call = "mmap";
  if (int err = os::map_shared(fd, bytes, std::max(os::kHugePage2MBytes, huge_page_bytes), &p)) {
    os::close_fd(fd);
    return err;
  }
  *out = Mapping{reinterpret_cast<uintptr_t>(p), fd};
  return 0;
}

void Arena::unmap(const Mapping& m, size_t bytes) const noexcept {
  // Forgotten first: a fork between the two leaves the child neither the
  // range nor a tombstone, at an address the parent is giving up anyway.
  if (m.fd < 0 && pinned_) os::forget_hidden(reinterpret_cast<void*>(m.base));
  os::unmap(reinterpret_cast<void*>(m.base), bytes);
  if (m.fd >= 0) os::close_fd(m.fd);
}

MappedChunk Arena::map_chunk(size_t bytes, PageKind kind) {
  const std::vector<Backing> wanted = choices(bytes, kind);
  std::string hugetlb_refusals;  // why hugetlb failed, for the hugetlb policy's error
  Attempt got;
  for (size_t i = 0; i < wanted.size() && !got.mapped; ++i) {
    got = try_backing(wanted[i], bytes, kind);
    if (!got.refusal) continue;
    // A refused choice: the hugetlb policy has no fallback and reports all
    // reasons at the end; otherwise note it and go on with the next choice.
    const Refusal& r = *got.refusal;
    if (policy_ == HugePolicy::hugetlb) {
      hugetlb_refusals += (hugetlb_refusals.empty() ? "" : "; ") + r.reason;
      continue;
    }
    const std::string next = i + 1 < wanted.size() ? choice_name(wanted[i + 1]) : "nothing";
    fall_back(r.feature, r.reason + "; using " + next, r.remember);
  }
  if (!got.mapped) {
    const size_t pages_2m = bytes / os::kHugePage2MBytes;
    throw NotSupported("ferry pool: huge_pages=hugetlb, but no hugetlb pages for a " + format_bytes(bytes) +
                       " chunk: " + hugetlb_refusals + ". Reserve some (e.g. echo " +
                       std::to_string(pages_2m) + " > " + os::hugepages_dir(os::kHugePage2MBytes) +
                       "/nr_hugepages) or use FERRY_HUGE_PAGES=auto");
  }
  bind_to_numa_node(got.mapping, bytes);
  hide_from_fork(got.mapping, bytes);

  MappedChunk chunk;
  chunk.base = got.mapping.base;
  chunk.bytes = bytes;
  chunk.kind = kind;
  chunk.backing = got.backing;
  chunk.fd = got.mapping.fd;
  return chunk;
}

Arena::Attempt Arena::try_backing(Backing choice, size_t bytes, PageKind kind) {
  if (choice == Backing::hugetlb_1g || choice == Backing::hugetlb_2m) return map_hugetlb(choice, bytes);
  if (choice == Backing::thp) return map_thp(bytes);
  return map_small_pages(bytes, kind);
}

// Refused when the page size has no pool, too few free pages or mmap fails;
// a feature refused before is skipped unless the policy is hugetlb.
Arena::Attempt Arena::map_hugetlb(Backing choice, size_t bytes) {
  Attempt a;
  const Feature f = choice == Backing::hugetlb_1g ? kHugetlb1G : kHugetlb2M;
  if (policy_ != HugePolicy::hugetlb && refused(f)) return a;
  const size_t page = page_bytes(choice);
  const std::string what = choice_name(choice);
  const std::string size_text = format_bytes(bytes);
  uint64_t free_pages = 0;
  if (int err = os::read_free_hugepages(page, &free_pages)) {
    a.refusal = Refusal{f, what + ": no pool in " + os::hugepages_dir(page) + " (" + std::strerror(err) + ")", true};
    return a;
  }
  if (free_pages < bytes / page) {
    a.refusal = Refusal{f,
                        free_pages == 0 ? what + ": 0 free pages"
                                        : what + ": " + std::to_string(free_pages) + " free pages, too few for a " +
                                              size_text + " chunk",
                        free_pages == 0};
    return a;
  }
  const char* call = "mmap";
  if (int err = map(bytes, page, &a.mapping, &call)) {
    a.refusal = Refusal{f, what + ": " + call + " of a " + size_text + " chunk refused (" + std::strerror(err) + ")",
                        true};
    return a;
  }
  a.mapped = true;
  a.backing = choice;
  return a;
}

// Refused (unmapped) when sysfs disables THP; a chunk whose MADV_HUGEPAGE
// fails stays mapped with small pages (a refusal only when not transient).
Arena::Attempt Arena::map_thp(size_t bytes) {
  Attempt a;
  if (refused(kThp)) return a;
  if (std::string why = thp_unusable(); !why.empty()) {
    a.refusal = Refusal{kThp, why, true};
    return a;
  }
  a.mapping = map_or_throw(bytes);
  a.mapped = true;
  if (int err = os::advise_huge(reinterpret_cast<void*>(a.mapping.base), bytes)) {
    if (transient(err))
      fall_back(kThp,
                "THP: madvise(MADV_HUGEPAGE) failed for a " + format_bytes(bytes) + " chunk (" + errno_text(err) +
                    "); that chunk uses small pages, the next one tries THP again",
                false);
    else
      a.refusal = Refusal{kThp, std::string("THP: madvise(MADV_HUGEPAGE) refused (") + std::strerror(err) + ")", true};
    a.backing = Backing::small_pages;
  } else {
    a.backing = Backing::thp;
  }
  return a;
}

// The last choice: never refused; a small chunk asks for MADV_NOHUGEPAGE.
Arena::Attempt Arena::map_small_pages(size_t bytes, PageKind kind) {
  Attempt a;
  a.mapping = map_or_throw(bytes);
  a.mapped = true;
  a.backing = Backing::small_pages;
  if (kind == PageKind::small && !refused(kNoHugeAdvice)) {
    if (int err = os::advise_no_huge(reinterpret_cast<void*>(a.mapping.base), bytes))
      advice_failed(kNoHugeAdvice, "MADV_NOHUGEPAGE", err, bytes, "that chunk has no advice",
                    "small chunks get no advice");
  }
  return a;
}

void Arena::advice_failed(Feature f, const char* advice, int err, size_t bytes, const char* this_chunk,
                          const char* from_now_on) {
  if (transient(err))
    fall_back(f,
              std::string("madvise(") + advice + ") failed for a " + format_bytes(bytes) + " chunk (" +
                  errno_text(err) + "); " + this_chunk + ", the next one tries again",
              false);
  else
    fall_back(f, std::string("madvise(") + advice + ") refused (" + std::strerror(err) + "); " + from_now_on, true);
}

Arena::Mapping Arena::map_or_throw(size_t bytes) const {
  Mapping m;
  const char* call = "mmap";
  if (int err = map(bytes, 0, &m, &call))
    throw OsError(std::string(call) + " of a " + format_bytes(bytes) + " pool chunk", err);
  return m;
}

void Arena::bind_to_numa_node(const Mapping& m, size_t bytes) {
  if (numa_node_ < 0 || refused(kNumaBinding)) return;
  if (int err = os::bind_to_node(reinterpret_cast<void*>(m.base), bytes, numa_node_))
    fall_back(kNumaBinding,
              "NUMA: mbind to node " + std::to_string(numa_node_) + " refused (" + std::strerror(err) +
                  "); chunks are not bound",
              true);
}

void Arena::hide_from_fork(const Mapping& m, size_t bytes) {
  if (!pinned_ || m.fd >= 0 || refused(kDontFork)) return;
  if (int err = os::hide_from_fork(reinterpret_cast<void*>(m.base), bytes))
    advice_failed(kDontFork, "MADV_DONTFORK", err, bytes, "a fork copies that chunk",
                  "every fork copies the pinned chunks into the child (use memfd=True)");
}

MappedChunk Arena::reserve(size_t bytes, PageKind kind) {
  MappedChunk m = map_chunk(bytes, kind);
  FirstTouch touch(m.base, m.bytes, touch_threads_);
  if (int err = touch.join()) {
    unmap(m);
    throw OsError("first touch of a " + format_bytes(bytes) + " pool chunk", err);
  }
  m.touch_ns = touch.elapsed_ns();
  return m;
}

void Arena::unmap(const MappedChunk& chunk) noexcept { unmap(Mapping{chunk.base, chunk.fd}, chunk.bytes); }

int Arena::release_pages(const MappedChunk& chunk, uintptr_t begin, size_t bytes) noexcept {
  void* p = reinterpret_cast<void*>(begin);
  return chunk.fd >= 0 ? os::advise_remove(p, bytes) : os::advise_dont_need(p, bytes);
}

}  // namespace ferry
