// smaps_test.cpp — the smaps parser on sample text (table-driven), and what
// the kernel really did with pool chunks: THP-advised chunks get huge pages,
// small chunks none, hugetlb chunks are backed by hugetlb pages.
#include "os/smaps.h"

#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "os/sysfs.h"
#include "pool/pool.h"

namespace ferry {
namespace {

constexpr size_t MiB = size_t{1} << 20;

const char* kSample =
    "7f0000000000-7f0004000000 rw-p 00000000 00:00 0 \n"
    "Size:              65536 kB\n"
    "KernelPageSize:        4 kB\n"
    "MMUPageSize:           4 kB\n"
    "Rss:               65536 kB\n"
    "Anonymous:         65536 kB\n"
    "AnonHugePages:     61440 kB\n"
    "ShmemPmdMapped:        0 kB\n"
    "FilePmdMapped:         0 kB\n"
    "Shared_Hugetlb:        0 kB\n"
    "Private_Hugetlb:       0 kB\n"
    "THPeligible:    1\n"
    "VmFlags: rd wr mr mw me ac sd hg \n"
    "7f0004000000-7f0004200000 rw-s 00000000 00:01 1234                       /memfd:ferry-pool (deleted)\n"
    "Size:               2048 kB\n"
    "KernelPageSize:        4 kB\n"
    "Rss:                2048 kB\n"
    "AnonHugePages:         0 kB\n"
    "ShmemPmdMapped:     2048 kB\n"
    "FilePmdMapped:         0 kB\n"
    "THPeligible:    1\n"
    "VmFlags: rd wr sh mr mw me ms sd hg \n"
    "7f0010000000-7f0010400000 rw-p 00000000 00:00 0 \n"
    "Size:               4096 kB\n"
    "KernelPageSize:     2048 kB\n"
    "Rss:                   0 kB\n"
    "AnonHugePages:         0 kB\n"
    "Shared_Hugetlb:        0 kB\n"
    "Private_Hugetlb:    4096 kB\n"
    "THPeligible:    0\n"
    "VmFlags: rd wr mr mw me dc de ht sd \n"
    "7f0020000000-7f0020001000 rw-p 00000000 00:00 0 \n"
    "Size:                  4 kB\n"
    "Rss:                   4 kB\n"
    "AnonHugePages:         0 kB\n"
    "THPeligible:    0\n"
    "VmFlags: rd wr mr mw me ac sd nh \n";

struct Case {
  const char* name;
  uintptr_t begin, end;
  size_t mappings;
  uint64_t rss, anon_huge, pmd, hugetlb, kernel_page;
  bool eligible, hg, nh;
};

const Case kCases[] = {
    {"a THP mapping", 0x7f0000000000, 0x7f0004000000, 1, 65536 << 10, 61440 << 10, 0, 0, 4096, true, true, false},
    {"a range inside a mapping counts the whole mapping", 0x7f0001000000, 0x7f0001001000, 1, 65536 << 10,
     61440 << 10, 0, 0, 4096, true, true, false},
    {"shmem PMD mapped", 0x7f0004000000, 0x7f0004200000, 1, 2048 << 10, 0, 2048 << 10, 0, 4096, true, true, false},
    {"two mappings sum", 0x7f0000000000, 0x7f0004200000, 2, (65536 + 2048) << 10, 61440 << 10, 2048 << 10, 0,
     4096, true, true, false},
    {"hugetlb", 0x7f0010000000, 0x7f0010400000, 1, 0, 0, 0, 4096 << 10, 2048 << 10, false, false, false},
    {"no huge advice", 0x7f0020000000, 0x7f0020001000, 1, 4096, 0, 0, 0, 0, false, false, true},
    {"a gap between mappings", 0x7f0005000000, 0x7f0006000000, 0, 0, 0, 0, 0, 0, false, false, false},
    {"end is exclusive", 0x7f0003000000, 0x7f0004000000, 1, 65536 << 10, 61440 << 10, 0, 0, 4096, true, true, false},
    {"begin at a mapping's end excludes it", 0x7f0004200000, 0x7f0004300000, 0, 0, 0, 0, 0, 0, false, false, false},
    {"one eligible and one not is not eligible", 0x7f0004000000, 0x7f0010400000, 2, 2048 << 10, 0, 2048 << 10,
     4096 << 10, 2048 << 10, false, true, false},
};

TEST(Smaps, ParsesSampleText) {
  for (const Case& c : kCases) {
    const os::SmapsTotals t = os::parse_smaps(kSample, c.begin, c.end);
    EXPECT_EQ(t.mappings, c.mappings) << c.name;
    EXPECT_EQ(t.rss_bytes, c.rss) << c.name;
    EXPECT_EQ(t.anon_huge_bytes, c.anon_huge) << c.name;
    EXPECT_EQ(t.pmd_mapped_bytes, c.pmd) << c.name;
    EXPECT_EQ(t.hugetlb_bytes, c.hugetlb) << c.name;
    EXPECT_EQ(t.kernel_page_bytes, c.kernel_page) << c.name;
    EXPECT_EQ(t.thp_eligible, c.eligible) << c.name;
    EXPECT_EQ(t.advised_huge, c.hg) << c.name;
    EXPECT_EQ(t.advised_no_huge, c.nh) << c.name;
  }
}

TEST(Smaps, TellsWhatForkCopies) {
  const os::SmapsTotals thp = os::parse_smaps(kSample, 0x7f0000000000, 0x7f0004000000);
  EXPECT_EQ(thp.dont_fork_mappings + thp.shared_mappings, 0u);
  EXPECT_FALSE(thp.fork_copies_nothing()) << "private memory without dc is copied (or shared copy-on-write)";
  const os::SmapsTotals memfd = os::parse_smaps(kSample, 0x7f0004000000, 0x7f0004200000);
  EXPECT_EQ(memfd.shared_mappings, 1u);
  EXPECT_TRUE(memfd.fork_copies_nothing());
  const os::SmapsTotals hidden = os::parse_smaps(kSample, 0x7f0010000000, 0x7f0010400000);
  EXPECT_EQ(hidden.dont_fork_mappings, 1u);
  EXPECT_TRUE(hidden.fork_copies_nothing());
  const os::SmapsTotals both = os::parse_smaps(kSample, 0x7f0004000000, 0x7f0010400000);
  EXPECT_EQ(both.mappings, 2u);
  EXPECT_TRUE(both.fork_copies_nothing());
  EXPECT_FALSE(os::parse_smaps(kSample, 0x7f0000000000, 0x7f0010400000).fork_copies_nothing());
  EXPECT_FALSE(os::parse_smaps(kSample, 0x7f0005000000, 0x7f0006000000).fork_copies_nothing()) << "no mapping";
}

TEST(Smaps, SurvivesGarbageAndCrLf) {
  const char* text =
      "garbage line\n"
      "7f0000000000-7f0000200000 rw-p 00000000 00:00 0\r\n"
      "Rss:   2048 kB\r\n"
      "AnonHugePages: notanumber kB\n"
      "Weird\n"
      "zz-yy not a header\n";
  const os::SmapsTotals t = os::parse_smaps(text, 0x7f0000000000, 0x7f0000200000);
  EXPECT_EQ(t.mappings, 1u);
  EXPECT_EQ(t.rss_bytes, 2048u << 10);
  EXPECT_EQ(t.anon_huge_bytes, 0u);
  EXPECT_EQ(os::parse_smaps("", 0, UINTPTR_MAX).mappings, 0u);
}

os::SmapsTotals smaps_of(const void* p, size_t bytes) {
  std::string text;
  EXPECT_EQ(os::read_smaps(&text), 0);
  const uintptr_t b = reinterpret_cast<uintptr_t>(p);
  return os::parse_smaps(text, b, b + bytes);
}

TEST(SmapsOfPool, ThpChunksGetHugePagesAndSmallChunksNone) {
  std::string setting;
  if (int err = os::read_thp_enabled(&setting))
    GTEST_SKIP() << "transparent_hugepage/enabled not readable: " << std::strerror(err);
  if (setting != "always" && setting != "madvise")
    GTEST_SKIP() << "transparent_hugepage/enabled is " << setting << ": THP advice cannot take effect";

  PoolOptions o;
  o.chunk_bytes = 8 * MiB;
  o.huge_pages = HugePolicy::thp;
  Pool pool(o);
  void* huge = pool.allocate(4 * MiB, 2 * MiB, HugeWant::yes);
  void* small = pool.allocate(4 * MiB, 4096, HugeWant::no);
  const PoolStats s = pool.stats();
  ASSERT_EQ(s.chunks_by_backing[static_cast<int>(Backing::thp)], 1u) << (s.notes.empty() ? "" : s.notes[0]);

  const os::SmapsTotals h = smaps_of(huge, 4 * MiB);
  EXPECT_TRUE(h.advised_huge);
  EXPECT_GT(h.anon_huge_bytes, 0u) << "a touched MADV_HUGEPAGE chunk has no AnonHugePages";
  const os::SmapsTotals n = smaps_of(small, 4 * MiB);
  EXPECT_TRUE(n.advised_no_huge);
  EXPECT_EQ(n.anon_huge_bytes, 0u);
  EXPECT_GE(n.rss_bytes, 8 * MiB) << "the small chunk was not first-touched";
  pool.deallocate(huge);
  pool.deallocate(small);
}

TEST(SmapsOfPool, HugetlbChunksAreBackedByHugetlbPages) {
  uint64_t free_pages = 0;
  if (int err = os::read_free_hugepages(2 * MiB, &free_pages))
    GTEST_SKIP() << "no 2 MiB hugetlb pool: " << std::strerror(err);
  if (free_pages < 2)
    GTEST_SKIP() << free_pages << " free 2 MiB hugetlb pages (need 2): reserve some with "
                 << "echo 2 > /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages";
  PoolOptions o;
  o.chunk_bytes = 4 * MiB;
  o.huge_pages = HugePolicy::hugetlb;
  Pool pool(o);
  void* p = pool.allocate(3 * MiB, 256, HugeWant::yes);
  EXPECT_EQ(pool.stats().chunks_by_backing[static_cast<int>(Backing::hugetlb_2m)], 1u);
  const os::SmapsTotals t = smaps_of(p, 3 * MiB);
  EXPECT_EQ(t.kernel_page_bytes, 2 * MiB);
  EXPECT_EQ(t.hugetlb_bytes, 4 * MiB);
  pool.deallocate(p);
}

TEST(SmapsOfPool, HugetlbPolicyWithoutPagesFailsClearly) {
  uint64_t free_pages = 0;
  if (os::read_free_hugepages(2 * MiB, &free_pages) == 0 && free_pages > 0)
    GTEST_SKIP() << "2 MiB hugetlb pages are reserved here; this checks the error without them";
  PoolOptions o;
  o.chunk_bytes = 4 * MiB;
  o.huge_pages = HugePolicy::hugetlb;
  Pool pool(o);
  try {
    pool.allocate(MiB, 256, HugeWant::yes);
    FAIL() << "hugetlb policy without hugetlb pages allocated anyway";
  } catch (const NotSupported& e) {
    EXPECT_NE(std::string(e.what()).find("hugetlb"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("nr_hugepages"), std::string::npos) << e.what();
  }
  EXPECT_EQ(pool.stats().kind[1].reserved.current, 0u);
  // Small allocations do not need hugetlb pages.
  pool.deallocate(pool.allocate(4096, 4096, HugeWant::no));
}

}  // namespace
}  // namespace ferry
