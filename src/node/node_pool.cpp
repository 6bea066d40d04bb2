// node_pool.cpp — opening a node pool (attach or create), serving attachers,
// and the block, holder and signal-word operations over the shared Region.
#include "node/node_pool.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <pthread.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fork.h"
#include "os/dont_fork.h"
#include "os/file.h"
#include "os/futex.h"
#include "os/memory.h"
#include "os/sysfs.h"
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

constexpr int kServeTimeoutMs = 2000;

struct Hello {  // what a member sends with the descriptor
  uint64_t magic;
  uint32_t version;
  uint32_t pad;
  uint64_t file_bytes;
};

std::string socket_name(const std::string& name, const std::string& what) {
  return "ferry-node." + std::to_string(geteuid()) + "." + name + "." + what;
}

void check_name(const std::string& name) {
  bool ok = !name.empty() && name.size() <= 64;
  for (char c : name) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-');
  if (!ok)
    throw InvalidArgument("node pool name '" + printable(name) +
                          "': use 1-64 characters of letters, digits, '.', '_' and '-'");
}

// Asks each member slot's socket in turn for the descriptor; -1 when none answers.
int ask_members(const std::string& name, Hello* hello) {
  for (uint32_t s = 0; s < kMaxMembers; ++s) {
    int sock = -1;
    if (os::connect_abstract(socket_name(name, std::to_string(s)), &sock) != 0) continue;
    os::set_receive_timeout(sock, kServeTimeoutMs);  // a socket nobody serves must not hang the open
    int fd = -1;
    size_t got = 0;
    const int err = os::receive_with_fd(sock, hello, sizeof *hello, &got, &fd);
    os::close_fd(sock);
    if (err == 0 && got == sizeof *hello && hello->magic == kMagic) return fd;
    if (err == 0) os::close_fd(fd);  // a member of another version, or garbage: try the next
  }
  return -1;
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

Mapped create_region(const std::string& name, const NodePoolOptions& o) {
  const size_t granule = o.granule;
  if (granule < 4096 || granule > (size_t{1} << 30) || (granule & (granule - 1)))
    throw InvalidArgument("node pool '" + name + "': granule " + std::to_string(granule) +
                          " must be a power of two from 4 KiB to 1 GiB");
  if (o.capacity == 0)
    throw InvalidArgument("node pool '" + name +
                          "': no live process serves it, and capacity is 0: the process that creates "
                          "a node pool gives its capacity (the node-wide budget, in bytes)");
  const uint64_t capacity = (o.capacity + granule - 1) / granule * granule;
  if (capacity / granule >= (uint64_t{1} << 32))
    throw InvalidArgument("node pool '" + name + "': capacity " + format_bytes(o.capacity) +
                          " is over 2^32 granules of " + format_bytes(granule) + "; use a larger granule");
  const Region::Layout l = Region::layout(capacity, granule);
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
  Region(m.map).init(capacity, granule, getpid(), hugetlb ? os::kHugePage2MBytes : os::kSmallPageBytes);
  return m;
}

Mapped attach_region(int fd, const Hello& hello, const std::string& name) {
  uint64_t size = 0;
  if (os::regular_file_size(fd, &size) != 0 || size != hello.file_bytes ||
      hello.version != kVersion) {
    os::close_fd(fd);
    throw NotSupported("node pool '" + name + "': a member sent a region of version " +
                       std::to_string(hello.version) + " (this ferry speaks " + std::to_string(kVersion) +
                       "): every process of a node must run the same ferry");
  }
  return map_region(fd, hello.file_bytes, name);
}

}  // namespace

