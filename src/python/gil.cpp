// gil.cpp — GilRelease and the exit hook (see gil.h).
#include "python/gil.h"

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "core/fork.h"

namespace ferry::python {
namespace {

struct ExitGuard {
  std::mutex mu;
  std::condition_variable cv;
  int inside = 0;          // mu: threads that dropped the GIL in a call and have not taken it back
  int restoring = 0;       // mu: of those, the ones taking it back now
  bool exiting = false;    // mu: the exit hook ran: new calls keep the GIL
  bool gave_up = false;    // mu: the hook stopped waiting: returning threads block for good
  uint64_t generation = 0; // mu: fork_generation() the counts belong to
};

// Never destroyed: daemon threads may use it during static destruction.
ExitGuard& guard() {
  static ExitGuard* g = new ExitGuard;
  return *g;
}

// Held across fork(), registered at load (fork.h says why not on first use).
[[maybe_unused]] const bool g_guard_held_across_fork = (hold_across_fork(&guard().mu), true);

// In a forked child, the parent's threads and its exit state are not ours.
void adopt_generation_locked(ExitGuard& g) {
  const uint64_t now = fork_generation();
  if (g.generation == now) return;
  g.inside = g.restoring = 0;
  g.exiting = g.gave_up = false;
  g.generation = now;
}

[[noreturn]] void block_forever() {
  for (;;) ::pause();
}

}  // namespace

GilRelease::GilRelease() {
  ExitGuard& g = guard();
  {
    std::lock_guard lock(g.mu);
    adopt_generation_locked(g);
    if (g.exiting) return;  // keep the GIL
    ++g.inside;
  }
  state_ = PyEval_SaveThread();
}

GilRelease::~GilRelease() {
  if (!state_) return;
  ExitGuard& g = guard();
  {
    std::unique_lock lock(g.mu);
    if (g.gave_up) {
      lock.unlock();
      block_forever();
    }
    ++g.restoring;
  }
  PyEval_RestoreThread(state_);
  std::lock_guard lock(g.mu);
  --g.restoring;
  --g.inside;
  g.cv.notify_all();
}

GilTakeBack::GilTakeBack() {
  ExitGuard& g = guard();
  {
    std::unique_lock lock(g.mu);
    adopt_generation_locked(g);
    if (g.gave_up) {
      lock.unlock();
      block_forever();
    }
    ++g.restoring;
  }
  state_ = PyGILState_Ensure();
  std::lock_guard lock(g.mu);
  --g.restoring;
  g.cv.notify_all();
}

GilTakeBack::~GilTakeBack() { PyGILState_Release(state_); }

void wait_for_calls_at_exit() {
  ExitGuard& g = guard();
  PyThreadState* main = PyEval_SaveThread();
  {
    std::unique_lock lock(g.mu);
    adopt_generation_locked(g);
    g.exiting = true;
    const auto limit = std::chrono::duration<double>(kExitWaitSeconds);
    if (!g.cv.wait_for(lock, limit, [&] { return g.inside == 0; })) {
      g.gave_up = true;
      g.cv.wait(lock, [&] { return g.restoring == 0; });  // they only need the GIL, which we do not hold
    }
  }
  PyEval_RestoreThread(main);
}

}  // namespace ferry::python
