// numa_test.cpp — a GPU's host NUMA node from sysfs (pool/numa_home.h) and
// the copy crews per node (copy/copy_crew.h): the placement rules
// (table-driven), every PCI device of this machine, the crews' size
// (plan_copy_crew) and the real CPU affinity of crew and worker-pool threads
// bound to a node's CPUs.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include "copy/copy_crew.h"
#include "pool/numa_home.h"
#include "core/crew.h"
#include "core/error.h"
#include "core/options.h"
#include "core/thread_counts.h"
#include "core/worker_pool.h"
#include "os/affinity.h"
#include "os/sysfs.h"

namespace ferry {
namespace {

using V = std::vector<int>;

TEST(NumaHome, Rules) {
  const struct {
    int pci_node;
    V online;
    int want;
  } cases[] = {
      {0, {0}, -1},         // one node: no placement
      {-1, {0, 1}, -1},     // the firmware names no node
      {1, {0, 1}, 1},
      {0, {0, 1, 2, 3}, 0},
      {2, {0, 1}, -1},      // not online
      {3, {0, 3}, 3},       // sparse node ids
      {0, {}, -1},
  };
  for (const auto& c : cases) EXPECT_EQ(numa_home(c.pci_node, c.online), c.want) << "pci node " << c.pci_node;
}

TEST(NumaHome, CrewCpusRules) {
  const struct {
    int node;
    V online, node_cpus, usable, want;
  } cases[] = {
      {0, {0}, {0, 1, 2, 3}, {0, 1, 2, 3}, {}},              // one node: the default crew
      {-1, {0, 1}, {0, 1}, {0, 1, 2, 3}, {}},
      {1, {0, 1}, {4, 5, 6, 7}, {0, 1, 2, 3, 4, 5, 6, 7}, {4, 5, 6, 7}},
      {1, {0, 1}, {4, 5, 6, 7}, {0, 5, 7}, {5, 7}},          // a cpuset: only the usable ones
      {1, {0, 1}, {4, 5, 6, 7}, {0, 1, 2, 3}, {}},           // numactl bound us elsewhere
      {2, {0, 1}, {8, 9}, {8, 9}, {}},                       // not online
      {1, {0, 1}, {}, {0, 1}, {}},                           // a node of memory only
  };
  for (const auto& c : cases)
    EXPECT_EQ(crew_cpus(c.node, c.online, c.node_cpus, c.usable), c.want) << "node " << c.node;
}

TEST(NumaHome, PciNumaNodeOfEveryDeviceOnThisMachine) {
  const std::filesystem::path root = "/sys/bus/pci/devices";
  if (!std::filesystem::exists(root)) GTEST_SKIP() << "no " << root;
  V online;
  const bool have_nodes = os::read_online_nodes(&online) == 0;
  int seen = 0;
  for (const auto& entry : std::filesystem::directory_iterator(root)) {
    std::ifstream in(entry.path() / "numa_node");
    int want = -100;
    in >> want;
    const std::string name = entry.path().filename().string();
    ASSERT_GE(want, -1) << name;
    EXPECT_EQ(pci_numa_node(name), want) << name;
    if (have_nodes) {
      EXPECT_EQ(numa_home(name), numa_home(want, online)) << name;
    }
    ++seen;
  }
  if (seen == 0) GTEST_SKIP() << "no PCI devices in " << root;
}

TEST(NumaHome, MalformedBusIdIsAClearError) {
  for (const char* bad : {"", "gpu0", "0000:0a:00", "0000:0a:00.9", "../0000:00:00.0"}) {
    try {
      pci_numa_node(bad);
      ADD_FAILURE() << "no error for '" << bad << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(pci_numa_node("ffff:ff:1f.7"), -1);  // well formed, no such device: unknown
}

// The CPU sets of the crew threads that run pieces of one job (never the
// poster: it does not work on the job).
std::vector<V> worker_cpus_of(Crew& crew) {
  struct Seen {
    std::mutex mu;
    std::vector<V> sets;  // mu
    std::atomic<int> ran{0};
    std::thread::id poster = std::this_thread::get_id();
  } seen;
  if (crew.threads() == 0) return {};  // nobody but the poster would run it
  constexpr uint32_t kPieces = 64;
  CrewJob job(
      [](void* c, uint32_t) noexcept {
        auto& s = *static_cast<Seen*>(c);
        V cpus;
        const bool ok = os::thread_cpus(&cpus) == 0 && std::this_thread::get_id() != s.poster;
        {
          std::lock_guard lock(s.mu);
          s.sets.push_back(ok ? cpus : V{-1});
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));  // let other workers join
        s.ran.fetch_add(1);
      },
      &seen, kPieces);
  crew.post(job, kPieces);
  while (seen.ran.load() < static_cast<int>(kPieces)) std::this_thread::yield();
  crew.retire(job);
  return seen.sets;
}

std::vector<V> pool_cpus_of(WorkerPool& pool, int tasks) {
  std::mutex mu;
  std::vector<V> sets;
  TaskGroup group(tasks);
  for (int i = 0; i < tasks; ++i)
    pool.submit([&] {
      V cpus;
      os::thread_cpus(&cpus);
      {
        std::lock_guard lock(mu);
        sets.push_back(cpus);
      }
      group.done();
    });
  group.wait();
  return sets;
}

// Node 0's CPUs this process may use (what its crew binds to on a host with
// several nodes), and single CPUs of it, so that binding must change something
// even where node 0 holds every CPU.
std::vector<V> node0_bindings() {
  V node, usable;
  if (os::read_node_cpus(0, &node) != 0 || os::thread_cpus(&usable) != 0) return {};
  V cpus = crew_cpus(0, {0, 1}, node, usable);  // as if the host had two nodes
  if (cpus.empty()) return {};
  return {cpus, {cpus.front()}, {cpus.back()}};
}

TEST(CopyCrew, ThreadsBoundToANodesCpusRunThere) {
  const auto bindings = node0_bindings();
  if (bindings.empty()) GTEST_SKIP() << "no /sys/devices/system/node/node0/cpulist usable here";
  for (const V& cpus : bindings) {
    Crew crew(3, 0, ThreadAffinity{cpus, &os::bind_thread_to_cpus});
    EXPECT_EQ(crew.cpus(), cpus);
    const auto sets = worker_cpus_of(crew);
    ASSERT_EQ(sets.size(), 64u);
    for (const V& s : sets) EXPECT_EQ(s, cpus);
    WorkerPool pool(3, ThreadAffinity{cpus, &os::bind_thread_to_cpus});
    for (const V& s : pool_cpus_of(pool, 16)) EXPECT_EQ(s, cpus);
  }
}

TEST(CopyCrew, UnboundThreadsKeepTheirCreatorsCpus) {
  V usable;
  ASSERT_EQ(os::thread_cpus(&usable), 0);
  // Created by a thread restricted to one CPU: an unbound crew's threads
  // inherit exactly that (no affinity of their own).
  for (const ThreadAffinity& none : {ThreadAffinity{}, ThreadAffinity{{}, &os::bind_thread_to_cpus}}) {
    std::vector<V> sets;
    std::thread([&] {
      ASSERT_EQ(os::bind_thread_to_cpus({usable.back()}), 0);
      Crew crew(2, 0, none);
      EXPECT_TRUE(crew.cpus().empty());
      sets = worker_cpus_of(crew);
    }).join();
    ASSERT_EQ(sets.size(), 64u);
    for (const V& s : sets) EXPECT_EQ(s, V{usable.back()});
  }
}

// plan_copy_crew on this host's facts, with the options given (Options::parse:
// the environment is read once per process, so these cases do not touch it).
TEST(CopyCrew, PlanFollowsFerryCopyWorkers) {
  V online;
  const bool have_nodes = os::read_online_nodes(&online) == 0;
  V nodes = {-1};
  if (have_nodes) nodes.insert(nodes.end(), online.begin(), online.end());
  for (int node : nodes) {
    const CrewPlan unset = plan_copy_crew(node, Options::parse({}));
    EXPECT_EQ(unset.cpus, host_crew_cpus(node)) << "node " << node;
    EXPECT_EQ(unset.numa_node, unset.cpus.empty() ? -1 : node) << "node " << node;
    const int usable = unset.cpus.empty() ? os::usable_cores() : static_cast<int>(unset.cpus.size());
    EXPECT_EQ(unset.threads, std::clamp(usable, 1, kDefaultThreadCap)) << "node " << node;
    EXPECT_EQ(unset.workers, 0);
    EXPECT_EQ(unset.spin_us, 100);  // the option's default
    const CrewPlan zero = plan_copy_crew(node, Options::parse({{"FERRY_COPY_WORKERS", "0"}}));
    EXPECT_EQ(zero.threads, unset.threads) << "node " << node;
    for (const char* n : {"1", "3", " 7\n", "+5", "1024"}) {
      const CrewPlan set =
          plan_copy_crew(node, Options::parse({{"FERRY_COPY_WORKERS", n}, {"FERRY_COPY_SPIN_US", "0"}}));
      EXPECT_EQ(set.threads, std::stoi(n)) << "FERRY_COPY_WORKERS='" << n << "'";
      EXPECT_EQ(set.workers, std::stoi(n));
      EXPECT_EQ(set.spin_us, 0);
      EXPECT_EQ(set.numa_node, unset.numa_node) << "FERRY_COPY_WORKERS sizes the crew, not where it runs";
      EXPECT_EQ(set.cpus, unset.cpus);
    }
  }
  EXPECT_EQ(plan_copy_crew(-5, Options::parse({})).numa_node, -1);  // any negative node: the default crew
}

TEST(CopyCrew, PlanRefusesBadFerryCopyOptions) {
  for (const char* bad : {"", "two", "-1", "1025", "0x10", "4.0"}) {
    try {
      plan_copy_crew(-1, Options::parse({{"FERRY_COPY_WORKERS", bad}}));
      ADD_FAILURE() << "FERRY_COPY_WORKERS='" << bad << "' was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("FERRY_COPY_WORKERS='" + std::string(bad) + "'"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(plan_copy_crew(-1, Options::parse({{"FERRY_COPY_SPIN_US", "1000001"}})), InvalidArgument);
}

TEST(CopyCrew, CrewsAreTheirPlans) {
  V online;
  V nodes = {-1};
  if (os::read_online_nodes(&online) == 0) nodes.insert(nodes.end(), online.begin(), online.end());
  for (int node : nodes) {
    const CrewPlan plan = plan_copy_crew(node);  // the process's options, as copy_crew reads them
    Crew& crew = copy_crew(node);
    EXPECT_EQ(crew.threads() + 1, plan.threads) << "node " << node;
    EXPECT_EQ(crew.cpus(), plan.cpus) << "node " << node;
    EXPECT_EQ(&crew, &copy_crew(plan.numa_node)) << "node " << node;
  }
}

TEST(CopyCrew, OneCrewPerNodeOnThisHost) {
  V online, usable;
  if (os::read_online_nodes(&online) != 0) GTEST_SKIP() << "kernel without NUMA sysfs";
  ASSERT_EQ(os::thread_cpus(&usable), 0);
  Crew& fallback = copy_crew(-1);
  EXPECT_EQ(&copy_crew(), &fallback);
  EXPECT_EQ(&copy_crew(-5), &fallback);
  EXPECT_TRUE(fallback.cpus().empty()) << "the default crew sets no affinity";
  for (int node : online) {
    Crew& crew = copy_crew(node);
    EXPECT_EQ(&copy_crew(node), &crew) << "a second crew for node " << node;
    V node_cpus;
    ASSERT_EQ(os::read_node_cpus(node, &node_cpus), 0);
    const V want = crew_cpus(node, online, node_cpus, usable);
    EXPECT_EQ(crew.cpus(), want) << "node " << node;
    if (want.empty()) {
      EXPECT_EQ(&crew, &fallback) << "node " << node << " (one-node host or no usable CPU) has its own crew";
    } else {
      EXPECT_NE(&crew, &fallback);
      for (const V& s : worker_cpus_of(crew)) EXPECT_EQ(s, want) << "node " << node;
    }
  }
}

}  // namespace
}  // namespace ferry
