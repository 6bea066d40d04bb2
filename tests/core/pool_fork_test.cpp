// pool_fork_test.cpp — a pinned pool's memory is invisible to fork()
// (os/dont_fork.h, pool/arena.h): every chunk a pool with hooks maps is
// either left out of children (VmFlags "dc") or shared with them ("sh"), for
// every pool kind and option; a child of a process holding pinned chunks gets
// no copy of them (pinned for real, through io_uring, on a machine without a
// GPU), finds a tombstone there and is told why when it touches one; a child
// makes and uses pinned pools of its own, and its children see tombstones of
// both generations.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../common/child.h"
#include "../common/io_uring_pin.h"
#include "../support/pool_fixture.h"
#include "os/dont_fork.h"
#include "os/memory.h"
#include "os/smaps.h"
#include "os/sysfs.h"
#include "pool/pool.h"

namespace ferry {
namespace {

using test_support::MiB;
using Say = std::function<void(const std::string&)>;

// Hooks that pin nothing: what makes a pool "pinned" to the arena is having
// hooks; the flags do not depend on who pins.
class NoPinHooks : public ChunkHooks {
 public:
  void on_chunk_ready(void*, size_t) override {}
  void on_chunk_release(void*, size_t) noexcept override {}
};

os::SmapsTotals smaps_of(uintptr_t begin, size_t bytes) {
  std::string text;
  EXPECT_EQ(os::read_smaps(&text), 0);
  return os::parse_smaps(text, begin, begin + bytes);
}

// Fills with a pattern that differs per word and per seed.
void fill(void* p, size_t bytes, uint64_t seed) {
  auto* w = static_cast<uint64_t*>(p);
  for (size_t i = 0; i < bytes / 8; ++i) w[i] = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
}

bool holds(const void* p, size_t bytes, uint64_t seed) {
  const auto* w = static_cast<const uint64_t*>(p);
  for (size_t i = 0; i < bytes / 8; ++i)
    if (w[i] != ((i + 1) * 0x9E3779B97F4A7C15ull ^ seed)) return false;
  return true;
}

// Private_Dirty of the whole process (smaps_rollup), in bytes; 0 if unreadable.
uint64_t private_dirty_bytes() {
  std::ifstream in("/proc/self/smaps_rollup");
  std::string key;
  uint64_t kb = 0;
  while (in >> key) {
    if (key == "Private_Dirty:") {
      in >> kb;
      return kb << 10;
    }
    in.ignore(1 << 12, '\n');
  }
  return 0;
}

// Forks a child that reports its Private_Dirty right after fork() and exits.
uint64_t child_private_dirty() {
  int fds[2];
  if (::pipe(fds) != 0) return 0;
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const uint64_t v = private_dirty_bytes();
    (void)!::write(fds[1], &v, sizeof v);
    ::_exit(0);
  }
  ::close(fds[1]);
  uint64_t v = 0;
  if (::read(fds[0], &v, sizeof v) != static_cast<ssize_t>(sizeof v)) v = 0;
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return v;
}

struct Kind {
  const char* name;
  HugePolicy policy;
  bool memfd;
  HugeWant want;
  size_t target_bytes;
};

TEST(PoolFork, EveryChunkOfAPinnedPoolIsLeftOutOfChildrenOrShared) {
  std::vector<Kind> kinds;
  for (bool memfd : {false, true})
    for (HugePolicy policy : {HugePolicy::off, HugePolicy::thp, HugePolicy::automatic})
      for (HugeWant want : {HugeWant::yes, HugeWant::no})
        for (size_t target : {size_t{0}, 6 * MiB})
          kinds.push_back({memfd ? "memfd" : "anonymous", policy, memfd, want, target});
  uint64_t free_pages = 0;
  if (os::read_free_hugepages(2 * MiB, &free_pages) == 0 && free_pages >= 8)
    for (bool memfd : {false, true}) kinds.push_back({"hugetlb", HugePolicy::hugetlb, memfd, HugeWant::yes, 0});

  const size_t hidden_before = os::hidden_range_count();
  for (const Kind& k : kinds) {
    SCOPED_TRACE(std::string(k.name) + " policy " + std::to_string(static_cast<int>(k.policy)) + " want " +
                 std::to_string(static_cast<int>(k.want)) + " target " + std::to_string(k.target_bytes));
    PoolOptions o = test_support::small_chunks(4 * MiB);
    o.huge_pages = k.policy;
    o.memfd = k.memfd;
    o.target_bytes = k.target_bytes;
    Pool pool(o, std::make_shared<NoPinHooks>());
    void* small = pool.allocate(1000, 256, k.want);
    void* big = pool.allocate(5 * MiB + 12345, 4096, k.want);  // a chunk of its own, or the target
    pool.wait_ready();  // the target chunk is in chunks() once ready (hidden from its mapping on)
    const auto chunks = pool.chunks();
    ASSERT_FALSE(chunks.empty());
    for (const Pool::ChunkView& c : chunks) {
      const os::SmapsTotals t = smaps_of(c.base, c.bytes);
      ASSERT_GT(t.mappings, 0u);
      EXPECT_TRUE(t.fork_copies_nothing()) << "a chunk a fork would copy: " << t.mappings << " mappings, "
                                           << t.dont_fork_mappings << " dc, " << t.shared_mappings << " sh";
      if (k.memfd)
        EXPECT_EQ(t.shared_mappings, t.mappings) << "memfd chunks are shared with children, not left out";
      else
        EXPECT_EQ(t.dont_fork_mappings, t.mappings);
    }
    EXPECT_EQ(os::hidden_range_count(), hidden_before + (k.memfd ? 0 : chunks.size()));
    pool.deallocate(small);
    pool.deallocate(big);
  }
  EXPECT_EQ(os::hidden_range_count(), hidden_before) << "a destroyed pool left ranges recorded";
}

TEST(PoolFork, APoolWithoutHooksIsOrdinaryCopyOnWriteMemory) {
  PoolOptions o = test_support::small_chunks(4 * MiB);
  Pool pool(o);
  void* p = pool.allocate(3 * MiB);
  const auto chunks = pool.chunks();
  ASSERT_EQ(chunks.size(), 1u);
  const os::SmapsTotals t = smaps_of(chunks[0].base, chunks[0].bytes);
  EXPECT_EQ(t.dont_fork_mappings, 0u) << "pageable pool memory stays readable in a child, as malloc's";
  pool.deallocate(p);
}

TEST(PoolFork, TrimmedChunksAreForgotten) {
  const size_t hidden_before = os::hidden_range_count();
  PoolOptions o = test_support::small_chunks(2 * MiB);
  Pool pool(o, std::make_shared<NoPinHooks>());
  std::vector<void*> ps;
  for (int i = 0; i < 5; ++i) ps.push_back(pool.allocate(2 * MiB));
  EXPECT_EQ(os::hidden_range_count(), hidden_before + 5);
  for (void* p : ps) pool.deallocate(p);
  pool.trim();
  EXPECT_EQ(os::hidden_range_count(), hidden_before);
}

// The pin is real: without MADV_DONTFORK the kernel copies a pinned range
// into the child (the control), and a pinned pool's chunks it does not.
TEST(PoolFork, AChildGetsNoCopyOfPinnedChunks) {
  FERRYTEST_SKIP_IF_ASAN_FORK();
  if (std::string why = ferrytest::io_uring_pin_unavailable(); !why.empty()) GTEST_SKIP() << why;
  constexpr size_t kBytes = 192 * MiB;
  const uint64_t before = child_private_dirty();

  void* plain = nullptr;
  ASSERT_EQ(os::map_anonymous(kBytes, 2 * MiB, &plain), 0);
  fill(plain, kBytes, 1);
  const int ring = ferrytest::io_uring_pin(plain, kBytes);
  ASSERT_GE(ring, 0) << std::strerror(-ring);
  const uint64_t with_plain_pin = child_private_dirty();
  ::close(ring);
  os::unmap(plain, kBytes);
  ASSERT_GE(with_plain_pin, before + kBytes * 3 / 4)
      << "control: a pinned private range was not copied into the child (" << with_plain_pin << " vs "
      << before << " bytes private): this kernel does not show what the test looks for";

  auto hooks = std::make_shared<ferrytest::PinHooks>();
  PoolOptions o = test_support::small_chunks(64 * MiB);
  Pool pool(o, hooks);
  void* p = pool.allocate(kBytes - 1000);
  fill(p, kBytes - 1008, 2);
  ASSERT_EQ(hooks->pinned_chunks(), pool.chunks().size());
  const uint64_t with_pool = child_private_dirty();
  EXPECT_LE(with_pool, before + 16 * MiB) << "the child got a private copy of pinned pool memory: " << with_pool
                                          << " bytes private, " << before << " before the pool";
  EXPECT_TRUE(holds(p, kBytes - 1008, 2)) << "the parent's data changed";
  pool.deallocate(p);
}

// What the child finds: a tombstone (nothing maps there), and a touch kills
// it with ferry's line on stderr, never silent zeros.
TEST(PoolFork, AChildThatTouchesInheritedPinnedMemoryIsToldWhy) {
  FERRYTEST_SKIP_IF_ASAN_FORK();
  PoolOptions o = test_support::small_chunks(4 * MiB);
  Pool pool(o, std::make_shared<NoPinHooks>());
  auto* p = static_cast<volatile uint64_t*>(pool.allocate(4096));
  *p = 42;

  int err_pipe[2], say_pipe[2];
  ASSERT_EQ(::pipe(err_pipe), 0);
  ASSERT_EQ(::pipe(say_pipe), 0);
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(err_pipe[1], STDERR_FILENO);
    auto say = [&](const char* text) { (void)!::write(say_pipe[1], text, std::strlen(text)); };
    if (!os::in_tombstone(const_cast<uint64_t*>(p))) say("no tombstone at the pool's address;");
    void* q = ::mmap(const_cast<uint64_t*>(p), 4096, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (q != MAP_FAILED) say("a new mapping landed where the parent's pinned memory was;");
    say("touching;");
    const uint64_t v = *p;  // dies here
    char text[64];
    std::snprintf(text, sizeof text, "read %llu and lived;", static_cast<unsigned long long>(v));
    say(text);
    ::_exit(0);
  }
  ::close(err_pipe[1]);
  ::close(say_pipe[1]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  auto drain = [](int fd) {
    std::string s;
    char buf[1024];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0) s.append(buf, static_cast<size_t>(n));
    ::close(fd);
    return s;
  };
  const std::string stderr_text = drain(err_pipe[0]), said = drain(say_pipe[0]);
  EXPECT_EQ(said, "touching;");
  if (!FERRYTEST_TSAN) {  // TSan's own SIGSEGV report ends the child its way
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV) << "status " << status;
  } else {
    EXPECT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  EXPECT_NE(stderr_text.find("ferry: process " + std::to_string(pid) + " touched 0x"), std::string::npos)
      << stderr_text;
  EXPECT_NE(stderr_text.find("memfd"), std::string::npos) << "the line says what to do instead";
  EXPECT_NE(stderr_text.find("ferry.node.NodePool(name)"), std::string::npos) << "and for a node pool's views";
  EXPECT_EQ(*p, 42u) << "the parent's memory changed";
  pool.deallocate(const_cast<uint64_t*>(p));
}

// A memfd pool's memory is the same pages in parent and child.
TEST(PoolFork, AChildSharesAMemfdPinnedPool) {
  PoolOptions o = test_support::small_chunks(4 * MiB);
  o.memfd = true;
  Pool pool(o, std::make_shared<NoPinHooks>());
  void* p = pool.allocate(MiB + 24);
  fill(p, MiB + 24, 7);
  const ferrytest::ChildEnd end = ferrytest::run_in_child([&](const Say& say) {
    if (!holds(p, MiB + 24, 7)) return say("the child reads other bytes than the parent wrote"), 1;
    if (os::in_tombstone(p)) return say("a tombstone over shared memory"), 1;
    fill(p, MiB + 24, 8);
    return 0;
  });
  ASSERT_TRUE(end.clean()) << end.describe();
  EXPECT_TRUE(holds(p, MiB + 24, 8)) << "the child's writes did not reach the parent: not shared";
  pool.deallocate(p);
}

TEST(PoolFork, AChildMakesPinnedPoolsOfItsOwnAndItsChildrenSeeTombstonesOfBoth) {
  FERRYTEST_SKIP_IF_ASAN_FORK();
  FERRYTEST_SKIP_IF_TSAN_CHILD_THREADS();
  PoolOptions o = test_support::small_chunks(4 * MiB);
  o.touch_threads = 1;
  Pool pool(o, std::make_shared<NoPinHooks>());
  void* parents = pool.allocate(100);
  const ferrytest::ChildEnd end = ferrytest::run_in_child([&](const Say& say) {
    int bad = 0;
    auto check = [&](bool ok, const std::string& what) { bad += !ok; if (!ok) say(what); };
    check(os::hidden_range_count() == 0, "the child still records the parent's ranges");
    Pool own(o, std::make_shared<NoPinHooks>());
    void* mine = own.allocate(3 * MiB);
    fill(mine, 3 * MiB, 9);
    check(holds(mine, 3 * MiB, 9), "the child's own pinned pool does not hold its data");
    check(os::hidden_range_count() == 1, "the child's own chunk is not hidden from its children");
    const ferrytest::ChildEnd grand = ferrytest::run_in_child([&](const Say& say2) {
      int bad2 = 0;
      if (!os::in_tombstone(parents)) say2("no tombstone for the grandparent's chunk"), ++bad2;
      if (!os::in_tombstone(mine)) say2("no tombstone for the parent's chunk"), ++bad2;
      return bad2;
    });
    check(grand.clean(), "grandchild: " + grand.describe());
    own.deallocate(mine);
    return bad;
  });
  EXPECT_TRUE(end.clean()) << end.describe();
  pool.deallocate(parents);
}

}  // namespace
}  // namespace ferry
