// node_pool_test.cpp — a node pool shared by real processes: attach, budget,
// named blocks, signal words, a member killed with SIGKILL (also while it
// holds the region's lock), a pool outliving its creator, fork.
//
// Other members: MemberProcess (node_member.h), running the loop below. The
// cases of issue 38 (other users, split brain, stopped members, limits) are in
// node_pool_hardening_test.cpp.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../common/child.h"
#include "node_member.h"
#include "core/error.h"
#include "node/node_pool.h"
#include "os/dont_fork.h"
#include "os/memory.h"
#include "os/sysfs.h"

namespace ferry::node {
namespace {

// Every node pool of this test binary meets in a directory of its own
// (FERRY_NODE_DIR, inherited by the members it execs; under temp_root()),
// removed at exit: the tests leave no file behind. Set before main, so before options() is read.
class TestNodeDir {
 public:
  TestNodeDir() {
    if (std::getenv("FERRY_NODE_DIR")) return;  // a member exec'd by a test, or the caller's choice
    std::string path = temp_root() + "/ferry-test-node-XXXXXX";
    if (!::mkdtemp(path.data())) return;
    path_ = path;
    owner_ = ::getpid();
    ::setenv("FERRY_NODE_DIR", path.c_str(), 1);
  }
  ~TestNodeDir() {
    std::error_code ignored;
    if (owner_ == ::getpid()) std::filesystem::remove_all(path_, ignored);  // not in a forked child
  }

