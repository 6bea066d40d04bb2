// node_pool.cpp — opening a node pool (attach or create), serving attachers,
// and the block, holder and signal-word operations over the shared Region.
#include "node/node_pool.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <pthread.h>
#include <system_error>
#include <unistd.h>

#include "core/error.h"
#include "core/fork.h"
#include "node/node_dir.h"
#include "os/dont_fork.h"
#include "os/file.h"
#include "os/futex.h"
#include "os/memory.h"
#include "os/sysfs.h"
#include "os/private_dir.h"
#include "os/unix_socket.h"

namespace ferry::node {
namespace {

using Clock = std::chrono::steady_clock;

// Open pools by name: one object per name per process (their record locks are
// per process, and closing any descriptor of the memfd would drop them).
// registry_mu guards registry() and is held across fork (core/fork.h), so it
// is held only for a lookup or an insert: no other lock, no system call under
// it. open_mu makes the opens of one process one at a time (two threads
// opening one name make one object); it is held across the whole open (system
// calls, fault injection's lock), so it is NOT held across fork: a child
// gets a fresh one instead (a thread of the parent may have held it).
std::mutex registry_mu;
std::mutex open_mu;
std::map<std::string, std::weak_ptr<NodePool>>& registry() {
  static auto* r = new std::map<std::string, std::weak_ptr<NodePool>>;  // never destroyed: used at exit
  return *r;
}
std::shared_ptr<NodePool> registered(const std::string& name) {
  std::lock_guard<std::mutex> lock(registry_mu);
  return registry()[name].lock();
}
void register_pool(const std::string& name, const std::shared_ptr<NodePool>& pool) {
  std::lock_guard<std::mutex> lock(registry_mu);
  registry()[name] = pool;
}
[[maybe_unused]] const bool g_registry_held = (hold_across_fork(&registry_mu), true);
void forget_registry_in_child() noexcept {
  // The child must not keep the parent's listening sockets (an attacher would
  // connect to one nobody serves once the parent is gone) nor its memfds (they
  // would keep the pool's memory after its last member left).
  for (auto& entry : registry())
    if (auto pool = entry.second.lock()) pool->drop_descriptors_in_child();
  abandon_in_child(&registry());  // the parent's pools are not the child's
  new (&registry()) std::map<std::string, std::weak_ptr<NodePool>>;
  new (&open_mu) std::mutex;  // unlocked, whatever a parent's thread was doing
}
[[maybe_unused]] const bool g_registry_forgotten = (at_fork_in_child(&forget_registry_in_child), true);

thread_local bool t_opening = false;  // this thread is inside open() (it holds open_mu)

// A time limit on the steady clock: seconds from now, or none.
constexpr double kForeverS = 1e9;  // longer is no limit: 10^18 ns stays far from the clock's int64 end
class Deadline {
 public:
  explicit Deadline(double seconds) : forever_(!(seconds < kForeverS)) {
    if (!forever_)
      at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  }
  bool forever() const { return forever_; }
  bool passed() const { return !forever_ && Clock::now() >= at_; }
  // Nanoseconds left (0 once passed); -1: no limit.
  int64_t left_ns() const {
    if (forever_) return -1;
    return std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::nanoseconds>(at_ - Clock::now()).count());
  }
  // Sleeps `pause`, or until the deadline if that comes first.
  void sleep(std::chrono::nanoseconds pause) const {
    if (!forever_) pause = std::min(pause, std::chrono::nanoseconds(left_ns()));
    std::this_thread::sleep_for(pause);
  }

 private:
  bool forever_;
  Clock::time_point at_{};
};

// ferry's rule for a timeout given in seconds: NaN and negative are refused.
void check_timeout(double seconds, const std::string& what) {
  if (std::isnan(seconds) || seconds < 0)
    throw InvalidArgument(what + " " + std::to_string(seconds) +
                          " s: give seconds >= 0 (infinity: no limit)");
}

std::string seconds_text(double s) {
  if (!(s < kForeverS)) return "ever";
  char text[32];
  std::snprintf(text, sizeof text, "%g s", s);
  return text;
}

// Thrown by join(): the region this attacher was handed has no live member left
// (the last one closed or died between handing the memfd and this join).
struct RegionGone {};

struct Hello {  // what a member sends with the descriptor
  uint64_t magic;
  uint32_t version;
  uint32_t pad;
  uint64_t file_bytes;
};

bool valid_name(const std::string& name) {
  bool ok = !name.empty() && name.size() <= 64;
  for (char c : name) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-');
  return ok;
}

void check_name(const std::string& name) {
  if (!valid_name(name))
    throw InvalidArgument("node pool '" + printable(name) +
                          "': use 1-64 characters of letters, digits, '.', '_' and '-'");
}

uint64_t granules_for(uint64_t bytes, uint64_t granule) { return bytes / granule + (bytes % granule != 0); }

// Whether a capacity asked (0: any) rounds up to the pool's.
bool capacity_agrees(uint64_t asked, const NodePool& pool) {
  return asked == 0 || granules_for(asked, pool.granule()) == pool.capacity() / pool.granule();
}

// The open lock of a pool name: a POSIX record lock on byte 0 of <dir>/<name>.lock,
// held by one process from its first look at the members until it serves the pool
// or gives up (issue 38: no two creators; nobody creates while an attacher is on
// its way in). A record lock, not flock(): a forked child does not inherit it, and
// the kernel drops it when its holder dies. Record locks of one process do not
// exclude each other, and closing any descriptor of the file drops them all:
// open_mu keeps this process's opens apart, and remove_open_lock_file() runs only
// outside them.
class OpenLock {
 public:
  OpenLock(const std::string& path, const std::string& name, const Deadline& deadline, double timeout_s);
  ~OpenLock() {
    bool same = false;
    if (remove_ && os::names_file(fd_, path_, &same) == 0 && same) os::remove_file(path_);
    os::unlock_byte(fd_, 0);
    os::close_fd(fd_);
  }
  OpenLock(const OpenLock&) = delete;
  OpenLock& operator=(const OpenLock&) = delete;
  // The open failed and no pool of the name lives: the file goes with the lock.
  void remove_on_release() { remove_ = true; }

