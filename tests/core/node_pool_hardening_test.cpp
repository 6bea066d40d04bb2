// node_pool_hardening_test.cpp — the node pool against issue 38: another
// user that squats on a pool's names (serving her own memory, or silent
// sockets), the private directory where processes meet, a member that cannot
// serve, an attacher whose region lost its last member, a stopped member,
// offsets and capacities near 2^64, timeouts, a forked child that drops its
// pool, labels cut inside a UTF-8 character.
//
// Another user is real: a forked child of this test (root) switches to
// nobody (setresuid 65534) and acts; without root these cases skip. Members
// are real processes (node_member.h); nothing is mocked.
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "../common/child.h"
#include "core/error.h"
#include "node/node_dir.h"
#include "node/node_pool.h"
#include "node/node_region.h"
#include "node_member.h"
#include "os/memory.h"
#include "os/unix_socket.h"

namespace ferry::node {
namespace {

constexpr uid_t kNobody = 65534;

#define SKIP_UNLESS_ROOT() \
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as a second uid (setresuid)"

// A directory for one case, removed with everything in it at the end.
class TempDir {
 public:
  TempDir() {
    std::string p = temp_root() + "/ferry-test-node-XXXXXX";
    if (::mkdtemp(p.data())) path_ = p;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The abstract socket names ferry used before issue 38 (anyone could bind them).
std::string old_abstract_name(const std::string& pool, const std::string& what) {
  return "ferry-node." + std::to_string(::geteuid()) + "." + pool + "." + what;
}

// A listening socket at an abstract name (sun_path[0] = 0) or a path.
int listen_raw(const std::string& name, bool abstract) {
  const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path + (abstract ? 1 : 0), name.data(), name.size());
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size() + 1);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(fd, 64) != 0) return -1;
  if (!abstract) ::chmod(name.c_str(), 0777);  // anyone may connect: the peer's uid must be what refuses it
  return fd;
}

struct Hello {  // node_pool.cpp's
  uint64_t magic;
  uint32_t version;
  uint32_t pad;
  uint64_t file_bytes;
};

// What a squatter does: another user's (or root's) process on a pool's meeting places.
struct SquatPlan {
  uid_t uid = kNobody;
  bool region_before_switch = false;  // the memfd is made before the uid switch: root's file
  std::vector<std::string> abstract_serving, abstract_silent, path_serving, path_silent;
  std::vector<std::string> must_fail;  // paths it tries to connect to and to create: each must fail
};

// A forked child (one thread: it starts none, so ThreadSanitizer lets it be)
// that makes a region of its own (a memfd whose named block "squatter" marks
// it), switches to plan.uid, binds its sockets, serves the memfd on the
// serving ones (never accepts on the silent ones) and tries must_fail at the
// start and again on try_again(). Killed at the end.
class Squatter {
 public:
  explicit Squatter(const SquatPlan& plan) {
    int out[2], in[2];
    if (::pipe(out) != 0 || ::pipe(in) != 0) std::abort();
    std::fflush(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(out[0]);
      ::close(in[1]);
      ::_exit(squat(plan, in[0], out[1]));
    }
    ::close(out[1]);
    ::close(in[0]);
    from_ = out[0];
    to_ = in[1];
    report_ = read_until("ready");
  }
  ~Squatter() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    ::close(from_);
    ::close(to_);
  }
  // What it said up to now; each line "reached ..." is something it should not have done.
  const std::string& report() const { return report_; }
  const std::string& try_again() {
    (void)!::write(to_, "t", 1);
    report_ += read_until("tried");
    return report_;
  }