 private:
  std::string path_;
  pid_t owner_ = 0;
};
const TestNodeDir g_test_node_dir;

}  // namespace

// The member loop: one command per stdin line. Runs only when exec'd by Member.
TEST(NodePoolMember, DISABLED_Serve) {
  if (!std::getenv("FERRYTEST_NODE_MEMBER")) GTEST_SKIP() << "run by Member only";
  std::shared_ptr<NodePool> pool;
  std::string line;
  auto say = [](const std::string& s) { std::cout << "@@ " << s << std::endl; };
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    try {
      if (cmd == "open") {
        std::string name, label;
        size_t cap;
        in >> name >> cap >> label;
        NodePoolOptions o;
        o.capacity = cap;
        o.label = label;
        pool = NodePool::open(name, o);
        say(std::to_string(pool->stats().created) + " " + std::to_string(getpid()));
      } else if (cmd == "open-few-fds") {  // open with only k descriptors left to take (RLIMIT_NOFILE)
        std::string name, label;
        size_t cap;
        int k;
        in >> name >> cap >> label >> k;
        int highest = 0;
        for (int fd = 0; fd < 4096; ++fd)
          if (::fcntl(fd, F_GETFD) != -1) highest = fd;
        for (int fd = 0; fd < highest; ++fd)  // fill the holes: new descriptors come after `highest`
          if (::fcntl(fd, F_GETFD) == -1) ::open("/dev/null", O_RDONLY);
        rlimit r{};
        ::getrlimit(RLIMIT_NOFILE, &r);
        r.rlim_cur = static_cast<rlim_t>(highest + 1 + k);
        ::setrlimit(RLIMIT_NOFILE, &r);
        NodePoolOptions o;
        o.capacity = cap;
        o.label = label;
        pool = NodePool::open(name, o);
        say(std::to_string(pool->stats().created) + " " + std::to_string(getpid()));
      } else if (cmd == "open-t") {  // open with a timeout
        std::string name, label;
        size_t cap;
        double t;
        in >> name >> cap >> label >> t;
        NodePoolOptions o;
        o.capacity = cap;
        o.label = label;
        o.attach_timeout_s = t;
        pool = NodePool::open(name, o);
        say(std::to_string(pool->stats().created) + " " + std::to_string(getpid()));
      } else if (cmd == "lock-in-thread") {  // another thread holds the region's lock for ms
        int ms;
        in >> ms;
        std::atomic<bool> locked{false};
        std::thread([base = pool->region_base(), ms, &locked] {
          Region r(base);
          r.lock();
          locked = true;
          std::this_thread::sleep_for(std::chrono::milliseconds(ms));
          r.unlock();
        }).detach();
        while (!locked) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        say("locked");
      } else if (cmd == "lock-then-die") {  // holds the region's lock for ms, then dies holding it
        int ms;
        in >> ms;
        Region r(pool->region_base());
        r.lock();
        say("locked");
        std::this_thread::sleep_for(std::chrono::milliseconds(ms));
        ::_exit(0);
      } else if (cmd == "alloc") {
        size_t bytes;
        uint64_t seed;
        in >> bytes >> seed;
        const NodeBlock b = pool->allocate(bytes);
        fill(pool->data() + b.offset, bytes, seed);
        say(std::to_string(b.offset));
      } else if (cmd == "named") {
        std::string key;
        size_t bytes;
        in >> key >> bytes;
        bool created = false;
        const NodeBlock b = pool->allocate_named(key, bytes, &created);
        say(std::to_string(b.offset) + " " + std::to_string(created));
      } else if (cmd == "check") {
        uint64_t off, seed;
        size_t bytes;
        in >> off >> bytes >> seed;
        say(holds(pool->data() + off, bytes, seed) ? "ok" : "bad");
      } else if (cmd == "write") {
        uint64_t off, seed;
        size_t bytes;
        in >> off >> bytes >> seed;
        fill(pool->data() + off, bytes, seed);
        say("ok");
      } else if (cmd == "release" || cmd == "take") {
        uint64_t off;
        in >> off;
        cmd == "release" ? pool->release(off) : pool->take(off);
        say("ok");
      } else if (cmd == "add") {
        uint64_t off;
        uint32_t n;
        in >> off >> n;
        say(std::to_string(pool->add(off, n)));
      } else if (cmd == "wait") {
        uint64_t off;
        uint32_t v;
        double t;
        in >> off >> v >> t;
        say(pool->wait_at_least(off, v, t) ? "ok" : "timeout");
      } else if (cmd == "used") {
        say(std::to_string(pool->stats().used));
      } else if (cmd == "die-holding-lock") {  // lock, half-allocate 3 granules at the end, die
        Region r(pool->region_base());
        r.lock();
        const Header& h = r.header();
        uint16_t* owner = reinterpret_cast<uint16_t*>(static_cast<char*>(pool->region_base()) + h.owner_offset);
        for (uint64_t g = h.granules - 3; g < h.granules; ++g) owner[g] = static_cast<uint16_t>(pool->slot() + 1);
        say("dying");
        ::_exit(0);
      } else if (cmd == "close") {
        pool.reset();
        say("ok");
      } else if (cmd == "exit") {
        say("bye");
        std::fflush(nullptr);
        ::_exit(0);
      } else {
        say("unknown " + cmd);
      }
    } catch (const Error& e) {
      say(std::string("error ") + e.what());
    }
  }
  ::_exit(0);
}

TEST(NodePool, AnotherProcessAttachesAndSharesTheBytes) {
  const std::string name = unique_name("share");
  NodePoolOptions o;
  o.capacity = size_t{64} << 20;
  o.label = "parent";
  auto pool = NodePool::open(name, o);
  EXPECT_TRUE(pool->stats().created);
  const NodeBlock mine = pool->allocate(3 * 65536 + 17);
  EXPECT_EQ(mine.bytes, 4u * 65536);
  fill(pool->data() + mine.offset, 3 * 65536 + 17, 7);

  MemberProcess m;
  const std::string opened = m.ask("open " + name + " 0 child");
  ASSERT_EQ(opened.substr(0, 2), "0 ") << opened;  // attached, not created
  EXPECT_EQ(m.ask("check " + std::to_string(mine.offset) + " " + std::to_string(3 * 65536 + 17) + " 7"), "ok");
  const uint64_t theirs = number(m.ask("alloc 1000003 11"));
  EXPECT_NE(theirs, mine.offset);
  EXPECT_TRUE(holds(pool->data() + theirs, 1000003, 11));  // written there, read here
  EXPECT_EQ(pool->find(theirs).bytes, (1000003 + 65535) / 65536 * 65536);
  const NodePoolStats s = pool->stats();
  EXPECT_EQ(s.members.size(), 2u);
  EXPECT_EQ(s.used, mine.bytes + pool->find(theirs).bytes);
  MemberProcess closer;
  closer.ask("open " + name + " 0 closer");
  number(closer.ask("alloc 70000 12"));
  EXPECT_EQ(closer.ask("close"), "ok");  // a member that closes frees what it owns at once
  EXPECT_EQ(pool->stats().used, mine.bytes + pool->find(theirs).bytes);
  EXPECT_EQ(m.finish(), 0);  // exits without closing (like a process at exit): noticed as dead
  // The member is gone: its unnamed blocks went with it, ours stayed.
  EXPECT_EQ(pool->stats().used, mine.bytes);
  EXPECT_EQ(pool->stats().members.size(), 1u);
  EXPECT_TRUE(holds(pool->data() + mine.offset, 3 * 65536 + 17, 7));
  EXPECT_THROW(pool->find(theirs), InvalidArgument);
}

