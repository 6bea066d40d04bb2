// os_test.cpp — the OS layer on the real kernel: aligned anonymous and shared
// mappings, memfd sharing, advice that zeroes, parallel first touch, NUMA
// binding, hugetlb without reserved pages, fault injection at every call
// site, and the pure sysfs parsers (table-driven).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <string>

#include "core/fault.h"
#include "os/memory.h"
#include "os/smaps.h"
#include "os/sysfs.h"
#include "os/touch.h"

namespace ferry::os {
namespace {

constexpr size_t MiB = size_t{1} << 20;

class Os : public ::testing::Test {
 protected:
  void TearDown() override { set_fault_injection(""); }
};

bool all_zero(const char* p, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != 0) return false;
  return true;
}

void fill_random(char* p, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<char>(rng() | 1);  // never zero
}

TEST_F(Os, AnonymousMappingIsAlignedWritableAndZero) {
  for (size_t alignment : {size_t{4096}, 2 * MiB, 64 * MiB}) {
    for (size_t bytes : {4096 * size_t{3}, 2 * MiB, 6 * MiB}) {
      void* p = nullptr;
      ASSERT_EQ(map_anonymous(bytes, alignment, &p), 0);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % alignment, 0u) << alignment;
      char* c = static_cast<char*>(p);
      EXPECT_TRUE(all_zero(c, bytes));
      fill_random(c, bytes, bytes);
      EXPECT_EQ(unmap(p, bytes), 0);
    }
  }
}

TEST_F(Os, AnonymousMappingRejectsBadArguments) {
  void* p = reinterpret_cast<void*>(0x1234);
  EXPECT_EQ(map_anonymous(2 * MiB, 3 * 4096, &p), EINVAL);
  EXPECT_EQ(map_anonymous(0, 2 * MiB, &p), EINVAL);
  EXPECT_EQ(map_anonymous(SIZE_MAX - 4096, 2 * MiB, &p), EINVAL);
  EXPECT_EQ(p, reinterpret_cast<void*>(0x1234));  // outputs untouched on failure
}

TEST_F(Os, DontNeedZeroesPrivateMemory) {
  void* p = nullptr;
  ASSERT_EQ(map_anonymous(4 * MiB, 2 * MiB, &p), 0);
  char* c = static_cast<char*>(p);
  fill_random(c, 4 * MiB, 7);
  ASSERT_EQ(advise_dont_need(c + 2 * MiB, 2 * MiB), 0);
  EXPECT_FALSE(all_zero(c, 2 * MiB));
  EXPECT_TRUE(all_zero(c + 2 * MiB, 2 * MiB));
  unmap(p, 4 * MiB);
}

TEST_F(Os, MemfdIsSharedBetweenMappingsAndRemoveZeroesIt) {
  int fd = -1;
  ASSERT_EQ(create_memfd("ferry-os-test", 4 * MiB, 0, &fd), 0);
  void *a = nullptr, *b = nullptr;
  ASSERT_EQ(map_shared(fd, 4 * MiB, 2 * MiB, &a), 0);
  ASSERT_EQ(map_shared(fd, 4 * MiB, 2 * MiB, &b), 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % (2 * MiB), 0u);
  EXPECT_NE(a, b);
  char *ca = static_cast<char*>(a), *cb = static_cast<char*>(b);
  fill_random(ca, 4 * MiB, 11);
  EXPECT_EQ(std::memcmp(ca, cb, 4 * MiB), 0);  // one file, two views
  struct stat st {};
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_EQ(static_cast<size_t>(st.st_size), 4 * MiB);
  ASSERT_EQ(advise_remove(ca, 2 * MiB), 0);
  EXPECT_TRUE(all_zero(cb, 2 * MiB));  // the file's pages are gone, not just this view
  EXPECT_FALSE(all_zero(cb + 2 * MiB, 2 * MiB));
  unmap(a, 4 * MiB);
  unmap(b, 4 * MiB);
  EXPECT_EQ(close_fd(fd), 0);
}