 private:
  void drop() noexcept {
    os::close_fd(fd_);
    fd_ = -1;
  }
  std::string path_;
  int fd_ = -1;
  bool remove_ = false;
};

OpenLock::OpenLock(const std::string& path, const std::string& name, const Deadline& deadline, double timeout_s)
    : path_(path) {
  auto pause = std::chrono::nanoseconds(500000);
  for (;;) {
    if (fd_ < 0)
      if (int err = os::open_lock_file(path, &fd_)) throw OsError("node pool '" + name + "': open of " + path, err);
    const int err = os::lock_byte(fd_, 0);
    bool same = false;
    if (err == 0) {
      if (int e = os::names_file(fd_, path, &same)) {
        drop();
        throw OsError("node pool '" + name + "': lstat of " + path, e);
      }
      if (same) return;
      drop();  // the last member removed the file meanwhile: lock the one the path names now
      continue;
    }
    if (err != EAGAIN) {
      drop();
      throw OsError("node pool '" + name + "': fcntl(F_SETLK) of " + path, err);
    }
    if (deadline.passed()) {
      drop();
      throw OsError("node pool '" + name + "': another process of this user has been opening it for " +
                        seconds_text(timeout_s) + " (it holds " + path + "; is it stopped?); open",
                    ETIMEDOUT);
    }
    deadline.sleep(pause);
    pause = std::min(pause * 2, std::chrono::nanoseconds(10000000));
  }
}

// Where the pool's processes meet.
struct Place {
  std::string dir, name;
};

// One look at the members' sockets (the open lock held: nobody joins meanwhile).
struct Look {
  struct Asked {
    int sock;
    uint32_t slot;
    pid_t pid;
  };
  std::vector<Asked> asked;   // connected to a listener of this uid: its answer is on the way
  std::vector<uint32_t> full; // slots whose listener's backlog is full (it does not accept)
  Look() = default;
  Look(const Look&) = delete;
  Look& operator=(const Look&) = delete;
  ~Look() {
    for (const Asked& a : asked) os::close_fd(a.sock);
  }
  bool nobody() const { return asked.empty() && full.empty(); }
  std::string describe() const {
    std::string s;
    for (const Asked& a : asked)
      s += (s.empty() ? "" : ", ") + std::string("slot ") + std::to_string(a.slot) + " pid " + std::to_string(a.pid);
    for (uint32_t slot : full) s += (s.empty() ? "" : ", ") + std::string("slot ") + std::to_string(slot) + " (backlog full)";
    return s;
  }
};

constexpr size_t kMaxAsked = 32;  // connections asked at once

// Connects to every slot's socket. A stale one (ECONNREFUSED: its member died) is
// removed; one of another uid (there only if that user may write here: root) is not
// a member and is left alone; any other failure (out of descriptors) is an error,
// never "nobody serves it": a second pool of the name would follow.
void look_at_members(const Place& place, Look* out) {
  for (uint32_t s = 0; s < kMaxMembers && out->asked.size() < kMaxAsked; ++s) {
    const std::string path = member_socket_path(place.dir, place.name, s);
    int sock = -1;
    const int err = os::connect_at(path, &sock);
    if (err == ENOENT || err == EACCES) continue;
    if (err == ECONNREFUSED) {
      os::remove_socket_file(path);
      continue;
    }
    if (err == EAGAIN) {
      out->full.push_back(s);
      continue;
    }
    if (err) throw OsError("node pool '" + place.name + "': connect to the member socket " + path, err);
    os::PeerCredentials peer;
    const int perr = os::peer_credentials(sock, &peer);
    if (perr || peer.uid != geteuid()) {
      os::close_fd(sock);
      if (perr) throw OsError("node pool '" + place.name + "': getsockopt(SO_PEERCRED) of " + path, perr);
      continue;
    }
    out->asked.push_back({sock, s, peer.pid});
  }
}

// The pool a file of the directory belongs to ("" if none): <name>.lock, <name>.<slot>.
std::string pool_of_file(const std::string& file) {
  const size_t dot = file.rfind('.');
  if (dot == std::string::npos || dot == 0) return "";
  const std::string tail = file.substr(dot + 1);
  const bool slot = !tail.empty() && tail.size() <= 3 && tail.find_first_not_of("0123456789") == std::string::npos;
  const std::string name = file.substr(0, dot);
  return (tail == "lock" || slot) && valid_name(name) ? name : "";
}

// Sweeps the pool `name` (files: the directory's) under its open lock, taken only if
// free: its stale sockets go, and its lock file when no socket of it lives.
void sweep_pool(const std::string& dir, const std::string& name, const std::vector<std::string>& files) {
  const std::string lock_path = open_lock_path(dir, name);
  int fd = -1;
  if (os::open_lock_file(lock_path, &fd) != 0) return;
  bool same = false;
  if (os::lock_byte(fd, 0) == 0 && os::names_file(fd, lock_path, &same) == 0 && same) {
    bool live = false;
    for (const std::string& f : files) {
      if (f == name + ".lock" || pool_of_file(f) != name) continue;
      const std::string path = dir + "/" + f;
      int sock = -1;
      const int err = os::connect_at(path, &sock);
      if (err == 0) os::close_fd(sock);
      if (err == ECONNREFUSED)
        os::remove_socket_file(path);
      else if (err != ENOENT)
        live = true;  // it answers, its backlog is full, or we cannot tell: keep the pool's files
    }
    if (!live) os::remove_file(lock_path);
  }
  os::close_fd(fd);  // drops the lock (no other lock of this process is on that file: open_mu is ours)
}

// What dead pools of other names left in the directory: the sockets of members killed
// with SIGKILL and the lock files of names nobody serves (a pool removes its own files
// only when its last member closes). The creator of a pool sweeps (a pool's first
// open, under open_mu), so that a directory that sees many short-lived pools (tests,
// crashes) does not fill up.
void sweep_dead_pools(const Place& place) noexcept {
  try {
    std::vector<std::string> files;
    if (os::list_directory(place.dir, &files) != 0) return;
    std::set<std::string> names;
    for (const std::string& f : files)
      if (std::string n = pool_of_file(f); !n.empty() && n != place.name) names.insert(n);
    for (const std::string& n : names) sweep_pool(place.dir, n, files);
  } catch (...) {  // out of memory: a sweep is no reason to fail an open
  }
}

struct Answer {
  int fd = -1;  // the region's memfd; -1: no answer
  Hello hello{};
  uint32_t slot = 0;
  pid_t pid = 0;
};

// The first answer of the members asked, by the deadline (fd -1: all hung up, or
// the deadline passed). A peer of this uid that answers with something else than a
// node pool's hello is an error (another program at our path), not a member.
Answer first_answer(const Place& place, Look* look, const Deadline& deadline) {
  while (!look->asked.empty()) {
    std::vector<int> fds;
    for (const Look::Asked& a : look->asked) fds.push_back(a.sock);
    size_t i = 0;
    const int err = os::wait_readable(fds.data(), fds.size(), deadline.left_ns(), &i);
    if (err == ETIMEDOUT) return {};
    if (err == EINTR) continue;
    if (err) throw OsError("node pool '" + place.name + "': poll of its member sockets", err);
    const Look::Asked asked = look->asked[i];
    Answer a{-1, {}, asked.slot, asked.pid};
    size_t got = 0;
    const int rerr = os::receive_with_fd(asked.sock, &a.hello, sizeof a.hello, &got, &a.fd);
    if (rerr == EAGAIN) continue;
    os::close_fd(asked.sock);
    look->asked.erase(look->asked.begin() + static_cast<long>(i));
    if (rerr == 0 && got == sizeof a.hello) return a;
    if (rerr == 0) os::close_fd(a.fd);
    if (rerr == 0 || rerr == EPROTO)
      throw NotSupported("node pool '" + place.name + "': the process at its member socket " +
                         member_socket_path(place.dir, place.name, a.slot) + " (pid " + std::to_string(a.pid) +
                         ") answered with something that is not a node pool of this ferry (" +
                         std::to_string(got) + " bytes" + (rerr ? ", no descriptor" : "") + ")");
    // Anything else (ECONNRESET: it closed without an answer): a member leaving; the others may answer.
  }
  return {};  // every member asked hung up: they were leaving
}

// Asks the members for the region's memfd (the open lock held). fd -1: nobody
// serves it (every slot's socket absent or stale). Members that live but do not
// answer by the deadline (stopped, in a debugger): OsError(ETIMEDOUT) naming them.
Answer ask_members(const Place& place, const Deadline& deadline, double timeout_s) {
  for (;;) {
    Look look;
    look_at_members(place, &look);
    if (look.nobody()) return {};
    const std::string who = look.describe();
    Answer a = first_answer(place, &look, deadline);
    if (a.fd >= 0) return a;
    if (deadline.passed())
      throw OsError("node pool '" + place.name + "': its members (" + who + ") did not answer within " +
                        seconds_text(timeout_s) + " (stopped? in a debugger?); open",
                    ETIMEDOUT);
    deadline.sleep(std::chrono::milliseconds(1));  // a full backlog, or members leaving: look again
  }
}

struct Mapped {
  int fd = -1;
  void* map = nullptr;
  size_t bytes = 0;
};

Mapped map_region(int fd, size_t bytes, const std::string& name) {
  Mapped m{fd, nullptr, bytes};
  if (int err = os::map_shared(fd, bytes, size_t{2} << 20, &m.map)) {
    os::close_fd(fd);
    throw OsError("mmap of node pool '" + name + "' (" + format_bytes(bytes) + ")", err);
  }
  if (int err = os::hide_from_fork(m.map, bytes)) {
    os::unmap(m.map, bytes);
    os::close_fd(fd);
    throw OsError("madvise(MADV_DONTFORK) of node pool '" + name + "'", err);
  }
  return m;
}

// Why the file cannot have 2 MiB hugetlb pages under `policy` ("" if it can:
// enough are free for all of it).
std::string hugetlb_shortfall(uint64_t file_bytes, HugePolicy policy) {
  if (policy == HugePolicy::thp || policy == HugePolicy::off) return "not asked for";
  uint64_t free_pages = 0;
  if (int err = os::read_unreserved_hugepages(os::kHugePage2MBytes, &free_pages))
    return "no 2 MiB hugetlb pool (" + std::string(std::strerror(err)) + ")";
  const uint64_t needed = file_bytes / os::kHugePage2MBytes;
  if (free_pages < needed)
    return std::to_string(free_pages) + " free unreserved 2 MiB hugetlb pages, " + std::to_string(needed) +
           " needed";
  return "";
}

// The data's capacity for o.capacity: whole granules, at most 2^32 of them.
uint64_t checked_capacity(const std::string& name, const NodePoolOptions& o) {
  const size_t granule = o.granule;
  if (granule < 4096 || granule > (size_t{1} << 30) || (granule & (granule - 1)))
    throw InvalidArgument("node pool '" + name + "': granule " + std::to_string(granule) +
                          " must be a power of two from 4 KiB to 1 GiB");
  if (o.capacity == 0)
    throw InvalidArgument("node pool '" + name +
                          "': no live process serves it, and capacity is 0: the process that creates "
                          "a node pool gives its capacity (the node-wide budget, in bytes)");
  const uint64_t granules = granules_for(o.capacity, granule);  // no overflow near 2^64 (issue 38)
  if (granules >= (uint64_t{1} << 32))
    throw InvalidArgument("node pool '" + name + "': capacity " + std::to_string(o.capacity) + " bytes (" +
                          format_bytes(o.capacity) + ") is over 2^32 granules of " + format_bytes(granule) +
                          "; use a larger granule");
  return granules * granule;
}

Mapped create_region(const std::string& name, const NodePoolOptions& o) {
  const uint64_t capacity = checked_capacity(name, o);
  const Region::Layout l = Region::layout(capacity, o.granule);
  const std::string memfd_name = "ferry-node:" + name;
  int fd = -1;
  Mapped m;
  std::string no_hugetlb = hugetlb_shortfall(l.file_bytes, o.huge_pages);
  if (no_hugetlb.empty()) {  // hugetlb: the mmap reserves every page, so a shortfall shows here, not as SIGBUS later
    int err = os::create_memfd(memfd_name.c_str(), l.file_bytes, os::kHugePage2MBytes, &fd);
    if (err == 0) {
      try {
        m = map_region(fd, l.file_bytes, name);
      } catch (const OsError& e) {
        no_hugetlb = e.what();
      }
    } else {
      no_hugetlb = std::string("memfd_create(MFD_HUGETLB): ") + std::strerror(err);
    }
  }
  if (!no_hugetlb.empty() && o.huge_pages == HugePolicy::hugetlb)
    throw NotSupported("node pool '" + name + "': huge_pages=hugetlb, but " + no_hugetlb +
                       " (reserve them: echo N > " + os::hugepages_dir(os::kHugePage2MBytes) +
                       "/nr_hugepages, as root)");
  const bool hugetlb = no_hugetlb.empty();
  if (!hugetlb) {
    if (int err = os::create_memfd(memfd_name.c_str(), l.file_bytes, 0, &fd))
      throw OsError("memfd_create for node pool '" + name + "' (" + format_bytes(l.file_bytes) + ")", err);
    m = map_region(fd, l.file_bytes, name);
    if (o.huge_pages != HugePolicy::off)  // shmem THP where shmem_enabled allows it
      os::advise_huge(static_cast<char*>(m.map) + l.data_offset, capacity);
  }
  Region(m.map).init(capacity, o.granule, getpid(), hugetlb ? os::kHugePage2MBytes : os::kSmallPageBytes);
  return m;
}

// Maps what a member handed, once it is checked: a file of this uid (no other user's
// memory, issue 38), of this ferry's version, with a header that fits the file.
Mapped attach_region(const Answer& a, const Place& place) {
  const std::string from = "the member in slot " + std::to_string(a.slot) + " (pid " + std::to_string(a.pid) + ")";
  uid_t owner = 0;
  if (int err = os::descriptor_owner(a.fd, &owner)) {
    os::close_fd(a.fd);
    throw OsError("node pool '" + place.name + "': fstat of the descriptor " + from + " handed", err);
  }
  if (owner != geteuid()) {
    os::close_fd(a.fd);
    throw OsError("node pool '" + place.name + "': " + from + " handed a file of uid " + std::to_string(owner) +
                      ", not of this process's " + std::to_string(geteuid()) + "; refused",
                  EACCES);
  }
  uint64_t size = 0;
  if (os::regular_file_size(a.fd, &size) != 0 || size != a.hello.file_bytes || a.hello.magic != kMagic ||
      a.hello.version != kVersion) {
    os::close_fd(a.fd);
    throw NotSupported("node pool '" + place.name + "': " + from + " sent a region of version " +
                       std::to_string(a.hello.version) + " (this ferry speaks " + std::to_string(kVersion) +
                       "): every process of a node must run the same ferry");
  }
  Mapped m = map_region(a.fd, a.hello.file_bytes, place.name);
  if (const std::string why = Region(m.map).header_problem(m.bytes); !why.empty()) {
    os::forget_hidden(m.map);
    os::unmap(m.map, m.bytes);
    os::close_fd(m.fd);
    throw NotSupported("node pool '" + place.name + "': " + from + " handed a region that is not a node pool's (" +
                       why + ")");
  }
  return m;
}

}  // namespace