// Free 2 MiB hugetlb pages that no mapping has reserved.
uint64_t unreserved_hugetlb_pages() {
  uint64_t n = 0;
  EXPECT_EQ(os::read_unreserved_hugepages(os::kHugePage2MBytes, &n), 0);
  return n;
}

// The data's pages: 4 KiB shmem unless hugetlb pages are asked for and free.
// With hugetlb pages free (root: echo N > /proc/sys/vm/nr_hugepages), auto
// takes them, another process attaches and shares the bytes, and the pages
// come back when the pool goes.
TEST(NodePool, HugetlbPagesWhenFreeElseShmemOrAClearRefusal) {
  NodePoolOptions o;
  o.capacity = size_t{8} << 20;
  o.huge_pages = HugePolicy::off;
  EXPECT_EQ(NodePool::open(unique_name("pages-off"), o)->stats().page_bytes, 4096u);
  uint64_t free_pages = 0;
  const bool have_pool = os::read_unreserved_hugepages(os::kHugePage2MBytes, &free_pages) == 0;
  // file = header and arrays (2 MiB) + 8 MiB of data: 5 pages
  if (!have_pool || free_pages < 5) {
    o.huge_pages = HugePolicy::hugetlb;
    try {
      NodePool::open(unique_name("pages-hugetlb"), o);
      ADD_FAILURE() << "huge_pages=hugetlb with " << free_pages << " free hugetlb pages opened a pool";
    } catch (const NotSupported& e) {
      EXPECT_NE(std::string(e.what()).find("nr_hugepages"), std::string::npos) << e.what();
    }
    o.huge_pages = HugePolicy::automatic;
    EXPECT_EQ(NodePool::open(unique_name("pages-auto"), o)->stats().page_bytes, 4096u);
    GTEST_SKIP() << "only " << free_pages
                 << " free unreserved 2 MiB hugetlb pages (5 needed): the hugetlb pool is not tried";
  }
  const std::string name = unique_name("pages-auto");
  o.huge_pages = HugePolicy::automatic;
  const uint64_t unreserved = unreserved_hugetlb_pages();
  auto pool = NodePool::open(name, o);
  ASSERT_EQ(pool->stats().page_bytes, os::kHugePage2MBytes);
  EXPECT_LE(unreserved_hugetlb_pages() + 5, unreserved);  // reserved at mmap for the whole file (no SIGBUS later)
  const NodeBlock b = pool->allocate((size_t{5} << 20) + 3);
  fill(pool->data() + b.offset, (size_t{5} << 20) + 3, 21);
  EXPECT_EQ(os::populate_write(pool->data() + b.offset, size_t{6} << 20), 0);  // what registration does first
  EXPECT_TRUE(holds(pool->data() + b.offset, (size_t{5} << 20) + 3, 21));
  MemberProcess m;
  const std::string opened = m.ask("open " + name + " 0 child");
  ASSERT_EQ(opened.substr(0, 2), "0 ") << opened;
  EXPECT_EQ(m.ask("check " + std::to_string(b.offset) + " " + std::to_string((size_t{5} << 20) + 3) + " 21"), "ok");
  const uint64_t theirs = number(m.ask("alloc 1000003 22"));
  EXPECT_TRUE(holds(pool->data() + theirs, 1000003, 22));
  EXPECT_EQ(m.finish(), 0);
  pool.reset();
  EXPECT_EQ(unreserved_hugetlb_pages(), unreserved);  // the last member gone, every page back
}

