// exec_peer.h — another process for a cross-process test: this test binary
// exec'd again (not only forked: a forked child of a threaded process may not
// start threads under ThreadSanitizer), running one DISABLED_ test that reads
// its arguments from an environment variable; it exits 0 when its side went
// as expected. The destructor kills a peer still running.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>

namespace ferry::testing {

class ExecPeer {
 public:
  // test: the gtest name to run ("Suite.DISABLED_Name"); env_name=args in its
  // environment; in_child, if given, runs in the child just before the exec
  // (redirections, credentials: node_member.h's MemberProcess; it may _exit).
  ExecPeer(const std::string& test, const char* env_name, const std::string& args,
           const std::function<void()>& in_child = {}) {
    char exe[4096];
    const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = '\0';
    const std::string filter = "--gtest_filter=" + test;
    std::fflush(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setenv(env_name, args.c_str(), 1);
      ::unsetenv("GTEST_OUTPUT");
      if (in_child) in_child();
      ::execl(exe, exe, filter.c_str(), "--gtest_also_run_disabled_tests", static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~ExecPeer() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  ExecPeer(const ExecPeer&) = delete;
  ExecPeer& operator=(const ExecPeer&) = delete;

  // Its exit code; -1 (and killed) when it has not ended within timeout_s.
  int finish(double timeout_s = 60) {
    const auto t0 = std::chrono::steady_clock::now();
    int status = 0;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        pid_ = -1;
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  void kill9() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    pid_ = -1;
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
};

}  // namespace ferry::testing
