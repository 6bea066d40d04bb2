// os_test.cpp — the OS layer on the real kernel: aligned anonymous and shared
// mappings, memfd sharing, advice that zeroes, parallel first touch, NUMA
// binding, hugetlb without reserved pages, fault injection at every call
// site, thread affinity, the pure sysfs parsers (table-driven) and the NUMA
// and PCI readers on this machine's sysfs.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/fault.h"
#include "load/range_read.h"
#include "os/affinity.h"
#include "os/file.h"
#include "os/memory.h"
#include "os/process.h"
#include "os/smaps.h"
#include "os/sysfs.h"
#include "os/touch.h"
#include "os/unix_socket.h"

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

TEST(Sysfs, ParseCpulist) {
  using V = std::vector<int>;
  const struct {
    const char* text;
    bool ok;
    V want;
  } cases[] = {
      {"0-3,8,10-11\n", true, {0, 1, 2, 3, 8, 10, 11}},
      {"5", true, {5}},
      {"\n", true, {}},  // a node without CPUs
      {"", true, {}},
      {" 3 , 1 ", true, {1, 3}},
      {"2,0-2", true, {0, 1, 2}},  // repeats collapse
      {"0-31:2/4", true, {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29}},
      {"1-6:1/3", true, {1, 4}},
      {"0-2:3/3", true, {0, 1, 2}},
      {"65535", true, {65535}},
      {"65536", false, {}},       // above kMaxCpuId
      {"0-65535,0-65535", true, {}},           // 2^17 ids: at the bound (checked below)
      {"0-65535,0-65535,0", false, {}},        // one more than 2^17
      {"3-1", false, {}},         // backwards
      {"0-3,", false, {}},
      {",0", false, {}},
      {"0,,1", false, {}},
      {"-1", false, {}},
      {"0-", false, {}},
      {"a", false, {}},
      {"0-3:2", false, {}},       // stride without group
      {"0-3:0/4", false, {}},     // used < 1
      {"0-3:5/4", false, {}},     // used > group
      {"3:1/2", false, {}},       // stride without range
      {"0-3/4", false, {}},
      {"0 1", false, {}},
      {"12345678901", false, {}},  // 11 digits
  };
  for (const auto& c : cases) {
    V got = {-7};
    EXPECT_EQ(parse_cpulist(c.text, &got), c.ok) << "'" << c.text << "'";
    if (c.ok && got.size() == 65536) continue;  // the bound case: too long to list
    EXPECT_EQ(got, c.ok ? c.want : V{-7}) << "'" << c.text << "'";
  }
  // Random lists of ids written in the plain form parse back to the same set.
  std::mt19937_64 rng(11);
  for (int round = 0; round < 200; ++round) {
    V ids;
    for (int i = 0; i < 64; ++i)
      if (rng() % 3 == 0) ids.push_back(i * static_cast<int>(1 + rng() % 7));
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    std::string text;
    for (size_t i = 0; i < ids.size(); ++i) text += (i ? "," : "") + std::to_string(ids[i]);
    V got;
    ASSERT_TRUE(parse_cpulist(text, &got)) << text;
    EXPECT_EQ(got, ids) << text;
  }
}

TEST(Sysfs, NormalizePciBusId) {
  const struct {
    const char* text;
    const char* want;
  } cases[] = {
      {"00000000:0A:00.0", "0000:0a:00.0"},  // cudaDeviceGetPCIBusId
      {"0000:0a:00.0", "0000:0a:00.0"},      // sysfs
      {"0a:1f.7", "0000:0a:1f.7"},
      {"1:2:3.4", "0001:02:03.4"},
      {" 0000:9A:00.1\n", "0000:9a:00.1"},
      {"FFFFFFFF:ff:ff.7", "ffffffff:ff:ff.7"},
      {"", ""},
      {"0000:0a:00.8", ""},       // functions are 0-7
      {"0000:0a:00", ""},
      {"0000:0a.00.0", ""},
      {"000000000:0a:00.0", ""},  // 9-digit domain
      {"0000:100:00.0", ""},      // 3-digit bus
      {"0000:0g:00.0", ""},
      {"x:0000:0a:00.0", ""},
      {"0000:0a:00.0.1", ""},
      {"../../0000:0a:00.0", ""},
  };
  for (const auto& c : cases) EXPECT_EQ(normalize_pci_bus_id(c.text), c.want) << "'" << c.text << "'";
}