TEST(NodePool, TheBudgetCountsEveryProcessAndTheErrorNamesWhoHoldsWhat) {
  const std::string name = unique_name("budget");
  NodePoolOptions o;
  o.capacity = size_t{8} << 20;
  auto pool = NodePool::open(name, o);
  MemberProcess m;
  m.ask("open " + name + " 0 rank-seven");
  const std::string got = m.ask("alloc " + std::to_string(size_t{6} << 20) + " 3");
  ASSERT_NE(got.rfind("error", 0), 0u) << got;
  pool->allocate(size_t{1} << 20);
  try {
    pool->allocate(size_t{2} << 20);
    FAIL() << "the node-wide budget was not enforced";
  } catch (const OutOfMemory& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("rank-seven"), std::string::npos) << w;
    EXPECT_NE(w.find("pid " + std::to_string(m.pid())), std::string::npos) << w;
    EXPECT_NE(w.find("6 MiB"), std::string::npos) << w;
    EXPECT_NE(w.find("1 MiB free of 8 MiB"), std::string::npos) << w;
  }
  EXPECT_EQ(pool->stats().used, size_t{7} << 20);  // the refusal changed nothing
  // The member may still use what is left.
  EXPECT_EQ(m.ask("alloc 1048576 5").rfind("error", 0), std::string::npos);
  EXPECT_EQ(m.ask("alloc 1").rfind("error", 0), 0u);
}

TEST(NodePool, AMemberKilledWithSigkillLosesOnlyItsOwnBlocks) {
  const std::string name = unique_name("kill");
  NodePoolOptions o;
  o.capacity = size_t{16} << 20;
  auto pool = NodePool::open(name, o);
  const NodeBlock mine = pool->allocate(size_t{4} << 20);
  fill(pool->data() + mine.offset, mine.bytes, 21);
  MemberProcess a, b;
  a.ask("open " + name + " 0 a");
  b.ask("open " + name + " 0 b");
  const uint64_t a_block = number(a.ask("alloc 8388608 1"));
  const uint64_t b_block = number(b.ask("alloc 2097152 2"));
  // b takes over one of a's blocks, as a consumer keeps what a producer made.
  const uint64_t handed = number(a.ask("alloc 65536 3"));
  EXPECT_EQ(b.ask("take " + std::to_string(handed)), "ok");
  a.kill9();
  // Full until the dead member is noticed: the next allocation reclaims it.
  const NodeBlock after = pool->allocate(size_t{8} << 20);
  EXPECT_TRUE(holds(pool->data() + mine.offset, mine.bytes, 21));
  EXPECT_EQ(b.ask("check " + std::to_string(b_block) + " 2097152 2"), "ok");
  EXPECT_EQ(b.ask("check " + std::to_string(handed) + " 65536 3"), "ok");
  EXPECT_EQ(pool->find(handed).bytes, 65536u);
  EXPECT_EQ(pool->stats().members.size(), 2u);
  (void)a_block;
  (void)after;
}

TEST(NodePool, AMemberThatDiesHoldingTheLockIsRepairedAfter) {
  const std::string name = unique_name("lockdeath");
  NodePoolOptions o;
  o.capacity = size_t{4} << 20;
  auto pool = NodePool::open(name, o);
  const NodeBlock mine = pool->allocate(65536);
  MemberProcess m;
  m.ask("open " + name + " 0 doomed");
  EXPECT_EQ(m.ask("die-holding-lock"), "dying");
  ::waitpid(m.pid(), nullptr, 0);
  // The next step finds the lock's owner dead, repairs, and goes on.
  const NodeBlock next = pool->allocate(65536 * 60);  // needs the 3 granules the dead one half-took
  const NodePoolStats s = pool->stats();
  EXPECT_EQ(s.repairs, 1u);
  EXPECT_EQ(s.used, mine.bytes + next.bytes);
  EXPECT_EQ(s.members.size(), 1u);
}

