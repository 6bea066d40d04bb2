// fresh_process.h — run the current test again in a fresh process (this test
// binary, exec'd with a gtest filter naming the test), with one environment
// variable set so that the test knows it is the fresh one. For what a forked
// child cannot show: memory peaks without the parent's heap, and first-use
// initialization that the parent has already done.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

namespace ferrytest {

// The exit status (waitpid's) and what the fresh process wrote to stdout and
// stderr. `variable` is set to `value` in it.
inline std::pair<int, std::string> run_test_fresh(const char* variable, const std::string& value) {
  const ::testing::TestInfo* me = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string filter = std::string("--gtest_filter=") + me->test_suite_name() + "." + me->name();
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return {-1, "readlink /proc/self/exe failed"};
  exe[n] = '\0';
  int fds[2];
  if (::pipe(fds) != 0) return {-1, "pipe failed"};
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], 1);
    ::dup2(fds[1], 2);
    ::close(fds[0]);
    ::close(fds[1]);
    ::setenv(variable, value.c_str(), 1);
    ::unsetenv("GTEST_OUTPUT");  // the report is the calling process's to write
    ::execl(exe, exe, filter.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t got; (got = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(got));
  ::close(fds[0]);
  int status = -1;
  ::waitpid(pid, &status, 0);
  return {status, out};
}

}  // namespace ferrytest