TEST(Sysfs, ParseNumaNode) {
  const struct {
    const char* text;
    bool ok;
    int want;
  } cases[] = {{"-1\n", true, -1}, {"0\n", true, 0}, {" 3 ", true, 3}, {"65535", true, 65535},
               {"65536", false, 0}, {"-2", false, 0}, {"", false, 0}, {"1x", false, 0}};
  for (const auto& c : cases) {
    int v = 777;
    EXPECT_EQ(parse_numa_node(c.text, &v), c.ok) << "'" << c.text << "'";
    EXPECT_EQ(v, c.ok ? c.want : 777) << "'" << c.text << "'";
  }
}

// The value a PCI device's numa_node file holds, read without ferry.
int numa_node_file(const std::filesystem::path& device) {
  std::ifstream in(device / "numa_node");
  int v = -100;
  in >> v;
  return v;
}

TEST(Sysfs, PciNumaNodeOfEveryDeviceOnThisMachine) {
  const std::filesystem::path root = "/sys/bus/pci/devices";
  if (!std::filesystem::exists(root)) GTEST_SKIP() << "no " << root << " (not Linux sysfs?)";
  int seen = 0;
  for (const auto& entry : std::filesystem::directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    const int want = numa_node_file(entry.path());
    ASSERT_GE(want, -1) << name;
    int node = -100;
    ASSERT_EQ(read_pci_numa_node(name, &node), 0) << name;
    EXPECT_EQ(node, want) << name;
    // CUDA's form of the same address: 8-digit domain, upper case.
    std::string upper = "0000" + name;
    for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    node = -100;
    ASSERT_EQ(read_pci_numa_node(upper, &node), 0) << upper;
    EXPECT_EQ(node, want) << upper;
    ++seen;
  }
  if (seen == 0) GTEST_SKIP() << "no PCI devices in " << root;
  int node = 5;
  EXPECT_EQ(read_pci_numa_node("0000:0a:00", &node), EINVAL);
  EXPECT_EQ(read_pci_numa_node("../../../etc/passwd", &node), EINVAL);
  EXPECT_EQ(read_pci_numa_node("ffff:ff:1f.7", &node), ENOENT);  // well formed, absent
  EXPECT_EQ(node, 5);
}

TEST(Sysfs, NumaNodesOnThisMachine) {
  std::vector<int> nodes;
  const int err = read_online_nodes(&nodes);
  if (err == ENOENT) GTEST_SKIP() << "kernel without NUMA sysfs";
  ASSERT_EQ(err, 0);
  ASSERT_FALSE(nodes.empty());
  std::vector<int> all, usable;
  for (int n : nodes) {
    std::vector<int> cpus;
    ASSERT_EQ(read_node_cpus(n, &cpus), 0) << "node " << n;
    all.insert(all.end(), cpus.begin(), cpus.end());
  }
  std::vector<int> cpus;
  EXPECT_EQ(read_node_cpus(-1, &cpus), EINVAL);
  EXPECT_EQ(read_node_cpus(kMaxCpuId, &cpus), ENOENT);
  // Every CPU this thread may use belongs to some online node.
  ASSERT_EQ(thread_cpus(&usable), 0);
  for (int c : usable) EXPECT_NE(std::find(all.begin(), all.end(), c), all.end()) << "CPU " << c;
}

// ---- thread affinity --------------------------------------------------------

TEST(Affinity, ThreadCpusCountsTheUsableCores) {
  std::vector<int> cpus;
  ASSERT_EQ(thread_cpus(&cpus), 0);
  ASSERT_FALSE(cpus.empty());
  EXPECT_TRUE(std::is_sorted(cpus.begin(), cpus.end()));
  EXPECT_EQ(static_cast<int>(cpus.size()), usable_cores());
}