TEST(NodePool, ThePoolOutlivesItsCreatorAndALateProcessAttaches) {
  const std::string name = unique_name("outlive");
  MemberProcess creator, late;
  ASSERT_EQ(creator.ask("open " + name + " 33554432 creator").substr(0, 2), "1 ");
  const std::string named = creator.ask("named weights 3000000");
  const uint64_t off = number(named);
  EXPECT_EQ(creator.ask("write " + std::to_string(off) + " 3000000 44"), "ok");
  auto pool = NodePool::open(name, NodePoolOptions{});  // attach: capacity 0
  EXPECT_FALSE(pool->stats().created);
  bool created = true;
  EXPECT_EQ(pool->allocate_named("weights", 3000000, &created).offset, off);
  EXPECT_FALSE(created);
  EXPECT_EQ(creator.finish(), 0);  // the creator is gone; we still hold the named block
  ASSERT_EQ(late.ask("open " + name + " 0 late").substr(0, 2), "0 ");  // served by us
  EXPECT_EQ(late.ask("named weights 3000000"), std::to_string(off) + " 0");
  EXPECT_EQ(late.ask("check " + std::to_string(off) + " 3000000 44"), "ok");
  EXPECT_EQ(late.ask("named weights 4000000").rfind("error", 0), 0u);  // sizes must agree
  MemberProcess stranger;
  stranger.ask("open " + name + " 0 stranger");
  EXPECT_EQ(stranger.ask("release " + std::to_string(off)).rfind("error", 0), 0u);  // it never asked for it
  pool->release(off);
  EXPECT_EQ(late.ask("check " + std::to_string(off) + " 3000000 44"), "ok");  // late still holds it
  EXPECT_EQ(late.ask("release " + std::to_string(off)), "ok");
  EXPECT_EQ(pool->stats().used, 0u);  // the last holder let go
}

TEST(NodePool, TheLastMemberGoneTheNextOpenCreatesAFreshPool) {
  const std::string name = unique_name("fresh");
  NodePoolOptions o;
  o.capacity = size_t{2} << 20;
  auto pool = NodePool::open(name, o);
  const NodeBlock b = pool->allocate(100);
  fill(pool->data() + b.offset, 100, 9);
  EXPECT_EQ(NodePool::open(name, o).get(), pool.get());  // one object per name per process
  pool.reset();
  MemberProcess m;
  EXPECT_EQ(m.ask("open " + name + " 0 x").rfind("error", 0), 0u);  // nobody serves it, no capacity
  auto again = NodePool::open(name, o);
  EXPECT_TRUE(again->stats().created);
  EXPECT_EQ(again->stats().used, 0u);
  const char zero[100] = {};
  EXPECT_EQ(std::memcmp(again->data(), zero, 100), 0);
}

TEST(NodePool, ProcessesOpeningAtOnceMakeOnePool) {
  const std::string name = unique_name("race");
  std::vector<std::unique_ptr<MemberProcess>> ms;
  for (int i = 0; i < 6; ++i) ms.push_back(std::make_unique<MemberProcess>());
  std::vector<std::thread> ts;
  std::vector<std::string> opened(ms.size());
  for (size_t i = 0; i < ms.size(); ++i)
    ts.emplace_back([&, i] { opened[i] = ms[i]->ask("open " + name + " 8388608 m" + std::to_string(i)); });
  for (auto& t : ts) t.join();
  int creators = 0;
  for (auto& s : opened) creators += s.substr(0, 2) == "1 ";
  EXPECT_EQ(creators, 1);
  std::vector<uint64_t> offs;
  for (auto& m : ms) offs.push_back(number(m->ask("named counter 4096")));
  for (size_t i = 1; i < offs.size(); ++i) EXPECT_EQ(offs[i], offs[0]);
  for (auto& m : ms) m->ask("add " + std::to_string(offs[0]) + " 1");
  EXPECT_EQ(ms[0]->ask("wait " + std::to_string(offs[0]) + " 6 5"), "ok");
}