std::shared_ptr<NodePool> NodePool::open(const std::string& name, const NodePoolOptions& options) {
  check_name(name);
  check_timeout(options.attach_timeout_s, "node pool '" + name + "': attach_timeout_s");
  std::lock_guard<std::mutex> opening(open_mu);
  t_opening = true;
  struct Done {
    ~Done() { t_opening = false; }
  } done;
  if (auto existing = registered(name)) {
    if (!capacity_agrees(options.capacity, *existing))
      throw InvalidArgument("node pool '" + name + "' is open in this process with capacity " +
                            format_bytes(existing->capacity()) + ", not " + format_bytes(options.capacity));
    return existing;
  }
  const Deadline deadline(options.attach_timeout_s);
  const Place place{private_node_dir(options.dir, name), name};
  OpenLock held(open_lock_path(place.dir, name), name, deadline, options.attach_timeout_s);
  bool created = false;
  try {
    for (;;) {
      const Answer a = ask_members(place, deadline, options.attach_timeout_s);
      created = a.fd < 0;
      const Mapped m = created ? create_region(name, options) : attach_region(a, place);
      std::shared_ptr<NodePool> pool(new NodePool(name, place.dir, m.fd, m.map, m.bytes, created));
      if (!capacity_agrees(options.capacity, *pool))
        throw InvalidArgument("node pool '" + name + "' exists with capacity " + format_bytes(pool->capacity()) +
                              ", not the " + format_bytes(options.capacity) +
                              " asked; pass capacity=0 to attach to whatever it is");
      try {
        pool->join(options.label, options.attach_timeout_s, deadline.left_ns());
      } catch (const RegionGone&) {
        continue;  // its last member left before we joined: look again (the open lock is still ours)
      }
      register_pool(name, pool);
      if (created) sweep_dead_pools(place);
      return pool;
    }
  } catch (...) {
    if (created) held.remove_on_release();  // nobody served it, and this open made nothing that lives
    throw;
  }
}

