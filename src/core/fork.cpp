// fork.cpp — the fork generation, the mutexes held across fork(), and the
// state abandoned in forked children.
#include "core/fork.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <vector>

namespace ferry {
namespace {

std::atomic<uint64_t> g_generation{0};

// The registered mutexes. `registry_mu` is taken first in prepare and
// released last; registration takes only it.
std::mutex& registry_mu() {
  static std::mutex mu;
  return mu;
}
std::vector<std::mutex*>& registry() {
  static auto* list = new std::vector<std::mutex*>;  // never destroyed: atfork runs until exit
  return *list;
}

// Functions run in every forked child (at_fork_in_child), guarded by registry_mu.
using ChildCall = void (*)() noexcept;
std::vector<ChildCall>& child_calls() {
  static auto* list = new std::vector<ChildCall>;  // never destroyed: atfork runs until exit
  return *list;
}

void prepare() noexcept {
  registry_mu().lock();
  for (std::mutex* mu : registry()) mu->lock();
}

void release() noexcept {
  auto& list = registry();
  for (auto it = list.rbegin(); it != list.rend(); ++it) (*it)->unlock();
  registry_mu().unlock();
}

void in_child() noexcept {
  g_generation.fetch_add(1, std::memory_order_relaxed);
  release();
  // One thread, and the list changes only under registry_mu, which no thread
  // held at fork(): reading it unlocked is safe here.
  for (ChildCall call : child_calls()) call();
}

// Abandoned state: a lock-free list (a child may abandon while its only
// thread is anywhere), reachable from a global so leak checkers see it.
struct Abandoned {
  void* object;
  Abandoned* next;
};
std::atomic<Abandoned*> g_abandoned{nullptr};

const bool g_registered = [] {
  ::pthread_atfork(prepare, release, in_child);
  return true;
}();

}  // namespace

uint64_t fork_generation() noexcept {
  (void)g_registered;
  return g_generation.load(std::memory_order_relaxed);
}

std::string forked_child_message(const std::string& what) {
  return what + " was created before fork() and cannot be used in the forked child (process " +
         std::to_string(::getpid()) +
         "): its threads, locks and any pinned or device state stay with the parent. Create a new "
         "one in the child, or start child processes with the 'spawn' or 'forkserver' method";
}

void hold_across_fork(std::mutex* mu) {
  std::lock_guard lock(registry_mu());
  registry().push_back(mu);
}

void at_fork_in_child(void (*fn)() noexcept) {
  std::lock_guard lock(registry_mu());
  child_calls().push_back(fn);
}

void abandon_in_child(void* p) noexcept {
  if (!p) return;
  auto* node = new (std::nothrow) Abandoned{p, g_abandoned.load(std::memory_order_relaxed)};
  if (!node) return;  // out of memory: the object is leaked unreachable, never destroyed
  while (!g_abandoned.compare_exchange_weak(node->next, node, std::memory_order_release)) {
  }
}

}  // namespace ferry