 private:
  std::string read_until(const std::string& word) {
    std::string got;
    const auto t0 = std::chrono::steady_clock::now();
    while (got.find(word + "\n") == std::string::npos && seconds_since(t0) < 10) {
      pollfd p{from_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      char buf[512];
      const ssize_t n = ::read(from_, buf, sizeof buf);
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
    }
    return got;
  }
  static void say(int out, const std::string& s) { (void)!::write(out, (s + "\n").data(), s.size() + 1); }
  static void try_all(const SquatPlan& plan, int out) {
    for (const std::string& path : plan.must_fail) {
      int fd = -1;
      if (int err = os::connect_at(path, &fd); err == 0 || err == EAGAIN) say(out, "reached: connect " + path);
      const std::string mine = path + ".squat";
      const int f = ::open(mine.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
      if (f >= 0) say(out, "reached: created " + mine);
      if (os::listen_at(mine + "s", &fd) == 0) say(out, "reached: bound " + mine + "s");
    }
  }
  static int make_region(int* fd) {
    const Region::Layout l = Region::layout(uint64_t{1} << 20, 65536);
    void* map = nullptr;
    if (os::create_memfd("ferry-node:squatter", l.file_bytes, 0, fd) != 0 ||
        os::map_shared(*fd, l.file_bytes, size_t{2} << 20, &map) != 0)
      return 1;
    Region r(map);
    r.init(uint64_t{1} << 20, 65536, ::getpid(), 4096);
    r.lock();
    r.create_named("squatter", r.allocate(kMaxMembers, 1), 1, 0);
    r.unlock();
    return 0;
  }
  static int squat(const SquatPlan& plan, int in, int out) {
    int memfd = -1;
    if (plan.region_before_switch && make_region(&memfd) != 0) return say(out, "no region"), 1;
    if (plan.uid != ::geteuid() &&
        (::setgroups(0, nullptr) != 0 || ::setresgid(plan.uid, plan.uid, plan.uid) != 0 ||
         ::setresuid(plan.uid, plan.uid, plan.uid) != 0))
      return say(out, "setresuid failed"), 1;
    if (!plan.region_before_switch && make_region(&memfd) != 0) return say(out, "no region"), 1;
    try_all(plan, out);
    std::vector<pollfd> serving;
    std::vector<int> silent;
    for (const auto& n : plan.abstract_serving) serving.push_back({listen_raw(n, true), POLLIN, 0});
    for (const auto& n : plan.path_serving) serving.push_back({listen_raw(n, false), POLLIN, 0});
    for (const auto& n : plan.abstract_silent) silent.push_back(listen_raw(n, true));
    for (const auto& n : plan.path_silent) silent.push_back(listen_raw(n, false));
    for (const pollfd& p : serving) if (p.fd < 0) say(out, "bind failed");
    for (int fd : silent) if (fd < 0) say(out, "bind failed");
    say(out, "ready");
    uint64_t file_bytes = 0;
    struct stat st {};
    if (::fstat(memfd, &st) == 0) file_bytes = static_cast<uint64_t>(st.st_size);
    const Hello hello{kMagic, kVersion, 0, file_bytes};
    serving.push_back({in, POLLIN, 0});
    for (;;) {
      if (::poll(serving.data(), serving.size(), -1) <= 0) continue;
      for (size_t i = 0; i + 1 < serving.size(); ++i) {
        if (!(serving[i].revents & POLLIN)) continue;
        const int conn = ::accept4(serving[i].fd, nullptr, nullptr, SOCK_CLOEXEC);
        if (conn >= 0) os::send_with_fd(conn, &hello, sizeof hello, memfd);
        if (conn >= 0) ::close(conn);
      }
      if (serving.back().revents & POLLIN) {
        char c;
        if (::read(in, &c, 1) != 1) return 0;
        try_all(plan, out);
        say(out, "tried");
      }
    }
  }

  pid_t pid_ = -1;
  int from_ = -1, to_ = -1;
  std::string report_;
};

std::string node_dir() { return std::getenv("FERRY_NODE_DIR"); }  // node_pool_test.cpp set it

// Whether a process of uid nobody can search its way to `dir` (a forked child that
// switches and looks).
bool nobody_reaches(const std::string& dir) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    struct stat st {};
    const bool ok = ::setgroups(0, nullptr) == 0 && ::setresgid(kNobody, kNobody, kNobody) == 0 &&
                    ::setresuid(kNobody, kNobody, kNobody) == 0 && ::stat((dir + "/.").c_str(), &st) == 0;
    ::_exit(ok ? 0 : 1);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// --- issue 38, item 1: another user cannot serve your pool --------------------------

TEST(NodePoolHardening, AnotherUserCannotServeYourPool) {
  SKIP_UNLESS_ROOT();
  const std::string name = unique_name("serve");
  SquatPlan plan;  // nobody serves her own region under every name an open has looked at
  plan.abstract_serving = {old_abstract_name(name, "0"), old_abstract_name(name, "1")};
  plan.abstract_silent = {old_abstract_name(name, "create")};
  plan.must_fail = {node_dir() + "/" + name + ".0", node_dir() + "/" + name + ".lock"};
  Squatter squatter(plan);
  ASSERT_NE(squatter.report().find("ready"), std::string::npos) << squatter.report();
  NodePoolOptions o;
  o.capacity = size_t{1} << 20;
  o.attach_timeout_s = 3;
  const auto t0 = std::chrono::steady_clock::now();
  auto pool = NodePool::open(name, o);
  EXPECT_LT(seconds_since(t0), 1.0);
  EXPECT_TRUE(pool->stats().created) << "the open attached to another user's region";
  bool created = false;
  pool->allocate_named("squatter", 4096, &created);
  EXPECT_TRUE(created) << "the squatter's named block is in the pool: her memory";
  // Nor can she reach the pool's socket or directory now that it serves.
  EXPECT_EQ(squatter.try_again().find("reached"), std::string::npos) << squatter.report();
}

// --- item 2: another user cannot block or stall your opens --------------------------

TEST(NodePoolHardening, AnotherUsersSilentSocketsNeitherBlockNorStallAnOpen) {
  SKIP_UNLESS_ROOT();
  const std::string name = unique_name("stall");
  SquatPlan plan;
  plan.abstract_silent = {old_abstract_name(name, "create"), old_abstract_name(name, "0"),
                          old_abstract_name(name, "1")};
  plan.must_fail = {node_dir() + "/" + name + ".0", node_dir() + "/" + name + ".lock"};
  Squatter squatter(plan);
  ASSERT_NE(squatter.report().find("ready"), std::string::npos) << squatter.report();
  EXPECT_EQ(squatter.report().find("reached"), std::string::npos) << squatter.report();
  MemberProcess creator, late;
  auto t0 = std::chrono::steady_clock::now();
  const std::string opened = creator.ask("open " + name + " 1048576 creator");
  EXPECT_LT(seconds_since(t0), 1.0) << opened;
  EXPECT_EQ(opened.substr(0, 2), "1 ") << opened;
  NodePoolOptions o;
  o.attach_timeout_s = 3;
  t0 = std::chrono::steady_clock::now();
  auto pool = NodePool::open(name, o);
  EXPECT_LT(seconds_since(t0), 1.0);
  EXPECT_FALSE(pool->stats().created);
  EXPECT_EQ(creator.finish(), 0);  // the pool lives on in this process; a late member attaches to it
  t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(late.ask("open " + name + " 0 late").substr(0, 2), "0 ");
  EXPECT_LT(seconds_since(t0), 1.0);
  EXPECT_EQ(squatter.try_again().find("reached"), std::string::npos) << squatter.report();
}

// --- the private directory ------------------------------------------------------------

void expect_refused(const std::string& dir, const std::string& why) {
  NodePoolOptions o;
  o.capacity = size_t{1} << 20;
  o.dir = dir;
  try {
    NodePool::open(unique_name("dir"), o);
    ADD_FAILURE() << dir << " was used; it should be refused: " << why;
  } catch (const OsError& e) {
    EXPECT_EQ(e.error_number(), EACCES) << e.what();
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("FERRY_NODE_DIR"), std::string::npos) << e.what();
  }
}

TEST(NodePoolHardening, OnlyAPrivateDirectoryOfThisUserIsUsed) {
  TempDir t;
  ASSERT_FALSE(t.path().empty());
  const std::string open_dir = t.path() + "/open";
  ASSERT_EQ(::mkdir(open_dir.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(open_dir.c_str(), 0777), 0);
  expect_refused(open_dir, "mode 0777");
  ASSERT_EQ(::chmod(open_dir.c_str(), 0750), 0);
  expect_refused(open_dir, "mode 0750");
  const std::string real = t.path() + "/real", link = t.path() + "/link";
  ASSERT_EQ(::mkdir(real.c_str(), 0700), 0);
  ASSERT_EQ(::symlink(real.c_str(), link.c_str()), 0);
  expect_refused(link, "symbolic link");
  const std::string file = t.path() + "/file";
  ::close(::open(file.c_str(), O_CREAT | O_WRONLY, 0600));
  expect_refused(file, "not a directory");
  if (::geteuid() == 0) {  // a directory another user made first (of the default's form)
    const std::string theirs = t.path() + "/ferry-0";
    ASSERT_EQ(::mkdir(theirs.c_str(), 0700), 0);
    ASSERT_EQ(::chown(theirs.c_str(), kNobody, kNobody), 0);
    expect_refused(theirs, "belongs to uid 65534");
  }
  NodePoolOptions o;
  o.capacity = size_t{1} << 20;
  o.dir = "relative/dir";
  EXPECT_THROW(NodePool::open(unique_name("dir"), o), InvalidArgument);
  o.dir = t.path() + "/" + std::string(90, 'd');  // a socket path over 107 bytes
  try {
    NodePool::open(unique_name("dir"), o);
    ADD_FAILURE() << "a directory too long for socket paths was used";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("107"), std::string::npos) << e.what();
  }
  o.dir = t.path() + "/missing/dir";
  EXPECT_THROW(NodePool::open(unique_name("dir"), o), OsError);
  // A fresh one is made 0700 whatever the umask, and used.
  const mode_t old_mask = ::umask(0);
  o.dir = t.path() + "/fresh";
  auto pool = NodePool::open(unique_name("dir"), o);
  ::umask(old_mask);
  struct stat st {};
  ASSERT_EQ(::lstat(o.dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_TRUE(pool->stats().created);
}

// A member of another uid is not asked (root's socket in nobody's directory), and a
// member of this uid that hands another uid's memfd is refused.
TEST(NodePoolHardening, AnAttacherChecksTheMembersUidAndTheMemfdsOwner) {
  SKIP_UNLESS_ROOT();
  TempDir t;
  const std::string dir = t.path() + "/nobody";
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  ASSERT_EQ(::chown(dir.c_str(), kNobody, kNobody), 0);
  ASSERT_EQ(::chmod(t.path().c_str(), 0755), 0);  // nobody must reach its directory
  if (!nobody_reaches(dir)) GTEST_SKIP() << "uid nobody cannot reach " << dir << " (a parent directory is closed)";
  {
    const std::string name = unique_name("rootserves");
    SquatPlan plan;
    plan.uid = 0;  // root: the only other user who can bind in nobody's directory
    plan.path_serving = {member_socket_path(dir, name, 0), member_socket_path(dir, name, 1)};
    Squatter root(plan);
    ASSERT_NE(root.report().find("ready"), std::string::npos) << root.report();
    MemberProcess victim(kNobody, dir);
    const std::string opened = victim.ask("open " + name + " 1048576 victim");
    if (opened == "EOF") GTEST_SKIP() << "nobody cannot run this test binary";
    EXPECT_EQ(opened.substr(0, 2), "1 ") << "nobody's open attached to root's region: " << opened;
    EXPECT_EQ(victim.ask("named squatter 4096").back(), '1') << "root's named block is in nobody's pool";
  }
  {
    const std::string name = unique_name("foreignfd");
    SquatPlan plan;
    plan.uid = kNobody;
    plan.region_before_switch = true;  // a memfd of root's, served by a process of nobody's
    plan.path_serving = {member_socket_path(dir, name, 0)};
    Squatter nobody(plan);
    ASSERT_NE(nobody.report().find("ready"), std::string::npos) << nobody.report();
    MemberProcess victim(kNobody, dir);
    const std::string opened = victim.ask("open " + name + " 1048576 victim");
    EXPECT_EQ(opened.rfind("error", 0), 0u) << opened;
    EXPECT_NE(opened.find("a file of uid 0"), std::string::npos) << opened;
  }
}

// A member killed with SIGKILL leaves its socket file: the next open finds it stale,
// removes it and creates at once; the last member to leave leaves no file behind.
TEST(NodePoolHardening, AStaleSocketCostsTheNextOpenNothingAndTheLastMemberCleansUp) {
  const std::string name = unique_name("stale");
  MemberProcess m;
  ASSERT_EQ(m.ask("open " + name + " 1048576 doomed").substr(0, 2), "1 ");
  m.kill9();
  struct stat st {};
  ASSERT_EQ(::lstat(member_socket_path(node_dir(), name, 0).c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  NodePoolOptions o;
  o.capacity = size_t{1} << 20;
  const auto t0 = std::chrono::steady_clock::now();
  auto pool = NodePool::open(name, o);
  EXPECT_LT(seconds_since(t0), 0.5);
  EXPECT_TRUE(pool->stats().created);
  MemberProcess late;
  EXPECT_EQ(late.ask("open " + name + " 0 late").substr(0, 2), "0 ");
  EXPECT_EQ(late.ask("close"), "ok");
  pool.reset();
  for (const auto& e : std::filesystem::directory_iterator(node_dir()))
    EXPECT_NE(e.path().filename().string().rfind(name + ".", 0), 0u) << "left behind: " << e.path();
}

// What dead pools leave (a killed last member's socket and lock file; a failed open's
// lock file) is swept: by the creator of any pool, and by the failed open itself.
TEST(NodePoolHardening, DeadPoolsLeaveNoFilesBehind) {
  auto files_of = [](const std::string& name) {
    std::vector<std::string> found;
    for (const auto& e : std::filesystem::directory_iterator(node_dir()))
      if (e.path().filename().string().rfind(name + ".", 0) == 0) found.push_back(e.path().filename());
    return found;
  };
  const std::string dead = unique_name("dead"), nocap = unique_name("nocap");
  MemberProcess m;
  ASSERT_EQ(m.ask("open " + dead + " 1048576 doomed").substr(0, 2), "1 ");
  m.kill9();
  EXPECT_EQ(files_of(dead).size(), 2u);  // its socket and the lock file
  EXPECT_THROW(NodePool::open(nocap, NodePoolOptions{}), InvalidArgument);  // nobody serves it, no capacity
  EXPECT_TRUE(files_of(nocap).empty());
  NodePoolOptions o;
  o.capacity = size_t{1} << 20;
  auto other = NodePool::open(unique_name("sweeper"), o);  // a creator sweeps
  EXPECT_TRUE(files_of(dead).empty());
}

// --- item 6: no split brain -----------------------------------------------------------

// Out of descriptors for its socket, a creator used to open a pool nobody could
// attach to (and the next process made a second one). It fails its open now.
TEST(NodePoolHardening, AMemberThatCannotServeFailsItsOpen) {
  if (FERRYTEST_ASAN)  // the normal and TSan builds run it
    GTEST_SKIP() << "a process starved of descriptors trips the sanitizers themselves: UBSan's vptr check "
                    "probes memory through a pipe, which fails, and reports a false 'invalid vptr'";
  const std::string name = unique_name("nofds");
  MemberProcess starved;
  const std::string opened = starved.ask("open-few-fds " + name + " 1048576 starved 2");
  EXPECT_EQ(opened.rfind("error", 0), 0u) << "opened a pool it cannot serve: " << opened;
  EXPECT_NE(opened.find("Too many open files"), std::string::npos) << opened;
  // It left nothing that stalls or splits the name: the next process creates, the one after attaches.
  NodePoolOptions o;
  o.capacity = size_t{1} << 20;
  o.attach_timeout_s = 2;
  auto pool = NodePool::open(name, o);
  EXPECT_TRUE(pool->stats().created);
  MemberProcess late;
  EXPECT_EQ(late.ask("open " + name + " 1048576 late").substr(0, 2), "0 ");
  EXPECT_EQ(pool->stats().members.size(), 2u);
}

// While an attacher is on its way in (it holds the memfd, waits for the region's
// lock, does not serve yet) and the only member stops serving and leaves, nobody
// serves the name: another process's open used to create a second pool then. It
// waits for the open on its way in now (bounded by its deadline), and every
// process ends in one pool: the attacher's.
TEST(NodePoolHardening, NoPoolIsCreatedWhileAnAttacherIsOnItsWayIn) {
  const std::string name = unique_name("onitsway");
  MemberProcess last, attacher, third;
  ASSERT_EQ(last.ask("open " + name + " 4194304 last").substr(0, 2), "1 ");
  ASSERT_EQ(last.ask("lock-in-thread 1000"), "locked");
  std::string attached, closed;
  std::thread a([&] { attached = attacher.ask("open " + name + " 4194304 attacher"); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // it got the memfd and waits for the lock
  std::thread c([&] { closed = last.ask("close"); });            // stops serving, then waits for the lock
  const std::string socket = member_socket_path(node_dir(), name, 0);
  const auto t0 = std::chrono::steady_clock::now();
  struct stat st {};
  while (::lstat(socket.c_str(), &st) == 0 && seconds_since(t0) < 2)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const std::string opened = third.ask("open-t " + name + " 4194304 third 0.2");
  EXPECT_NE(opened.substr(0, 2), "1 ") << "a second pool was created while an attacher was on its way in";
  EXPECT_EQ(opened.rfind("error", 0), 0u) << opened;
  EXPECT_NE(opened.find("another process of this user has been opening it"), std::string::npos) << opened;
  a.join();
  c.join();
  EXPECT_EQ(closed, "ok");
  ASSERT_NE(attached.rfind("error", 0), 0u) << attached;  // it joined the region (or, gone, made a fresh one)
  ASSERT_NE(attacher.ask("named mark 4096").rfind("error", 0), 0u);
  NodePoolOptions o;
  auto pool = NodePool::open(name, o);
  EXPECT_FALSE(pool->stats().created);
  bool created = true;
  pool->allocate_named("mark", 4096, &created);
  EXPECT_FALSE(created) << "this process is not in the attacher's pool";
}

// The same when the last member dies holding the region's lock: the open on its way
// in keeps others out, and ends in a pool the next process attaches to.
TEST(NodePoolHardening, AnAttacherWhoseLastMemberDiedEndsInTheOnePool) {
  const std::string name = unique_name("gone");
  MemberProcess last, attacher;
  ASSERT_EQ(last.ask("open " + name + " 4194304 last").substr(0, 2), "1 ");
  ASSERT_EQ(last.ask("lock-then-die 600"), "locked");
  std::string opened;
  std::thread t([&] { opened = attacher.ask("open " + name + " 4194304 attacher"); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the attacher is waiting for the region's lock
  NodePoolOptions quick;
  quick.capacity = size_t{4} << 20;
  quick.attach_timeout_s = 0.1;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(NodePool::open(name, quick), OsError);  // bounded: the attacher's open holds the name
  EXPECT_LT(seconds_since(t0), 0.5);
  t.join();
  ASSERT_NE(opened.rfind("error", 0), 0u) << opened;
  ASSERT_NE(attacher.ask("named mark 4096").rfind("error", 0), 0u);
  auto pool = NodePool::open(name, NodePoolOptions{});
  EXPECT_FALSE(pool->stats().created);
  bool created = true;
  pool->allocate_named("mark", 4096, &created);
  EXPECT_FALSE(created);  // one pool under the name
}

// Members come and go while others open: every open ends in the one live pool.
TEST(NodePoolHardening, OpensRacingTheLastMembersCloseMakeOnePool) {
  for (int round = 0; round < 5; ++round) {
    const std::string name = unique_name("churn");
    MemberProcess first, a, b;
    ASSERT_EQ(first.ask("open " + name + " 1048576 first").substr(0, 2), "1 ");
    std::string oa, ob, closed;
    std::thread ta([&] { oa = a.ask("open " + name + " 1048576 a"); });
    std::thread tc([&] { closed = first.ask("close"); });
    std::thread tb([&] { ob = b.ask("open " + name + " 1048576 b"); });
    ta.join();
    tb.join();
    tc.join();
    ASSERT_NE(oa.rfind("error", 0), 0u) << oa;
    ASSERT_NE(ob.rfind("error", 0), 0u) << ob;
    EXPECT_LE((oa[0] == '1') + (ob[0] == '1'), 1) << oa << " / " << ob;
    const std::string na = a.ask("named shared 4096"), nb = b.ask("named shared 4096");
    EXPECT_EQ(na.substr(0, na.find(' ')), nb.substr(0, nb.find(' ')));
    EXPECT_NE(na.back() == '1', nb.back() == '1') << "two pools under one name: " << na << " / " << nb;
  }
}

// --- item 7: arithmetic near 2^64 -----------------------------------------------------

TEST(NodePoolHardening, CapacitiesAndOffsetsNear2To64AreRefusedNotWrapped) {
  NodePoolOptions o;
  for (uint64_t cap : {~uint64_t{0}, ~uint64_t{0} - 65536 + 2, ~uint64_t{0} - 65536 * 3}) {
    o.capacity = cap;
    try {
      auto p = NodePool::open(unique_name("huge"), o);
      ADD_FAILURE() << "capacity " << cap << " opened a pool of capacity " << p->capacity();
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("2^32 granules"), std::string::npos) << e.what();
    }
  }
  o.capacity = size_t{1} << 20;
  auto pool = NodePool::open(unique_name("edges"), o);
  pool->allocate_named("n", 4096);
  // The region's bytes before the data, but the lock's (they change with every lock and unlock).
  const char* base = static_cast<const char*>(pool->region_base());
  const size_t lock_at = offsetof(Header, lock), after_lock = lock_at + sizeof(pthread_mutex_t);
  const std::vector<char> head(base, static_cast<const char*>(pool->data()));
  for (uint64_t off : {~uint64_t{0} - 3, ~uint64_t{0} - 7, ~uint64_t{0} - 65535, uint64_t{1} << 63}) {
    EXPECT_THROW(pool->add(off, 1), InvalidArgument) << off;
    EXPECT_THROW(pool->load(off), InvalidArgument) << off;
    EXPECT_THROW(pool->wait_at_least(off, 1, 0), InvalidArgument) << off;
    EXPECT_THROW(pool->find(off), InvalidArgument) << off;
    EXPECT_THROW(pool->release(off), InvalidArgument) << off;
    EXPECT_THROW(pool->take(off), InvalidArgument) << off;
  }
  EXPECT_THROW(pool->load(pool->capacity() - 2), InvalidArgument);
  EXPECT_EQ(pool->load(pool->capacity() - 4), 0u);  // the last word is inside
  EXPECT_THROW(pool->allocate(~uint64_t{0}), OutOfMemory);
  EXPECT_THROW(pool->allocate_named("big", ~uint64_t{0}), OutOfMemory);
  try {
    pool->allocate_named("n", ~uint64_t{0});
    ADD_FAILURE() << "a named block's size mismatch near 2^64 was not refused";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()).find("not 0 B"), std::string::npos) << e.what();
  }
  EXPECT_EQ(std::memcmp(head.data(), base, lock_at), 0) << "the pool's header changed";
  EXPECT_EQ(std::memcmp(head.data() + after_lock, base + after_lock, head.size() - after_lock), 0)
      << "the pool's metadata (members, named blocks, arrays, the bytes before the data) changed";
  EXPECT_EQ(pool->stats().used, 65536u);
}

// --- item 8: timeouts -----------------------------------------------------------------

TEST(NodePoolHardening, TimeoutsAreSecondsInfinityIsForeverNaNIsRefused) {
  NodePoolOptions o;
  o.capacity = size_t{1} << 20;
  const std::string name = unique_name("timeouts");
  auto pool = NodePool::open(name, o);
  const NodeBlock b = pool->allocate(4096);
  uint32_t target = 0;
  for (double t : {kForever, 1e10, 1e300, 1e9, -1.0}) {  // -1: no limit, the C API's rule
    ++target;
    const auto t0 = std::chrono::steady_clock::now();  // the bump comes 30 ms after this at least
    std::thread bump([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      pool->add(b.offset, 1);
    });
    EXPECT_TRUE(pool->wait_at_least(b.offset, target, t)) << "timeout " << t << " did not wait";
    EXPECT_GE(seconds_since(t0), 0.02) << t;
    bump.join();
  }
  EXPECT_FALSE(pool->wait_at_least(b.offset, target + 1, 0));
  EXPECT_FALSE(pool->wait_at_least(b.offset, target + 1, 0.01));
  EXPECT_THROW(pool->wait_at_least(b.offset, target + 1, std::nan("")), InvalidArgument);
  NodePoolOptions bad;
  for (double t : {std::nan(""), -1.0, -1e300}) {
    bad.attach_timeout_s = t;
    EXPECT_THROW(NodePool::open(unique_name("badtimeout"), bad), InvalidArgument) << t;
  }
  MemberProcess m;  // an open with no limit attaches as any other
  NodePoolOptions forever;
  forever.attach_timeout_s = kForever;
  pool.reset();
  ASSERT_EQ(m.ask("open " + name + " 1048576 m").substr(0, 2), "1 ");
  auto again = NodePool::open(name, forever);
  EXPECT_FALSE(again->stats().created);
}

// --- item 9: a forked child that drops its copy of a pool ------------------------------

TEST(NodePoolHardening, AForkedChildThatDropsItsPoolExitsCleanly) {
  NodePoolOptions o;
  o.capacity = size_t{1} << 20;
  auto pool = NodePool::open(unique_name("forkdrop"), o);
  for (int i = 0; i < 20; ++i) {
    const ferrytest::ChildEnd end = ferrytest::run_in_child([&](const auto&) {
      pool.reset();  // the child's copy of the last reference: ~NodePool in the child
      return 0;
    });
    ASSERT_TRUE(end.clean()) << "round " << i << ": " << end.describe();
  }
  EXPECT_TRUE(pool->stats().created);  // the parent's member is untouched
  EXPECT_EQ(pool->stats().members.size(), 1u);
}

// --- item 10: a stopped member --------------------------------------------------------

TEST(NodePoolHardening, AStoppedMemberDelaysNoOpenPastItsDeadline) {
  const std::string name = unique_name("stopped");
  MemberProcess stopped, alive;
  ASSERT_EQ(stopped.ask("open " + name + " 1048576 stopped").substr(0, 2), "1 ");
  ASSERT_EQ(alive.ask("open " + name + " 0 alive").substr(0, 2), "0 ");
  ASSERT_EQ(::kill(stopped.pid(), SIGSTOP), 0);
  NodePoolOptions o;
  o.attach_timeout_s = 5;
  // Another member answers at once, however many attaches the stopped one keeps in its backlog.
  for (int i = 0; i < 80; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    auto pool = NodePool::open(name, o);
    const double s = seconds_since(t0);
    ASSERT_LT(s, 0.5) << "open " << i << " waited on the stopped member";
    ASSERT_FALSE(pool->stats().created);
  }
  alive.kill9();
  // With the stopped member alone, every open ends at its deadline, saying who does not answer.
  o.attach_timeout_s = 0.05;
  for (int i = 0; i < 10; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      NodePool::open(name, o);
      ADD_FAILURE() << "an open past a stopped member made or found a pool";
      break;
    } catch (const OsError& e) {
      EXPECT_EQ(e.error_number(), ETIMEDOUT) << e.what();
      EXPECT_NE(std::string(e.what()).find("did not answer"), std::string::npos) << e.what();
    }
    ASSERT_LT(seconds_since(t0), 0.5) << "open " << i << " went past its deadline";
  }
  ASSERT_EQ(::kill(stopped.pid(), SIGCONT), 0);
  o.attach_timeout_s = 5;
  auto pool = NodePool::open(name, o);
  EXPECT_FALSE(pool->stats().created);  // the stopped member's pool, served again: never a second one
}

// --- item 12: labels ------------------------------------------------------------------

bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

TEST(NodePoolHardening, LabelsAreCutAtACharacterBoundary) {
  for (const std::string ch : {"\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80"}) {  // é € 😀: 2, 3, 4 bytes
    for (size_t lead = 0; lead < 4; ++lead) {  // the cut at byte 39 falls at every place in a character
      std::string label(lead, 'a');
      while (label.size() < 48) label += ch;
      NodePoolOptions o;
      o.capacity = size_t{1} << 20;
      o.label = label;
      auto pool = NodePool::open(unique_name("label"), o);
      const std::string got = pool->stats().members.at(0).label;
      EXPECT_TRUE(valid_utf8(got)) << "lead " << lead << ", " << ch.size() << "-byte characters: cut inside one";
      EXPECT_EQ(label.rfind(got, 0), 0u);
      EXPECT_GE(got.size(), kLabelBytes - 1 - (ch.size() - 1));
      EXPECT_TRUE(valid_utf8(pool->describe_holders()));
    }
  }
  EXPECT_EQ(utf8_prefix_bytes("short", 39), 5u);
  EXPECT_EQ(utf8_prefix_bytes(std::string("ab\0cd", 5), 39), 2u);
  EXPECT_EQ(utf8_prefix_bytes("\x80\x80\x80\x80\x80\x80", 4), 4u);  // not UTF-8: cut where asked
}

}  // namespace
}  // namespace ferry::node
