// arena_test.cpp — the backing a chunk gets, and the fallbacks: each refusal
// is noted, counted and remembered (not retried for the next chunk); real
// failures are clear errors. Uses the real kernel; refusals come from this
// machine's settings or from fault injection.
#include "pool/arena.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "core/error.h"
#include "core/fault.h"
#include "os/smaps.h"
#include "os/sysfs.h"

namespace ferry {
namespace {

constexpr size_t MiB = size_t{1} << 20;

class ArenaTest : public ::testing::Test {
 protected:
  void TearDown() override { set_fault_injection(""); }

  static PoolOptions options(HugePolicy policy, bool memfd = false) {
    PoolOptions o;
    o.huge_pages = policy;
    o.memfd = memfd;
    o.touch_threads = 2;
    return o;
  }

  static bool has_note(const Arena& a, const std::string& part) {
    for (const std::string& n : a.notes())
      if (n.find(part) != std::string::npos) return true;
    return false;
  }

  static std::string all_notes(const Arena& a) {
    std::string out;
    for (const std::string& n : a.notes()) out += n + "\n";
    return out;
  }

  static os::SmapsTotals smaps_of(const MappedChunk& c) {
    std::string text;
    EXPECT_EQ(os::read_smaps(&text), 0);
    return os::parse_smaps(text, c.base, c.base + c.bytes);
  }

  static std::string thp_setting(bool shmem) {
    std::string s;
    return (shmem ? os::read_thp_shmem_enabled(&s) : os::read_thp_enabled(&s)) == 0 ? s : "";
  }

