// child.h — gdrcopy_sanity style: run a test case in a forked child and look
// at how it ended (exit code, signal, or hung past a deadline: then it is
// killed). The child reports what went wrong through a pipe and must end with
// return from its body (run_in_child then calls _exit: no atexit handler of the
// test binary runs in it). FERRYTEST_HANG_GDB=1 prints a hung child's stacks
// (gdb) before it is killed.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>

#if defined(__SANITIZE_THREAD__)
#define FERRYTEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FERRYTEST_TSAN 1
#endif
#endif
#ifndef FERRYTEST_TSAN
#define FERRYTEST_TSAN 0
#endif

#if defined(__SANITIZE_ADDRESS__)
#define FERRYTEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FERRYTEST_ASAN 1
#endif
#endif
#ifndef FERRYTEST_ASAN
#define FERRYTEST_ASAN 0
#endif

// GCC 12's AddressSanitizer does not lock its allocator across fork(): a child
// forked while another thread is inside malloc hangs in its first malloc
// (seen in SizeClassAllocator64::GetFromAllocator). glibc's malloc, which the
// plain build uses, is fork-safe, and ThreadSanitizer locks its own. Cases that
// fork while threads allocate skip under ASan, saying so.
#define FERRYTEST_SKIP_IF_ASAN_FORK()                                                              \
  do {                                                                                             \
    if (FERRYTEST_ASAN)                                                                            \
      GTEST_SKIP() << "AddressSanitizer's allocator is not fork-safe (a child of a threaded process " \
                      "can hang in malloc); the plain build runs this case (and the TSan build, "  \
                      "unless it skips it too: FERRYTEST_SKIP_IF_TSAN_CHILD_THREADS)";            \
  } while (0)

// ThreadSanitizer refuses to start threads in the child of a threaded process
// (die_after_fork); a pool starts its first-touch helpers in any new chunk.
#define FERRYTEST_SKIP_IF_TSAN_CHILD_THREADS()                                                     \
  do {                                                                                             \
    if (FERRYTEST_TSAN)                                                                            \
      GTEST_SKIP() << "ThreadSanitizer does not start threads after a multi-threaded fork; the "   \
                      "plain build runs this case";                                                \
  } while (0)

namespace ferrytest {

struct ChildEnd {
  bool hung = false;
  bool exited = false;
  int code = -1;    // exit status when exited
  int signal = 0;   // terminating signal otherwise
  std::string why;  // what the child wrote
  bool clean() const { return !hung && exited && code == 0; }
  std::string describe() const {
    if (hung) return "child hung (killed after the deadline); it said: " + why;
    if (!exited) return "child killed by signal " + std::to_string(signal) + "; it said: " + why;
    return "child exited " + std::to_string(code) + "; it said: " + why;
  }
};

// body(say) returns the child's exit code (0 = passed); say(text) reports.
inline ChildEnd run_in_child(const std::function<int(const std::function<void(const std::string&)>&)>& body,
                             std::chrono::seconds deadline = std::chrono::seconds(30)) {
  int fds[2];
  if (::pipe(fds) != 0) return ChildEnd{false, false, -1, 0, "pipe failed"};
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    const int out = fds[1];
    auto say = [out](const std::string& text) {
      const std::string line = text + "\n";
      (void)!::write(out, line.data(), line.size());
    };
    int code = 99;
    try {
      code = body(say);
    } catch (const std::exception& e) {
      say(std::string("uncaught exception: ") + e.what());
    } catch (...) {
      say("uncaught exception");
    }
    ::_exit(code);
  }
  ::close(fds[1]);
  ChildEnd end;
  const auto until = std::chrono::steady_clock::now() + deadline;
  int status = 0;
  for (;;) {
    pollfd p{fds[0], POLLIN, 0};
    if (::poll(&p, 1, 20) > 0) {
      char buf[512];
      const ssize_t n = ::read(fds[0], buf, sizeof buf);
      if (n > 0) end.why.append(buf, static_cast<size_t>(n));
    }
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (std::chrono::steady_clock::now() > until) {
      if (const char* gdb = std::getenv("FERRYTEST_HANG_GDB")) {  // e.g. =1: print the hung child's stacks
        (void)gdb;
        const std::string cmd = "gdb -q -batch -p " + std::to_string(pid) + " -ex 'thread apply all bt' >&2";
        (void)!std::system(cmd.c_str());
      }
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      end.hung = true;
      break;
    }
  }
  char buf[512];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) end.why.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  if (!end.hung && WIFEXITED(status)) {
    end.exited = true;
    end.code = WEXITSTATUS(status);
  } else if (!end.hung && WIFSIGNALED(status)) {
    end.signal = WTERMSIG(status);
  }
  return end;
}

}  // namespace ferrytest