std::shared_ptr<NodePool> NodePool::open(const std::string& name, const NodePoolOptions& options) {
  check_name(name);
  std::lock_guard<std::mutex> opening(open_mu);
  if (auto existing = registered(name)) {
    if (options.capacity && (options.capacity + existing->granule() - 1) / existing->granule() *
                                    existing->granule() != existing->capacity())
      throw InvalidArgument("node pool '" + name + "' is open in this process with capacity " +
                            format_bytes(existing->capacity()) + ", not " + format_bytes(options.capacity));
    return existing;
  }
  const auto deadline = Clock::now() + std::chrono::duration<double>(options.attach_timeout_s);
  Mapped m;
  bool created = false;
  for (;;) {
    Hello hello{};
    if (int fd = ask_members(name, &hello); fd >= 0) {
      m = attach_region(fd, hello, name);
      break;
    }
    int election = -1;  // the one process allowed to create: whoever binds this name
    const int err = os::listen_abstract(socket_name(name, "create"), &election);
    if (err == 0) {
      if (int fd = ask_members(name, &hello); fd >= 0) {  // a creator finished between our two looks
        os::close_fd(election);
        m = attach_region(fd, hello, name);
        break;
      }
      try {
        m = create_region(name, options);
      } catch (...) {
        os::close_fd(election);
        throw;
      }
      created = true;
      // Keep the election name until this member serves (below), so nobody creates a second pool.
      std::shared_ptr<NodePool> pool(new NodePool(name, m.fd, m.map, m.bytes, true, options.label));
      os::close_fd(election);
      register_pool(name, pool);
      return pool;
    }
    if (err != EADDRINUSE) throw OsError("bind of the node pool's socket '" + socket_name(name, "create") + "'", err);
    if (Clock::now() > deadline)
      throw OsError("node pool '" + name + "': another process has been creating it for " +
                        std::to_string(options.attach_timeout_s) + " s and no member answers (is it stuck?); open",
                    ETIMEDOUT);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::shared_ptr<NodePool> pool(new NodePool(name, m.fd, m.map, m.bytes, created, options.label));
  if (options.capacity && (options.capacity + pool->granule() - 1) / pool->granule() * pool->granule() !=
                              pool->capacity())
    throw InvalidArgument("node pool '" + name + "' exists with capacity " + format_bytes(pool->capacity()) +
                          ", not the " + format_bytes(options.capacity) + " asked; pass capacity=0 to attach to "
                          "whatever it is");
  register_pool(name, pool);
  return pool;
}

NodePool::NodePool(std::string name, int fd, void* map, size_t map_bytes, bool created, const std::string& label)
    : name_(std::move(name)), fd_(fd), map_(map), map_bytes_(map_bytes), created_(created), region_(map),
      data_(region_.data()), capacity_(region_.header().capacity), granule_(region_.header().granule),
      generation_(fork_generation()) {
  lock();
  reclaim_dead_locked();
  slot_ = region_.claim_member(getpid(), "");
  int err = slot_ < kMaxMembers ? os::lock_byte(fd_, slot_) : 0;
  if (slot_ < kMaxMembers && err == 0) {
    if (label.empty())
      std::snprintf(region_.member(slot_).label, kLabelBytes, "pid %d", getpid());
    else
      std::strncpy(region_.member(slot_).label, label.c_str(), kLabelBytes - 1);
  } else if (slot_ < kMaxMembers) {
    std::memset(&region_.member(slot_), 0, sizeof(Member));
  }
  region_.unlock();
  if (slot_ >= kMaxMembers || err != 0) {
    os::forget_hidden(map_);
    os::unmap(map_, map_bytes_);
    os::close_fd(fd_);
    if (err) throw OsError("fcntl(F_SETLK) of node pool '" + name_ + "' member slot", err);
    throw OutOfMemory("node pool '" + name_ + "' has " + std::to_string(kMaxMembers) + " live members already");
  }
  // Serve attachers; a name still held by a leaving process means this member does not serve (others do).
  if (os::listen_abstract(socket_name(name_, std::to_string(slot_)), &listen_fd_) == 0) {
    server_ = std::thread([this] { serve(); });
    pthread_setname_np(server_.native_handle(), "ferry-node");  // named before open returns: ps, /proc/*/task/*/comm
  }
}

NodePool::~NodePool() {
  if (generation_ != fork_generation()) return;  // a forked child: the parent's member, not ours
  if (listen_fd_ >= 0) {
    os::shutdown_socket(listen_fd_);
    if (server_.joinable()) server_.join();
    os::close_fd(listen_fd_);
  }
  lock();
  region_.release_member(slot_);
  os::unlock_byte(fd_, slot_);
  region_.unlock();
  os::forget_hidden(map_);
  os::unmap(map_, map_bytes_);
  os::close_fd(fd_);
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
    if (os::accept_connection(listen_fd_, &conn) != 0) return;  // shut down
    uid_t uid = 0;
    if (os::peer_uid(conn, &uid) == 0 && uid == geteuid()) os::send_with_fd(conn, &hello, sizeof hello, fd_);
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
  const uint64_t g = granule(), count = (bytes + g - 1) / g;
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
  const uint64_t g = granule(), count = (bytes + g - 1) / g;
  lock();
  const uint32_t found = region_.find_named(key);
  if (found < kMaxNamed) {
    const Named& n = region_.named(found);
    if (n.count != count) {
      const uint64_t have = n.count * g;
      region_.unlock();
      throw InvalidArgument("node pool '" + name_ + "': named block '" + printable(key) + "' exists with " +
                            format_bytes(have) + ", not " + format_bytes(count * g));
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
  if (offset % 4 != 0 || offset + 4 > capacity())
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
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s < 0 ? 1e9 : timeout_s);
  for (;;) {
    const uint32_t v = std::atomic_ref<uint32_t>(*w).load(std::memory_order_acquire);
    if (static_cast<int32_t>(v - value) >= 0) return true;  // wrap-safe: counters only grow
    const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    // A slice at most: a waker of an older ferry, or a lost wake, costs 100 ms, never a hang.
    os::futex_wait_shared(w, v, std::min<int64_t>(left, 100000000));
  }
}

}  // namespace ferry::node