TEST(Affinity, BindingAThreadRestrictsItAndOnlyIt) {
  std::vector<int> before;
  ASSERT_EQ(thread_cpus(&before), 0);
  for (int cpu : {before.front(), before.back()}) {
    std::vector<int> inside;
    int err = -1;
    std::thread([&] {
      err = bind_thread_to_cpus({cpu});
      if (err == 0) err = thread_cpus(&inside);
    }).join();
    ASSERT_EQ(err, 0) << "CPU " << cpu;
    EXPECT_EQ(inside, std::vector<int>{cpu});
  }
  std::vector<int> after;
  ASSERT_EQ(thread_cpus(&after), 0);
  EXPECT_EQ(after, before) << "binding another thread changed this one";
  EXPECT_EQ(bind_thread_to_cpus({}), EINVAL);
  EXPECT_EQ(bind_thread_to_cpus({-1}), EINVAL);
  EXPECT_EQ(bind_thread_to_cpus({kMaxCpuId + 1}), EINVAL);
  ASSERT_EQ(thread_cpus(&after), 0);
  EXPECT_EQ(after, before) << "a refused binding changed this thread";
}

// Issue 21, items 2 and 4: files read by name are bounded and must be regular.
// /dev/zero (read only, never written) was read without end; a FIFO made
// open() wait for a writer for ever.
TEST_F(Os, FilesReadByNameMustBeRegularAndAreNeverWaitedOn) {
  const std::string dir = (std::filesystem::temp_directory_path() / ("ferry-os-test-" + std::to_string(::getpid()))).string();
  std::filesystem::create_directories(dir);
  const std::string fifo = dir + "/f.fifo", file = dir + "/small.txt";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::ofstream(file) << std::string(100, 'x');
  std::string out = "unchanged";
  EXPECT_EQ(read_file("/dev/zero", &out, 4096), EINVAL);
  EXPECT_EQ(read_file(fifo.c_str(), &out, 4096), EINVAL);
  EXPECT_EQ(read_file(dir.c_str(), &out, 4096), EISDIR);
  EXPECT_EQ(read_file(file.c_str(), &out, 99), E2BIG);
  EXPECT_EQ(out, "unchanged");
  EXPECT_EQ(read_file(file.c_str(), &out, 100), 0);
  EXPECT_EQ(out, std::string(100, 'x'));
  int fd = -1;
  ASSERT_EQ(open_for_reading(fifo.c_str(), false, &fd), 0);  // at once, not when a writer comes
  uint64_t bytes = 0;
  EXPECT_EQ(regular_file_size(fd, &bytes), EINVAL);
  close_fd(fd);
  std::filesystem::remove_all(dir);
}

// Issue 39 item 4: what python/ferry asks of /proc through the bindings.
TEST(Process, StartTicksOfThisProcessAChildAndOneGone) {
  uint64_t self = 0, by_pid = 0;
  ASSERT_EQ(process_start_ticks(0, &self), 0);
  ASSERT_EQ(process_start_ticks(::getpid(), &by_pid), 0);
  EXPECT_EQ(self, by_pid);
  const pid_t child = ::fork();
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  ASSERT_GT(child, 0);
  uint64_t ticks = 0;
  EXPECT_EQ(process_start_ticks(child, &ticks), 0);
  EXPECT_GE(ticks, self);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  uint64_t untouched = 12345;
  EXPECT_EQ(process_start_ticks(child, &untouched), ESRCH);  // reaped: its /proc entry is gone
  EXPECT_EQ(untouched, 12345u);
  std::string boot, ns;
  ASSERT_EQ(read_boot_id(&boot), 0);
  EXPECT_EQ(boot.size(), 36u);  // a UUID, newline stripped
  ASSERT_EQ(read_pid_namespace(&ns), 0);
  EXPECT_EQ(ns.rfind("pid:[", 0), 0u) << ns;
}