NodePool::NodePool(std::string name, std::string dir, int fd, void* map, size_t map_bytes, bool created)
    : name_(std::move(name)), dir_(std::move(dir)), fd_(fd), map_(map), map_bytes_(map_bytes), created_(created),
      region_(map), data_(region_.data()), capacity_(region_.header().capacity),
      granule_(region_.header().granule), generation_(fork_generation()) {}

void NodePool::join(const std::string& label, double timeout_s, int64_t timeout_ns) {
  bool repaired = false;
  if (region_.lock_for(timeout_ns, &repaired) != 0)
    throw OsError("node pool '" + name_ + "': a member has held its lock for " + seconds_text(timeout_s) +
                      " (stopped? in a debugger?); open",
                  ETIMEDOUT);
  reclaim_dead_locked();
  if (!created_ && !region_.has_live_member()) {
    region_.unlock();
    throw RegionGone{};
  }
  const uint32_t slot = region_.claim_member(getpid(), label.empty() ? "pid " + std::to_string(getpid()) : label);
  const int err = slot < kMaxMembers ? os::lock_byte(fd_, slot) : 0;
  if (slot < kMaxMembers && err != 0) region_.release_member(slot);
  region_.unlock();
  if (slot >= kMaxMembers)
    throw OutOfMemory("node pool '" + name_ + "' has " + std::to_string(kMaxMembers) + " live members already");
  if (err) throw OsError("fcntl(F_SETLK) of node pool '" + name_ + "' member slot", err);
  slot_ = slot;
  start_serving();  // on failure the destructor leaves the slot
}