TEST(NodePool, SignalWordsWakeAWaiterInAnotherProcess) {
  const std::string name = unique_name("words");
  NodePoolOptions o;
  o.capacity = size_t{1} << 20;
  auto pool = NodePool::open(name, o);
  const NodeBlock flags = pool->allocate(4096);
  MemberProcess m;
  m.ask("open " + name + " 0 waiter");
  EXPECT_EQ(m.ask("wait " + std::to_string(flags.offset + 8) + " 1 0.05"), "timeout");
  std::thread bump([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    pool->add(flags.offset + 8, 2);
  });
  EXPECT_EQ(m.ask("wait " + std::to_string(flags.offset + 8) + " 2 10"), "ok");
  bump.join();
  EXPECT_EQ(pool->load(flags.offset + 8), 2u);
  EXPECT_THROW(pool->add(flags.offset + 2, 1), InvalidArgument);  // not aligned
  EXPECT_THROW(pool->load(pool->capacity()), InvalidArgument);     // outside
}

TEST(NodePool, BadInputIsRefusedAndChangesNothing) {
  NodePoolOptions o;
  for (const char* bad : {"", "has space", "slash/no", "\xff"}) EXPECT_THROW(NodePool::open(bad, o), InvalidArgument);
  EXPECT_THROW(NodePool::open(std::string(65, 'a'), o), InvalidArgument);
  o.capacity = 0;
  EXPECT_THROW(NodePool::open(unique_name("nocap"), o), InvalidArgument);
  o.capacity = 1 << 20;
  o.granule = 3000;
  EXPECT_THROW(NodePool::open(unique_name("granule"), o), InvalidArgument);
  o.granule = 65536;
  auto pool = NodePool::open(unique_name("bad"), o);
  const NodeBlock b = pool->allocate(5);
  EXPECT_THROW(pool->allocate(0), InvalidArgument);
  EXPECT_THROW(pool->allocate(size_t{2} << 20), OutOfMemory);
  EXPECT_THROW(pool->find(b.offset + 4096), InvalidArgument);
  EXPECT_THROW(pool->release(b.offset + 65536), InvalidArgument);
  EXPECT_THROW(pool->allocate_named("", 10), InvalidArgument);
  EXPECT_THROW(pool->allocate_named(std::string(100, 'k'), 10), InvalidArgument);
  EXPECT_THROW(pool->take(pool->allocate_named("n", 10).offset), InvalidArgument);
  // A named block's first page reads as zero even over recycled memory.
  std::vector<NodeBlock> dirty;  // every free granule written 0xff, then freed
  for (;;) {
    try {
      dirty.push_back(pool->allocate(65536));
    } catch (const OutOfMemory&) {
      break;
    }
    std::memset(pool->data() + dirty.back().offset, 0xff, 65536);
  }
  for (const NodeBlock& d : dirty) pool->release(d.offset);
  const NodeBlock fresh = pool->allocate_named("fresh", 8192);
  for (size_t i = 0; i < kZeroedHeadBytes; ++i) ASSERT_EQ(pool->data()[fresh.offset + i], 0) << i;
  pool->release(fresh.offset);
  pool->release(b.offset);
  EXPECT_THROW(pool->release(b.offset), InvalidArgument);  // twice
  EXPECT_EQ(pool->stats().used, 65536u);                   // the named block only
  NodePoolOptions other = o;
  other.capacity = 2 << 20;
  EXPECT_THROW(NodePool::open(pool->name(), other), InvalidArgument);  // capacities must agree
}

