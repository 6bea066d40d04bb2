// gil.h — releasing the GIL around ferry's work, safely at interpreter exit.
//
// At exit (Py_FinalizeEx), CPython 3.10-3.13 ends a daemon thread that takes
// the GIL back with pthread_exit(), whose forced unwinding through a C++
// destructor such as nanobind's gil_scoped_release is std::terminate:
// "terminate called without an active exception" whenever a daemon thread
// was inside a ferry call. GilRelease and an atexit hook avoid it:
//   - normally GilRelease is gil_scoped_release that counts the threads
//     inside a call;
//   - the atexit hook (atexit handlers run before finalization begins) marks
//     the exit and waits, with the GIL released, up to kExitWaitSeconds for
//     those threads to come back; they take the GIL back normally;
//   - a call that starts after that keeps the GIL (nothing to take back);
//   - a thread still inside a call when the wait ends never takes the GIL
//     back: it blocks for good, as CPython 3.14 does with daemon threads,
//     while the process exits.
// In a forked child the counts start again from zero (the parent's threads
// are not there).
//
// Locking: one process-wide mutex (held across fork, core/fork.h) guards the
// counts; never held while taking or dropping the GIL.
#pragma once

#include <Python.h>

namespace ferry::python {

inline constexpr double kExitWaitSeconds = 10.0;

class GilRelease {
 public:
  GilRelease();
  ~GilRelease();
  GilRelease(const GilRelease&) = delete;
  GilRelease& operator=(const GilRelease&) = delete;
  // False: the exit hook had run, so the GIL was kept (decided under the same
  // lock that counts the threads inside: no race with the hook).
  bool released() const { return state_ != nullptr; }

 private:
  PyThreadState* state_ = nullptr;  // null: the GIL was kept
};

// Holds the GIL for a scope inside a GilRelease (a Python callback that
// C++ calls with the GIL dropped, e.g. the write pipeline's fill), with
// GilRelease's exit rule: once the exit hook gave up waiting, the thread
// blocks for good instead of taking the GIL from a finalizing interpreter;
// while it takes it, the hook waits (the same `restoring` count).
// A call that runs Python callbacks under C++ frames must not go on when its
// GilRelease kept the GIL (!released(): the exit hook ran): the hook does not
// wait for it, and in a daemon thread during finalization CPython ends a
// thread that takes the GIL back (inside the callback's Python code) with
// pthread_exit, whose unwinding through the C++ frames aborts the process.
class GilTakeBack {
 public:
  GilTakeBack();
  ~GilTakeBack();
  GilTakeBack(const GilTakeBack&) = delete;
  GilTakeBack& operator=(const GilTakeBack&) = delete;

 private:
  PyGILState_STATE state_;
};

// The atexit hook: registered once by the module.
void wait_for_calls_at_exit();

}  // namespace ferry::python
