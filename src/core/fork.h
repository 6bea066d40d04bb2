// fork.h — what ferry's objects do across fork().
//
// A forked child has one thread: the one that called fork(). Every other
// thread of the parent (a pool's releaser and target pipeline, the copy
// engine's workers, a thread that was waiting on a condition variable) is gone,
// yet the child holds copies of their std::thread handles, of mutexes they may
// have held and of condition variables they were waiting on. Joining such a
// handle, or destroying such a condition variable, hangs or corrupts the
// child's thread bookkeeping; CUDA state does not survive fork at all.
//
// The rule, PyTorch's for its CUDA allocator: an object created before fork()
// refuses to be used in the child (NotSupported, saying so and what to do),
// and its destruction in the child releases nothing: its state is abandoned
// (kept reachable, never destroyed) and the child's copy of its memory goes
// away when the child exits or execs. Free paths (deallocate) do nothing in
// the child. The parent is unaffected. Objects created in the child work.
//
// fork_generation() tells the two apart: it is 0 in the process that loaded
// ferry and grows by one in each forked child (a pthread_atfork handler), so
// an object compares the generation it was created in with the current one:
// one relaxed atomic load, nothing on a hot path.
//
// Process-wide mutexes that a child may need for objects it creates (fault
// injection, the Python layer's exit guard) are registered with
// hold_across_fork(): the forking thread takes them all before fork() and
// releases them in both processes after, so no child inherits one locked by
// a thread that no longer exists (glibc does the same for malloc).
// Register them at load, in a namespace-scope initializer, never on first use
// in a function-local static: a thread inside such an initializer waits for
// the registry, which the forking thread holds across fork(), so the child
// inherits the static's guard "in progress" and its first call hangs for good
// (seen as Fork.ForkWhileOtherThreadsUseThePool hanging in CI, 2026-11-24).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

namespace ferry {

uint64_t fork_generation() noexcept;

// The message of an object used in a forked child: "<what> was created in
// process P before fork(); ..." with the fix.
std::string forked_child_message(const std::string& what);

// Locks `mu` around every later fork() (see above). The mutex must live for
// the rest of the process (a static); a thread that holds it must not take
// another registered mutex or fork. Call it at load (see above).
void hold_across_fork(std::mutex* mu);

// Calls fn in every forked child, inside fork() (a pthread_atfork child
// handler), after the mutexes above are released and the generation has
// moved, in the order of registration. The child has one thread then; fn
// must not throw, start threads or call CUDA. Call it at load (see above).
void at_fork_in_child(void (*fn)() noexcept);

// Keeps `p` reachable and never destroys it: for an object's state whose
// destruction would join threads or destroy condition variables of the
// parent (called in a forked child only).
void abandon_in_child(void* p) noexcept;

template <class T>
void abandon_in_child(std::unique_ptr<T>& p) noexcept {
  abandon_in_child(static_cast<void*>(p.release()));
}

}  // namespace ferry