// A member that cannot serve does not join: nobody could attach through it, and
// the next process to find no member would make a second pool of the name.
void NodePool::start_serving() {
  const std::string path = member_socket_path(dir_, name_, slot_);
  os::remove_socket_file(path);  // a dead member's, whose slot this is now (the open lock held: nobody else binds)
  if (int err = os::listen_at(path, &listen_fd_))
    throw OsError("node pool '" + name_ + "': bind of its member socket " + path +
                      " (a member that cannot serve attachers does not join)",
                  err);
  socket_path_ = path;
  try {
    server_ = std::thread([this] { serve(); });
  } catch (const std::system_error& e) {
    throw OsError("node pool '" + name_ + "': starting its serving thread", e.code().value());
  }
  pthread_setname_np(server_.native_handle(), "ferry-node");  // named before open returns: ps, /proc/*/task/*/comm
}

NodePool::~NodePool() {
  if (generation_ != fork_generation()) {
    // A forked child: the parent's member, not ours. The serving thread exists only in
    // the parent: forget its handle (destroying a joinable std::thread calls terminate).
    new (&server_) std::thread;
    return;
  }
  stop_serving();
  if (leave()) remove_open_lock_file();
  os::forget_hidden(map_);
  os::unmap(map_, map_bytes_);
  os::close_fd(fd_);
}

