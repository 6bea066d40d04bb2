// node_member.h — what the node pool tests share: unique pool names, patterns
// written and checked across processes, and MemberProcess: another process of
// the node, this test binary exec'd again (not forked: a forked child of a
// threaded process may not start threads under ThreadSanitizer) running
// NodePoolMember.DISABLED_Serve (node_pool_test.cpp), which reads commands on
// stdin and answers on stdout lines that start with "@@ ".
#pragma once

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "exec_peer.h"

namespace ferry::node {

inline std::string unique_name(const char* what) {
  static std::atomic<int> n{0};
  return std::string("t") + std::to_string(getpid()) + "-" + what + "-" + std::to_string(n++);
}

inline void fill(char* p, size_t bytes, uint64_t seed) {
  std::mt19937_64 r(seed);
  for (size_t i = 0; i < bytes; i += 8) {
    const uint64_t v = r();
    std::memcpy(p + i, &v, std::min<size_t>(8, bytes - i));
  }
}
inline bool holds(const char* p, size_t bytes, uint64_t seed) {
  if (bytes == 0) return true;  // memcmp's pointers must not be null, even for 0 bytes
  std::vector<char> want(bytes);
  fill(want.data(), bytes, seed);
  return std::memcmp(p, want.data(), bytes) == 0;
}

// Where the tests make their directories: $TMPDIR (CTest's folder, checked for
// leftovers) when its path is short, else /tmp: a Unix socket's path must fit
// 107 bytes (directory, pool name and slot).
inline std::string temp_root() {
  const char* tmp = std::getenv("TMPDIR");
  return tmp && *tmp && std::strlen(tmp) <= 40 ? tmp : "/tmp";
}

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Another process of the node: this binary running the member loop. uid: the
// user it runs as (root can give another: setresuid before the exec); node_dir:
// its FERRY_NODE_DIR ("" = this process's).
class MemberProcess {
 public:
  explicit MemberProcess(uid_t uid = ::geteuid(), const std::string& node_dir = "") {
    int in[2], out[2];
    if (::pipe(in) != 0 || ::pipe(out) != 0) std::abort();
    peer_.emplace("NodePoolMember.DISABLED_Serve", "FERRYTEST_NODE_MEMBER", "1", [&] {
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      for (int fd : {in[0], in[1], out[0], out[1]}) ::close(fd);
      if (!node_dir.empty()) ::setenv("FERRY_NODE_DIR", node_dir.c_str(), 1);
      if (uid != ::geteuid() &&
          (::setgroups(0, nullptr) != 0 || ::setresgid(uid, uid, uid) != 0 || ::setresuid(uid, uid, uid) != 0))
        ::_exit(126);
    });
    ::close(in[0]);
    ::close(out[1]);
    to_ = ::fdopen(in[1], "w");
    from_ = ::fdopen(out[0], "r");
  }
  ~MemberProcess() {
    peer_->kill9();
    if (to_) std::fclose(to_);
    if (from_) std::fclose(from_);
  }
  MemberProcess(const MemberProcess&) = delete;
  MemberProcess& operator=(const MemberProcess&) = delete;
  // Sends one command, returns the answer (the text after "@@ ").
  std::string ask(const std::string& command) {
    std::fprintf(to_, "%s\n", command.c_str());
    std::fflush(to_);
    char line[4096];
    while (std::fgets(line, sizeof line, from_)) {
      if (std::strncmp(line, "@@ ", 3) != 0) continue;  // gtest's own lines
      std::string a(line + 3);
      if (!a.empty() && a.back() == '\n') a.pop_back();
      return a;
    }
    return "EOF";
  }
  void kill9() { peer_->kill9(); }
  int finish() {  // "exit" and the exit code (-1: killed after 60 s)
    ask("exit");
    return peer_->finish();
  }
  pid_t pid() const { return peer_->pid(); }

 private:
  std::optional<ferry::testing::ExecPeer> peer_;  // this binary, exec'd again
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
};

inline uint64_t number(const std::string& s) { return std::stoull(s); }

}  // namespace ferry::node