TEST(NodePool, ThreadsShareOneMemberWithoutOverlap) {
  NodePoolOptions o;
  o.capacity = size_t{32} << 20;
  o.granule = 4096;
  auto pool = NodePool::open(unique_name("threads"), o);
  std::atomic<int> bad{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      std::mt19937_64 r(t);
      std::vector<NodeBlock> live;
      for (int i = 0; i < 400; ++i) {
        if (!live.empty() && r() % 2) {
          const size_t k = r() % live.size();
          const NodeBlock b = live[k];
          if (!holds(pool->data() + b.offset, b.bytes, b.offset ^ t)) bad++;
          pool->release(b.offset);
          live.erase(live.begin() + static_cast<long>(k));
        } else {
          try {
            const NodeBlock b = pool->allocate(1 + r() % (300 << 10));
            fill(pool->data() + b.offset, b.bytes, b.offset ^ t);
            live.push_back(b);
          } catch (const OutOfMemory&) {
          }
        }
      }
      for (const NodeBlock& b : live) {
        if (!holds(pool->data() + b.offset, b.bytes, b.offset ^ t)) bad++;
        pool->release(b.offset);
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(pool->stats().used, 0u);
  EXPECT_EQ(pool->stats().largest_free, pool->capacity());
}

TEST(NodePool, AForkedChildOfAMemberFindsATombstoneAndARefusal) {
  NodePoolOptions o;
  o.capacity = size_t{2} << 20;
  auto pool = NodePool::open(unique_name("fork"), o);
  const NodeBlock b = pool->allocate(4096);
  const ferrytest::ChildEnd end = ferrytest::run_in_child([&](const auto& say) {
    if (!os::in_tombstone(pool->data() + b.offset)) {
      say("the node pool's mapping was inherited by the child");
      return 1;
    }
    try {
      pool->allocate(10);
      say("allocate in a forked child did not raise");
      return 2;
    } catch (const NotSupported&) {
    }
    return 0;
  });
  EXPECT_TRUE(end.clean()) << end.describe();
  EXPECT_EQ(pool->stats().used, 65536u);
}

TEST(NodePool, AForkedChildKeepsNeitherTheSocketNorTheMemfd) {
  FERRYTEST_SKIP_IF_TSAN_CHILD_THREADS();  // the child below starts no thread, but forks a threaded parent
  const std::string name = unique_name("childfds");
  NodePoolOptions o;
  o.capacity = size_t{1} << 20;
  auto pool = NodePool::open(name, o);
  int report[2], hold[2];
  ASSERT_EQ(::pipe2(report, O_CLOEXEC), 0);  // close-on-exec: the member exec'd below must not hold them
  ASSERT_EQ(::pipe2(hold, O_CLOEXEC), 0);
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child == 0) {  // look at our descriptors, say what we found, then live until told
    ::close(report[0]);
    ::close(hold[1]);
    char found = '0';
    char link[512];
    for (int fd = 0; fd < 1024; ++fd) {
      const std::string path = "/proc/self/fd/" + std::to_string(fd);
      const ssize_t n = ::readlink(path.c_str(), link, sizeof link - 1);
      if (n <= 0) continue;
      link[n] = '\0';
      if (std::strstr(link, ("memfd:ferry-node:" + name).c_str())) found = '1';
    }
    (void)!::write(report[1], &found, 1);
    char c;
    (void)!::read(hold[0], &c, 1);
    ::_exit(0);
  }
  ::close(report[1]);
  ::close(hold[0]);
  char found = '?';
  ASSERT_EQ(::read(report[0], &found, 1), 1);
  EXPECT_EQ(found, '0') << "the forked child kept the pool's memfd";
  pool.reset();  // the only member leaves while the child lives
  MemberProcess m;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string opened = m.ask("open " + name + " 1048576 late");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(opened.substr(0, 2), "1 ") << opened;  // a fresh pool: nobody serves the old one
  EXPECT_LT(s, 1.5) << "the new member waited on a socket the child inherited and nobody serves";
  ::close(hold[1]);
  ::waitpid(child, nullptr, 0);
  ::close(report[0]);
}

}  // namespace ferry::node
