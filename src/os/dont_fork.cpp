// dont_fork.cpp — MADV_DONTFORK with a record of the hidden ranges, and the
// child's tombstones and SIGSEGV note (dont_fork.h says why).
#include "os/dont_fork.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <mutex>
#include <new>
#include <vector>

#include "core/fault.h"
#include "core/fork.h"

namespace ferry::os {
namespace {

struct Range {
  uintptr_t begin = 0, end = 0;
};

// The ranges hidden in this process, by anyone's chunk. Guarded by g_mu.
std::mutex g_mu;
std::vector<Range>* g_hidden = nullptr;  // g_mu; made on first use, never destroyed

// The tombstones of this process (made in its fork, and in its ancestors'):
// written inside fork() in the child only, read by the signal handler.
// Beyond kMaxTombstones ranges a tombstone is still made, but a touch of it
// gets the plain SIGSEGV, without ferry's line.
constexpr size_t kMaxTombstones = 4096;
Range g_tombstones[kMaxTombstones];
std::atomic<size_t> g_tombstone_count{0};

struct sigaction g_previous_segv;  // the handler before ours, in a child that installed ours
std::atomic<bool> g_handler_installed{false};

// Async-signal-safe text output: write(2) and hand-made numbers.
void put(const char* text) {
  size_t n = 0;
  while (text[n]) ++n;
  (void)!::write(STDERR_FILENO, text, n);
}

void put_number(uintptr_t v, unsigned base) {
  char digits[24];
  size_t n = 0;
  do {
    const unsigned d = static_cast<unsigned>(v % base);
    digits[n++] = static_cast<char>(d < 10 ? '0' + d : 'a' + d - 10);
    v /= base;
  } while (v && n < sizeof digits);
  char out[26];
  size_t k = 0;
  if (base == 16) out[k++] = '0', out[k++] = 'x';
  while (n) out[k++] = digits[--n];
  (void)!::write(STDERR_FILENO, out, k);
}

void on_segv(int sig, siginfo_t* info, void*) {
  if (in_tombstone(info->si_addr)) {
    put("ferry: process ");
    put_number(static_cast<uintptr_t>(::getpid()), 10);
    put(" touched ");
    put_number(reinterpret_cast<uintptr_t>(info->si_addr), 16);
    put(", memory ferry held in the process it was forked from (a pinned pool's chunk or a node pool's "
        "mapping, e.g. through a view taken before the fork). ferry hides it from forked children "
        "(MADV_DONTFORK: the kernel would copy every pinned page into each child at fork), so nothing "
        "is there in this process. Allocate pinned memory in the child, open a node pool again by name "
        "in the child (ferry.node.NodePool(name)), or share memory with children through a memfd pool "
        "(ferry.Pool(memfd=True), ferry.PinnedPool(memfd=True)).\n");
  }
  // The fault repeats under the previous handler (a fault re-executes the
  // instruction; a SIGSEGV sent by kill() is raised again).
  ::sigaction(SIGSEGV, &g_previous_segv, nullptr);
  if (info->si_code <= 0) ::raise(sig);
}

void install_handler() noexcept {
  if (g_handler_installed.load(std::memory_order_relaxed)) return;  // inherited from a forking parent
  struct sigaction ours = {};
  ours.sa_sigaction = on_segv;
  ours.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&ours.sa_mask);
  if (::sigaction(SIGSEGV, &ours, &g_previous_segv) == 0) g_handler_installed.store(true, std::memory_order_relaxed);
}

void add_tombstone(Range r) noexcept {
  size_t n = g_tombstone_count.load(std::memory_order_relaxed);
  if (n > 0 && g_tombstones[n - 1].end == r.begin) {  // chunks are often adjacent
    g_tombstones[n - 1].end = r.end;
    return;
  }
  if (n == kMaxTombstones) return;
  g_tombstones[n] = r;
  g_tombstone_count.store(n + 1, std::memory_order_release);
}

// In the child, inside fork(): the hidden ranges are not mapped here; reserve
// each one and forget it (the child holds none of them).
void in_child() noexcept {
  std::lock_guard lock(g_mu);
  if (!g_hidden || g_hidden->empty()) return;
  for (const Range& r : *g_hidden) {
    void* p = ::mmap(reinterpret_cast<void*>(r.begin), r.end - r.begin, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    if (p == MAP_FAILED) continue;  // something is there already: leave it
    if (reinterpret_cast<uintptr_t>(p) != r.begin) {  // a kernel without MAP_FIXED_NOREPLACE took a hint
      ::munmap(p, r.end - r.begin);
      continue;
    }
    add_tombstone(r);
  }
  g_hidden->clear();
  if (g_tombstone_count.load(std::memory_order_relaxed) > 0) install_handler();
}

const bool g_registered = [] {
  hold_across_fork(&g_mu);
  at_fork_in_child(in_child);
  return true;
}();

}  // namespace

int hide_from_fork(void* p, size_t bytes) noexcept {
  (void)g_registered;
  if (int err = fault_error(FaultPoint::madvise, EINVAL)) return err;
  if (::madvise(p, bytes, MADV_DONTFORK) != 0) return errno;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p);
  try {
    std::lock_guard lock(g_mu);
    if (!g_hidden) g_hidden = new std::vector<Range>;
    g_hidden->push_back(Range{begin, begin + bytes});
  } catch (const std::bad_alloc&) {
    ::madvise(p, bytes, MADV_DOFORK);  // no tombstone without the record: leave the range forkable
    return ENOMEM;
  }
  return 0;
}

void forget_hidden(void* p) noexcept {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p);
  std::lock_guard lock(g_mu);
  if (!g_hidden) return;
  for (size_t i = 0; i < g_hidden->size(); ++i) {
    if ((*g_hidden)[i].begin != begin) continue;
    (*g_hidden)[i] = g_hidden->back();
    g_hidden->pop_back();
    return;
  }
}

size_t hidden_range_count() noexcept {
  std::lock_guard lock(g_mu);
  return g_hidden ? g_hidden->size() : 0;
}

bool in_tombstone(const void* p) noexcept {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const size_t n = g_tombstone_count.load(std::memory_order_acquire);
  for (size_t i = 0; i < n; ++i)
    if (g_tombstones[i].begin <= a && a < g_tombstones[i].end) return true;
  return false;
}

}  // namespace ferry::os