  static uint64_t free_2m_pages() {
    uint64_t n = 0;
    return os::read_free_hugepages(2 * MiB, &n) == 0 ? n : 0;
  }
};

TEST_F(ArenaTest, SmallChunksAreAdvisedNoHugeAndTouched) {
  Arena arena(options(HugePolicy::automatic));
  MappedChunk c = arena.reserve(4 * MiB, PageKind::small);
  EXPECT_EQ(c.base % (2 * MiB), 0u);
  EXPECT_EQ(c.backing, Backing::small_pages);
  EXPECT_EQ(c.fd, -1);
  EXPECT_GT(c.touch_ns, 0u);
  const os::SmapsTotals t = smaps_of(c);
  EXPECT_TRUE(t.advised_no_huge);
  EXPECT_GE(t.rss_bytes, 4 * MiB);
  EXPECT_TRUE(arena.notes().empty()) << all_notes(arena);
  arena.unmap(c);
}

TEST_F(ArenaTest, AutomaticFallsBackFromHugetlbAndRemembersIt) {
  if (free_2m_pages() > 0) GTEST_SKIP() << "2 MiB hugetlb pages are reserved here";
  Arena arena(options(HugePolicy::automatic));
  MappedChunk a = arena.reserve(4 * MiB, PageKind::huge);
  EXPECT_TRUE(has_note(arena, "hugetlb 2 MiB: 0 free pages; using THP")) << all_notes(arena);
  const uint64_t fallbacks = arena.fallbacks();
  EXPECT_GE(fallbacks, 1u);
  MappedChunk b = arena.reserve(4 * MiB, PageKind::huge);
  EXPECT_EQ(arena.fallbacks(), fallbacks) << "the refused hugetlb pages were tried again";
  const std::string thp = thp_setting(false);
  const Backing want = (thp == "always" || thp == "madvise") ? Backing::thp : Backing::small_pages;
  EXPECT_EQ(a.backing, want);
  EXPECT_EQ(b.backing, want);
  arena.unmap(a);
  arena.unmap(b);
}

TEST_F(ArenaTest, AutomaticLeaves1GiBPagesAlone) {
  if (free_2m_pages() > 0) GTEST_SKIP() << "hugetlb pages are reserved here";
  uint64_t free_1g = 0;
  if (os::read_free_hugepages(size_t{1} << 30, &free_1g) == 0 && free_1g > 0)
    GTEST_SKIP() << "1 GiB hugetlb pages are reserved here";
  Arena arena(options(HugePolicy::automatic));
  MappedChunk c = arena.reserve(size_t{1} << 30, PageKind::huge);
  EXPECT_FALSE(has_note(arena, "hugetlb 1 GiB")) << all_notes(arena);
  EXPECT_TRUE(has_note(arena, "hugetlb 2 MiB: 0 free pages; using THP")) << all_notes(arena);
  arena.unmap(c);
  // Asked for explicitly, hugetlb considers 1 GiB pages first.
  Arena explicit_hugetlb(options(HugePolicy::hugetlb));
  try {
    explicit_hugetlb.reserve(size_t{1} << 30, PageKind::huge);
    ADD_FAILURE() << "hugetlb without reserved pages must fail";
  } catch (const Error& e) {
    EXPECT_TRUE(std::string(e.what()).find("1 GiB") != std::string::npos ||
                has_note(explicit_hugetlb, "hugetlb 1 GiB"))
        << e.what() << " / " << all_notes(explicit_hugetlb);
  }
}

TEST_F(ArenaTest, RefusedThpAdviceIsNotedAndNotRetried) {
  const std::string thp = thp_setting(false);
  if (thp != "always" && thp != "madvise") GTEST_SKIP() << "THP enabled is '" << thp << "'";
  Arena arena(options(HugePolicy::thp));
  set_fault_injection("madvise:0");  // only the first madvise fails
  MappedChunk a = arena.reserve(2 * MiB, PageKind::huge);
  EXPECT_EQ(a.backing, Backing::small_pages);
  EXPECT_TRUE(has_note(arena, "THP: madvise(MADV_HUGEPAGE) refused (Invalid argument); using small pages"))
      << all_notes(arena);
  EXPECT_EQ(arena.fallbacks(), 1u);
  MappedChunk b = arena.reserve(2 * MiB, PageKind::huge);
  EXPECT_EQ(b.backing, Backing::small_pages) << "THP was tried again after the kernel refused it";
  EXPECT_EQ(arena.fallbacks(), 1u);
  EXPECT_FALSE(smaps_of(b).advised_huge);
  arena.unmap(a);
  arena.unmap(b);

  Arena fresh(options(HugePolicy::thp));  // the memory is per arena (per pool)
  MappedChunk c = fresh.reserve(2 * MiB, PageKind::huge);
  EXPECT_EQ(c.backing, Backing::thp);
  EXPECT_TRUE(smaps_of(c).advised_huge);
  fresh.unmap(c);
}

TEST_F(ArenaTest, TransientThpAdviceFailureIsRetriedOnTheNextChunk) {
  const std::string thp = thp_setting(false);
  if (thp != "always" && thp != "madvise") GTEST_SKIP() << "THP enabled is '" << thp << "'";
  for (const char* err : {"EAGAIN", "ENOMEM"}) {
    Arena arena(options(HugePolicy::thp));
    set_fault_injection(std::string("madvise:0=") + err);  // only the first madvise fails
    MappedChunk a = arena.reserve(2 * MiB, PageKind::huge);
    EXPECT_EQ(a.backing, Backing::small_pages) << err;
    EXPECT_TRUE(has_note(arena, "that chunk uses small pages, the next one tries THP again")) << all_notes(arena);
    EXPECT_EQ(arena.fallbacks(), 1u);
    MappedChunk b = arena.reserve(2 * MiB, PageKind::huge);
    EXPECT_EQ(b.backing, Backing::thp) << err << ": one transient failure switched the arena to small pages";
    EXPECT_TRUE(smaps_of(b).advised_huge);
    EXPECT_EQ(arena.fallbacks(), 1u);
    set_fault_injection("madvise:0+=EAGAIN");  // failing every time: each chunk still asks
    MappedChunk c = arena.reserve(2 * MiB, PageKind::huge);
    MappedChunk d = arena.reserve(2 * MiB, PageKind::huge);
    EXPECT_EQ(c.backing, Backing::small_pages);
    EXPECT_EQ(d.backing, Backing::small_pages);
    EXPECT_EQ(arena.fallbacks(), 3u);
    set_fault_injection("");
    MappedChunk e = arena.reserve(2 * MiB, PageKind::huge);
    EXPECT_EQ(e.backing, Backing::thp);
    for (const MappedChunk& m : {a, b, c, d, e}) arena.unmap(m);
  }
}

TEST_F(ArenaTest, TransientNoHugeAdviceFailureIsRetriedOnTheNextChunk) {
  Arena arena(options(HugePolicy::automatic));
  set_fault_injection("madvise:0=EAGAIN");
  MappedChunk a = arena.reserve(2 * MiB, PageKind::small);
  MappedChunk b = arena.reserve(2 * MiB, PageKind::small);
  EXPECT_TRUE(has_note(arena, "that chunk has no advice, the next one tries again")) << all_notes(arena);
  EXPECT_FALSE(smaps_of(a).advised_no_huge);
  EXPECT_TRUE(smaps_of(b).advised_no_huge) << "the transient failure was remembered";
  arena.unmap(a);
  arena.unmap(b);
}

TEST_F(ArenaTest, RefusedNoHugeAdviceIsNotedOnce) {
  Arena arena(options(HugePolicy::automatic));
  set_fault_injection("madvise:0");
  MappedChunk a = arena.reserve(2 * MiB, PageKind::small);
  MappedChunk b = arena.reserve(2 * MiB, PageKind::small);
  EXPECT_TRUE(has_note(arena, "madvise(MADV_NOHUGEPAGE) refused (Invalid argument); small chunks get no advice")) << all_notes(arena);
  EXPECT_EQ(arena.fallbacks(), 1u);
  EXPECT_FALSE(smaps_of(b).advised_no_huge) << "the refused advice was tried again";
  arena.unmap(a);
  arena.unmap(b);
}

TEST_F(ArenaTest, PolicyOffGivesNoAdvice) {
  Arena arena(options(HugePolicy::off));
  MappedChunk c = arena.reserve(2 * MiB, PageKind::huge);
  EXPECT_EQ(c.backing, Backing::small_pages);
  EXPECT_FALSE(smaps_of(c).advised_huge);
  EXPECT_TRUE(arena.notes().empty()) << all_notes(arena);
  arena.unmap(c);
}

TEST_F(ArenaTest, HugetlbPolicyWithoutPagesIsNotSupported) {
  if (free_2m_pages() > 0) GTEST_SKIP() << "2 MiB hugetlb pages are reserved here";
  Arena arena(options(HugePolicy::hugetlb));
  try {
    arena.reserve(2 * MiB, PageKind::huge);
    FAIL() << "no exception";
  } catch (const NotSupported& e) {
    EXPECT_NE(std::string(e.what()).find("hugetlb 2 MiB: 0 free pages"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(arena.notes().empty()) << "the hugetlb policy has no fallback to note";
}

TEST_F(ArenaTest, MemfdChunksAreSharedFiles) {
  Arena arena(options(HugePolicy::thp, /*memfd=*/true));
  MappedChunk c = arena.reserve(4 * MiB, PageKind::huge);
  ASSERT_GE(c.fd, 0);
  struct stat st {};
  ASSERT_EQ(fstat(c.fd, &st), 0);
  EXPECT_EQ(static_cast<size_t>(st.st_size), 4 * MiB);
  const std::string shmem = thp_setting(true);
  const bool usable = shmem == "always" || shmem == "within_size" || shmem == "advise" || shmem == "force";
  if (usable) {
    EXPECT_EQ(c.backing, Backing::thp);
  } else {
    EXPECT_EQ(c.backing, Backing::small_pages);
    EXPECT_TRUE(has_note(arena, "THP for memfd")) << all_notes(arena);
  }
  // Released parts of a shared chunk read as zero again.
  char* p = reinterpret_cast<char*>(c.base);
  std::memset(p, 0x5a, 4 * MiB);
  ASSERT_EQ(arena.release_pages(c, c.base + 2 * MiB, 2 * MiB), 0);
  EXPECT_EQ(p[0], 0x5a);
  EXPECT_TRUE(std::all_of(p + 2 * MiB, p + 4 * MiB, [](char v) { return v == 0; }));
  arena.unmap(c);
}

TEST_F(ArenaTest, RefusedNumaBindingIsANote) {
  PoolOptions o = options(HugePolicy::off);
  o.numa_node = 1000;  // no such node
  Arena arena(o);
  MappedChunk a = arena.reserve(2 * MiB, PageKind::small);
  MappedChunk b = arena.reserve(2 * MiB, PageKind::small);
  EXPECT_TRUE(has_note(arena, "NUMA: mbind to node 1000 refused")) << all_notes(arena);
  EXPECT_EQ(arena.fallbacks(), 1u);
  arena.unmap(a);
  arena.unmap(b);

  struct stat st {};
  if (stat("/sys/devices/system/node/node0", &st) != 0) return;
  o.numa_node = 0;
  Arena bound(o);
  MappedChunk c = bound.reserve(2 * MiB, PageKind::small);
  EXPECT_TRUE(bound.notes().empty()) << all_notes(bound);
  bound.unmap(c);
}

TEST_F(ArenaTest, RealFailuresAreClearErrors) {
  Arena arena(options(HugePolicy::automatic));
  set_fault_injection("mmap:0");
  try {
    arena.reserve(2 * MiB, PageKind::small);
    FAIL() << "no exception";
  } catch (const OsError& e) {
    EXPECT_EQ(e.error_number(), ENOMEM);
    EXPECT_EQ(e.status(), FERRY_ERROR_OUT_OF_MEMORY);
    EXPECT_NE(std::string(e.what()).find("mmap of a 2 MiB pool chunk"), std::string::npos) << e.what();
  }
  set_fault_injection("touch:0");
  try {
    arena.reserve(2 * MiB, PageKind::huge);
    FAIL() << "no exception";
  } catch (const OsError& e) {
    EXPECT_NE(std::string(e.what()).find("first touch"), std::string::npos) << e.what();
  }
  Arena shared(options(HugePolicy::automatic, /*memfd=*/true));
  set_fault_injection("memfd:0");
  try {
    shared.reserve(2 * MiB, PageKind::small);
    FAIL() << "no exception";
  } catch (const OsError& e) {
    EXPECT_NE(std::string(e.what()).find("memfd_create"), std::string::npos) << e.what();
  }
  set_fault_injection("");
  MappedChunk c = arena.reserve(2 * MiB, PageKind::small);  // works again
  arena.unmap(c);
}

TEST_F(ArenaTest, PageBytesPerBacking) {
  EXPECT_EQ(Arena::page_bytes(Backing::small_pages), 4096u);
  EXPECT_EQ(Arena::page_bytes(Backing::thp), 2 * MiB);
  EXPECT_EQ(Arena::page_bytes(Backing::hugetlb_2m), 2 * MiB);
  EXPECT_EQ(Arena::page_bytes(Backing::hugetlb_1g), size_t{1} << 30);
}

}  // namespace
}  // namespace ferry