TEST_F(Os, TouchCommitsEveryPageAndLeavesZero) {
  const size_t bytes = 10 * MiB + 12 * 4096;  // not a whole number of 2 MiB units
  for (int threads : {1, 3, 16}) {
    void* p = nullptr;
    ASSERT_EQ(map_anonymous(bytes, 2 * MiB, &p), 0);
    ASSERT_EQ(advise_no_huge(p, bytes), 0);  // count 4 KiB pages exactly
    ASSERT_EQ(touch_pages(p, bytes, threads), 0);
    std::string smaps;
    ASSERT_EQ(read_smaps(&smaps), 0);
    const uintptr_t b = reinterpret_cast<uintptr_t>(p);
    const SmapsTotals t = parse_smaps(smaps, b, b + bytes);
    EXPECT_GE(t.rss_bytes, bytes) << threads << " threads";
    EXPECT_TRUE(all_zero(static_cast<char*>(p), bytes));
    unmap(p, bytes);
  }
}

TEST_F(Os, HugetlbMappingNeedsReservedPages) {
  uint64_t free_pages = 0;
  if (read_free_hugepages(kHugePage2MBytes, &free_pages) != 0)
    GTEST_SKIP() << "no 2 MiB hugetlb pool in sysfs";
  void* p = nullptr;
  const int err = map_hugetlb(2 * MiB, kHugePage2MBytes, &p);
  if (free_pages == 0) {
    EXPECT_EQ(err, ENOMEM) << "no free 2 MiB pages, yet mmap(MAP_HUGETLB) did not fail with ENOMEM";
    return;
  }
  ASSERT_EQ(err, 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % (2 * MiB), 0u);
  static_cast<char*>(p)[0] = 1;
  unmap(p, 2 * MiB);
}

TEST_F(Os, HugetlbArgumentsAreChecked) {
  void* p = nullptr;
  int fd = -1;
  EXPECT_EQ(map_hugetlb(2 * MiB, 4096, &p), EINVAL);
  EXPECT_EQ(map_hugetlb(3 * MiB, kHugePage2MBytes, &p), EINVAL);
  EXPECT_EQ(create_memfd("x", 3 * MiB, kHugePage2MBytes, &fd), EINVAL);
}

TEST_F(Os, BindToNode) {
  void* p = nullptr;
  ASSERT_EQ(map_anonymous(2 * MiB, 2 * MiB, &p), 0);
  EXPECT_EQ(bind_to_node(p, 2 * MiB, -1), EINVAL);
  EXPECT_EQ(bind_to_node(p, 2 * MiB, 5000), EINVAL);
  struct stat st {};
  if (stat("/sys/devices/system/node/node0", &st) == 0) {
    const int err = bind_to_node(p, 2 * MiB, 0);
    EXPECT_TRUE(err == 0 || err == ENOSYS) << std::strerror(err);
  }
  unmap(p, 2 * MiB);
}