void NodePool::stop_serving() noexcept {
  if (listen_fd_ < 0) return;
  // The file goes first, while this socket still listens: until then it is ours. Once
  // the socket stops listening the file is stale to everyone else, and an open may
  // remove it and bind the path anew (a new pool of the name reuses slot numbers):
  // removing it after that would remove theirs.
  if (!socket_path_.empty()) os::remove_socket_file(socket_path_);
  stopping_.store(true);
  os::shutdown_socket(listen_fd_);
  if (server_.joinable()) server_.join();
  os::close_fd(listen_fd_);
  listen_fd_ = -1;
}

bool NodePool::leave() noexcept {
  if (slot_ >= kMaxMembers) return false;
  lock();
  region_.release_member(slot_);
  os::unlock_byte(fd_, slot_);
  const bool last = !region_.has_live_member();
  region_.unlock();
  slot_ = kMaxMembers;
  return last;
}

// The last member removes the open lock file, under its lock (an open waiting on the
// file it removed sees the path gone and locks the new one). Not while an open of
// this process is under way: that open holds the lock through another descriptor,
// and closing ours would drop it.
void NodePool::remove_open_lock_file() noexcept {
  if (t_opening || !open_mu.try_lock()) return;
  const std::string path = open_lock_path(dir_, name_);
  int fd = -1;
  if (os::open_lock_file(path, &fd) == 0) {
    bool same = false;
    if (os::lock_byte(fd, 0) == 0 && os::names_file(fd, path, &same) == 0 && same) os::remove_file(path);
    os::close_fd(fd);  // drops the lock
  }
  open_mu.unlock();
}

void NodePool::drop_descriptors_in_child() noexcept {
  if (listen_fd_ >= 0) os::close_fd(listen_fd_);
  os::close_fd(fd_);
  listen_fd_ = fd_ = -1;
}

void NodePool::lock() const {
  if (region_.lock()) const_cast<NodePool*>(this)->reclaim_dead_locked();  // whoever died holding it is gone
}

