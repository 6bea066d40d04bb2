// finishing_thread.h — a background thread that does one piece of work and is
// gone when the work is done.
//
// Why: a std::thread that has returned but was never joined is still a thread
// to the C library and to ThreadSanitizer until its owner joins it. A pool's
// target pipeline finishes within a second of the pool's creation, but its
// owner joined it only in ~Pool: a fork() in between gave the child a finished,
// unjoined thread, which ThreadSanitizer reports as a "thread leak" at the
// child's exit (exit 66; issue 21, item 10). A FinishingThread is detached when
// it starts, so nothing is left to join once the work returns; wait() waits
// for the work instead of joining the thread.
//
// The work must not touch its owner after it returns: wait() returning is the
// owner's licence to destroy what the work used. The thread's last steps (set
// done, notify, drop its reference) touch only a shared State that outlives
// both sides.
//
// Locking: State::mu guards State::done; nothing else is shared.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>

namespace ferry {

class FinishingThread {
 public:
  // Starts `work` on a new detached thread (std::system_error if none can be
  // started). At most once per object.
  void start(std::function<void()> work);

  // Returns once the work has returned (at once if it was never started).
  void wait() noexcept;

 private:
  struct State {
    std::mutex mu;  // guards done
    std::condition_variable cv;
    bool done = false;  // mu: the work has returned
  };
  std::shared_ptr<State> state_;  // owner only; shared with the running thread
};

}  // namespace ferry