TEST(UnixSocket, PairPassesMessagesWithAndWithoutDescriptors) {
  int a = -1, b = -1;
  ASSERT_EQ(packet_socket_pair(&a, &b), 0);
  int memfd = -1;
  ASSERT_EQ(create_memfd("ferry-os-test", MiB, 0, &memfd), 0);
  ASSERT_EQ(send_with_fd(a, "key", 3, memfd), 0);
  ASSERT_EQ(send_message(a, "plain message", 13), 0);
  char buf[8];
  size_t got = 0;
  int passed = -2;
  bool truncated = true;
  ASSERT_EQ(receive_message(b, buf, sizeof buf, &got, &passed, &truncated), 0);
  EXPECT_EQ(std::string(buf, got), "key");
  EXPECT_GE(passed, 0);
  EXPECT_FALSE(truncated);
  uint64_t bytes = 0;
  EXPECT_EQ(regular_file_size(passed, &bytes), 0);
  EXPECT_EQ(bytes, MiB);  // the same file
  close_fd(passed);
  ASSERT_EQ(receive_message(b, buf, sizeof buf, &got, &passed, &truncated), 0);
  EXPECT_EQ(std::string(buf, got), "plain me");
  EXPECT_EQ(passed, -1);
  EXPECT_TRUE(truncated);  // 13 bytes into 8
  EXPECT_EQ(receive_message(b, buf, sizeof buf, &got, &passed, &truncated), EAGAIN);  // never waits
  // A full queue: wait_writable gives up after its timeout.
  const std::vector<char> big(4096, 'x');
  while (send_message(a, big.data(), big.size()) == 0) {
  }
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(wait_writable(a, 50'000'000), ETIMEDOUT);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(45));
  close_fd(b);
  EXPECT_EQ(wait_writable(a, 1'000'000'000), 0);  // a hung-up peer counts as writable
  const int gone = send_message(a, "x", 1);
  EXPECT_TRUE(gone == EPIPE || gone == ECONNRESET) << gone;  // ECONNRESET: it closed with messages unread
  close_fd(a);
  close_fd(memfd);
}

// load/range_read.h, on a real file: random bytes, odd ranges, several threads,
// a short file counted, a read error named.
TEST(RangeRead, ReadsOddRangesWithThreadsAndCountsAShortFile) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("ferry-range-read-" + std::to_string(::getpid()))).string();
  std::mt19937_64 rng(39);
  std::string data(9 * MiB + 4093, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  std::ofstream(path, std::ios::binary).write(data.data(), static_cast<std::streamsize>(data.size()));
  int fd = -1;
  ASSERT_EQ(open_for_reading(path.c_str(), false, &fd), 0);
  std::vector<char> out(data.size() + 2 * 4096);
  for (int threads : {1, 2, 5}) {
    for (auto [offset, n] : {std::pair<size_t, size_t>{0, data.size()}, {1, 4095}, {4097, 3 * MiB + 13},
                             {data.size() - 5, 5}}) {
      std::fill(out.begin(), out.end(), '\xa5');
      EXPECT_EQ(load::read_range(fd, path, offset, out.data() + 3, n, threads), n);
      EXPECT_EQ(std::memcmp(out.data() + 3, data.data() + offset, n), 0) << offset << " " << n;
      EXPECT_EQ(out[2], '\xa5');
      EXPECT_EQ(out[3 + n], '\xa5');
    }
  }
  EXPECT_EQ(load::read_range(fd, path, data.size() - 100, out.data(), 5000, 3), 100u);  // the file ends first
  EXPECT_EQ(load::read_range(fd, path, data.size() + 7, out.data(), 10, 3), 0u);
  EXPECT_THROW(load::read_range(fd, path, 0, out.data(), 10, 0), InvalidArgument);
  close_fd(fd);
  int wfd = -1;
  ASSERT_EQ(open_for_writing(path.c_str(), &wfd), 0);
  try {
    load::read_range(wfd, path, 4096, out.data(), 100, 2);
    ADD_FAILURE() << "a read of a write-only descriptor succeeded";
  } catch (const OsError& e) {
    EXPECT_EQ(e.error_number(), EBADF);
    EXPECT_NE(std::string(e.what()).find("pread of " + path + " at byte 4096"), std::string::npos) << e.what();
  }
  close_fd(wfd);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace ferry::os