void NodePool::serve() {
  const Hello hello{kMagic, kVersion, 0, region_.header().file_bytes};
  for (;;) {
    int conn = -1;
    if (int err = os::accept_connection(listen_fd_, &conn)) {
      if (stopping_.load()) return;  // shut down
      // Out of descriptors or memory (the connection waits in the backlog), or an
      // aborted connection: serve on; a member that stopped serving would leave the
      // pool unreachable while it lives.
      (void)err;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    os::PeerCredentials peer;
    if (os::peer_credentials(conn, &peer) == 0 && peer.uid == geteuid())
      os::send_with_fd(conn, &hello, sizeof hello, fd_);
    os::close_fd(conn);
  }
}

void NodePool::check_usable(const char* what) const {
  if (generation_ != fork_generation())
    throw NotSupported(forked_child_message("node pool '" + name_ + "'") + " (" + what + ")");
}

uint64_t NodePool::reclaim_dead_locked() {
  const uint64_t before = region_.header().used_granules;
  for (uint32_t s = 0; s < kMaxMembers; ++s) {
    if (s == slot_ || !region_.member(s).live) continue;
    bool alive = true;
    if (os::byte_locked_by_other(fd_, s, &alive) == 0 && !alive) region_.release_member(s);
  }
  return (before - region_.header().used_granules) * region_.header().granule;
}

uint64_t NodePool::reclaim_dead() {
  check_usable("reclaim_dead");
  lock();
  const uint64_t freed = reclaim_dead_locked();
  region_.unlock();
  return freed;
}

std::string NodePool::out_of_memory(size_t bytes, const char* what) const {  // region locked
  const Header& h = region_.header();
  return "node pool '" + name_ + "': " + what + " of " + format_bytes(bytes) + " does not fit: " +
         format_bytes((h.granules - h.used_granules) * h.granule) + " free of " + format_bytes(h.capacity) +
         " (largest free run " + format_bytes(region_.largest_free_run()) + "). Held: " + describe_holders();
}

std::string NodePool::describe_holders() const {  // region locked, or for stats
  std::string s;
  for (const HolderInfo& m : region_.holders()) {
    if (!s.empty()) s += "; ";
    s += "pid " + std::to_string(m.pid) + " (" + m.label + ")" + (m.slot == slot_ ? " [this process]" : "") +
         ": " + std::to_string(m.blocks) + " blocks, " + format_bytes(m.bytes);
    if (m.named) s += ", holds " + std::to_string(m.named) + " named";
  }
  std::string named;
  for (uint32_t i = 0; i < kMaxNamed; ++i) {
    const Named& n = region_.named(i);
    if (!n.used) continue;
    if (!named.empty()) named += ", ";
    named += "'" + printable(std::string(n.key, strnlen(n.key, kKeyBytes))) + "' " +
             format_bytes(n.count * region_.header().granule);
  }
  if (!named.empty()) s += "; named blocks: " + named;
  return s.empty() ? "nobody" : s;
}

NodeBlock NodePool::allocate(size_t bytes) {
  check_usable("allocate");
  if (bytes == 0) throw InvalidArgument("node pool '" + name_ + "': allocate of 0 bytes");
  const uint64_t g = granule(), count = granules_for(bytes, g);
  lock();
  uint64_t first = count <= region_.header().granules ? region_.allocate(slot_, count) : kNone;
  if (first == kNone && reclaim_dead_locked() > 0) first = region_.allocate(slot_, count);
  if (first == kNone) {
    const std::string m = out_of_memory(bytes, "allocate");
    region_.unlock();
    throw OutOfMemory(m);
  }
  region_.unlock();
  return {first * g, count * g};
}

NodeBlock NodePool::allocate_named(const std::string& key, size_t bytes, bool* created) {
  check_usable("allocate_named");
  if (key.empty() || key.size() >= kKeyBytes || key.find('\0') != std::string::npos)
    throw InvalidArgument("node pool '" + name_ + "': key '" + printable(key) + "' must be 1-" +
                          std::to_string(kKeyBytes - 1) + " bytes with no NUL");
  if (bytes == 0) throw InvalidArgument("node pool '" + name_ + "': allocate_named of 0 bytes");
  const uint64_t g = granule(), count = granules_for(bytes, g);
  lock();
  const uint32_t found = region_.find_named(key);
  if (found < kMaxNamed) {
    const Named& n = region_.named(found);
    if (n.count != count) {
      const uint64_t have = n.count * g;
      region_.unlock();
      throw InvalidArgument("node pool '" + name_ + "': named block '" + printable(key) + "' exists with " +
                            format_bytes(have) + ", not " +
                            format_bytes(count <= region_.header().granules ? count * g : bytes));
    }
    region_.hold_named(found, slot_);
    const NodeBlock b{n.first * g, n.count * g};
    region_.unlock();
    if (created) *created = false;
    return b;
  }
  uint64_t first = count <= region_.header().granules ? region_.allocate(kMaxMembers, count) : kNone;
  if (first == kNone && reclaim_dead_locked() > 0) first = region_.allocate(kMaxMembers, count);
  if (first == kNone) {
    const std::string m = out_of_memory(bytes, ("allocate_named '" + printable(key) + "'").c_str());
    region_.unlock();
    throw OutOfMemory(m);
  }
  // Its first page reads as zero before any other process can find it: signal words
  // there start at 0, not at what an earlier block left in recycled memory.
  std::memset(data_ + first * g, 0, std::min<uint64_t>(count * g, kZeroedHeadBytes));
  if (region_.create_named(key, first, count, slot_) == kMaxNamed) {
    region_.free_block(first);
    region_.unlock();
    throw OutOfMemory("node pool '" + name_ + "': all " + std::to_string(kMaxNamed) + " named blocks are in use");
  }
  region_.unlock();
  if (created) *created = true;
  return {first * g, count * g};
}

NodeBlock NodePool::checked_block(uint64_t offset, const char* what) const {  // region locked
  const uint64_t g = granule();
  const uint64_t count = offset % g == 0 ? region_.block_count(offset / g) : 0;
  if (count == 0) {
    region_.unlock();
    throw InvalidArgument("node pool '" + name_ + "': " + what + ": no live block starts at offset " +
                          std::to_string(offset) + " (handles are the offsets allocate() returned; the block "
                          "may have been freed, or its owner died)");
  }
  return {offset, count * g};
}

NodeBlock NodePool::find(uint64_t offset) const {
  check_usable("find");
  lock();
  const NodeBlock b = checked_block(offset, "find");
  region_.unlock();
  return b;
}

void NodePool::release(uint64_t offset) {
  check_usable("release");
  lock();
  checked_block(offset, "release");
  const uint64_t first = offset / granule();
  if (region_.block_owner(first) == kNamedOwner) {
    const uint32_t i = region_.named_of_block(first);
    if (i == kMaxNamed || !region_.holds_named(i, slot_)) {
      region_.unlock();
      throw InvalidArgument("node pool '" + name_ + "': release: this process does not hold the named block at " +
                            std::to_string(offset) + " (named blocks are let go of by the processes that asked "
                            "for them with allocate_named)");
    }
    region_.drop_named(i, slot_);
  } else {
    region_.free_block(first);
  }
  region_.unlock();
}

void NodePool::take(uint64_t offset) {
  check_usable("take");
  lock();
  checked_block(offset, "take");
  const uint64_t first = offset / granule();
  if (region_.block_owner(first) == kNamedOwner) {
    region_.unlock();
    throw InvalidArgument("node pool '" + name_ + "': take: the block at " + std::to_string(offset) +
                          " is named; allocate_named() with its key holds it instead");
  }
  region_.give(first, slot_);
  region_.unlock();
}

NodePoolStats NodePool::stats() {
  check_usable("stats");
  NodePoolStats s;
  lock();
  reclaim_dead_locked();
  const Header& h = region_.header();
  s.capacity = h.capacity;
  s.granule = h.granule;
  s.used = h.used_granules * h.granule;
  s.largest_free = region_.largest_free_run();
  s.repairs = h.repairs;
  s.page_bytes = h.page_bytes;
  s.members = region_.holders();
  region_.unlock();
  s.slot = slot_;
  s.created = created_;
  return s;
}

uint32_t* NodePool::word(uint64_t offset, const char* what) const {
  check_usable(what);
  if (offset % 4 != 0 || offset > capacity() - 4)  // not offset + 4 > capacity: that wraps at 2^64 - 4
    throw InvalidArgument("node pool '" + name_ + "': " + what + ": offset " + std::to_string(offset) +
                          " is not a 4-byte aligned word inside the pool's " + format_bytes(capacity()));
  return reinterpret_cast<uint32_t*>(data() + offset);
}

uint32_t NodePool::add(uint64_t offset, uint32_t n) {
  uint32_t* w = word(offset, "add");
  const uint32_t before = std::atomic_ref<uint32_t>(*w).fetch_add(n, std::memory_order_acq_rel);
  os::futex_wake_shared(w);
  return before;
}

uint32_t NodePool::load(uint64_t offset) const {
  return std::atomic_ref<uint32_t>(*word(offset, "load")).load(std::memory_order_acquire);
}

bool NodePool::wait_at_least(uint64_t offset, uint32_t value, double timeout_s) const {
  uint32_t* w = word(offset, "wait_at_least");
  if (std::isnan(timeout_s))
    throw InvalidArgument("node pool '" + name_ + "': wait_at_least: timeout NaN: give seconds >= 0 (infinity: no limit)");
  const Deadline deadline(timeout_s < 0 ? kForever : timeout_s);
  for (;;) {
    const uint32_t v = std::atomic_ref<uint32_t>(*w).load(std::memory_order_acquire);
    if (static_cast<int32_t>(v - value) >= 0) return true;  // wrap-safe: counters only grow
    if (deadline.passed()) return false;
    // A slice at most: a waker of an older ferry, or a lost wake, costs 100 ms, never a hang.
    const int64_t left = deadline.left_ns();
    os::futex_wait_shared(w, v, left < 0 ? 100000000 : std::min<int64_t>(left, 100000000));
  }
}

}  // namespace ferry::node