TEST_F(Os, FaultInjectionFailsEachCallSiteAsTheKernelWould) {
  void* p = reinterpret_cast<void*>(0x1);
  int fd = 12345;
  set_fault_injection("mmap:0");
  EXPECT_EQ(map_anonymous(2 * MiB, 2 * MiB, &p), ENOMEM);
  EXPECT_EQ(p, reinterpret_cast<void*>(0x1));
  set_fault_injection("mmap:0");
  EXPECT_EQ(map_hugetlb(2 * MiB, kHugePage2MBytes, &p), ENOMEM);
  set_fault_injection("memfd:0");
  EXPECT_EQ(create_memfd("x", 2 * MiB, 0, &fd), ENOMEM);
  EXPECT_EQ(fd, 12345);

  set_fault_injection("");
  ASSERT_EQ(create_memfd("x", 2 * MiB, 0, &fd), 0);
  set_fault_injection("mmap:0");
  EXPECT_EQ(map_shared(fd, 2 * MiB, 2 * MiB, &p), ENOMEM);
  set_fault_injection("");
  close_fd(fd);

  ASSERT_EQ(map_anonymous(2 * MiB, 2 * MiB, &p), 0);
  set_fault_injection("madvise:0+");
  EXPECT_EQ(advise_huge(p, 2 * MiB), EINVAL);
  EXPECT_EQ(advise_no_huge(p, 2 * MiB), EINVAL);
  EXPECT_EQ(advise_dont_need(p, 2 * MiB), EINVAL);
  EXPECT_EQ(advise_remove(p, 2 * MiB), EINVAL);
  set_fault_injection("touch:0");
  EXPECT_EQ(touch_pages(p, 2 * MiB, 2), ENOMEM);
  set_fault_injection("");
  EXPECT_EQ(advise_huge(p, 2 * MiB), 0);
  EXPECT_EQ(touch_pages(p, 2 * MiB, 2), 0);
  unmap(p, 2 * MiB);
}

// ---- pure parsers -----------------------------------------------------------

TEST(Sysfs, ParseThpSetting) {
  const struct {
    const char* text;
    const char* want;
  } cases[] = {
      {"always [madvise] never\n", "madvise"},
      {"[always] madvise never", "always"},
      {"always madvise [never]", "never"},
      {"always within_size advise [never] deny force\n", "never"},
      {"always defer defer+madvise [madvise] never", "madvise"},
      {"madvise\n", "madvise"},
      {"  never  ", "never"},
      {"", ""},
      {"\n", ""},
      {"always madvise never", ""},        // nothing selected
      {"[always] [madvise] never", ""},    // two selected
      {"always [madvise never", ""},       // broken bracket
      {"[] madvise", ""},                  // empty selection
      {"[always]]", ""},                   // found by tests/fuzz/sysfs_fuzz.cpp: was "always]"
      {"[[always]", ""},
  };
  for (const auto& c : cases) EXPECT_EQ(parse_thp_setting(c.text), c.want) << "'" << c.text << "'";
}

TEST(Sysfs, ParseUnsigned) {
  const struct {
    const char* text;
    bool ok;
    uint64_t want;
  } cases[] = {
      {"0", true, 0},           {"16\n", true, 16},     {"  42 ", true, 42},
      {"18446744073709551615", true, UINT64_MAX},       {"18446744073709551616", false, 0},
      {"", false, 0},           {"-1", false, 0},       {"12a", false, 0},
      {"1 2", false, 0},
  };
  for (const auto& c : cases) {
    uint64_t v = 777;
    EXPECT_EQ(parse_unsigned(c.text, &v), c.ok) << "'" << c.text << "'";
    EXPECT_EQ(v, c.ok ? c.want : 777) << "'" << c.text << "'";
  }
}

TEST(Sysfs, HugepagesDirNamesThePageSizeInKiB) {
  EXPECT_EQ(hugepages_dir(kHugePage2MBytes), "/sys/kernel/mm/hugepages/hugepages-2048kB");
  EXPECT_EQ(hugepages_dir(kHugePage1GBytes), "/sys/kernel/mm/hugepages/hugepages-1048576kB");
}

TEST(Sysfs, ReadersOnThisMachine) {
  std::string text;
  EXPECT_EQ(read_file("/nonexistent/ferry", &text), ENOENT);
  EXPECT_EQ(read_file("/proc/self/smaps", &text, 16), E2BIG);
  EXPECT_GE(usable_cores(), 1);
  std::string thp;
  const int err = read_thp_enabled(&thp);
  if (err == 0)
    EXPECT_TRUE(thp == "always" || thp == "madvise" || thp == "never") << thp;
  else
    EXPECT_EQ(err, ENOENT);
}

}  // namespace
}  // namespace ferry::os
