// child.h — gdrcopy_sanity style: run a test case in a forked child and look
// at how it ended (exit code, signal, or hung past a deadline: then it is
// killed). The child reports what went wrong through a pipe and must end with
// child_exit() (_exit: no atexit handlers of the test binary run in it).
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
