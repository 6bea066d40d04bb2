// copy_crew.cpp — the process-wide copy crews, one per NUMA node in use.
#include "copy/copy_crew.h"

#include <algorithm>
#include <map>
#include <mutex>

#include "core/crew.h"
#include "core/error.h"
#include "core/fork.h"
#include "core/options.h"
#include "core/thread_counts.h"
#include "pool/numa_home.h"
#include "os/affinity.h"
#include "os/sysfs.h"

namespace ferry {
std::vector<int> host_crew_cpus(int numa_node) {
  if (numa_node < 0) return {};
  std::vector<int> online, node, usable;
  if (os::read_online_nodes(&online) != 0 || os::read_node_cpus(numa_node, &node) != 0 ||
      os::thread_cpus(&usable) != 0)
    return {};
  return crew_cpus(numa_node, online, node, usable);
}

std::vector<int> crew_cpus(int numa_node, const std::vector<int>& online_nodes, const std::vector<int>& node_cpus,
                           const std::vector<int>& usable_cpus) {
  if (numa_home(numa_node, online_nodes) < 0) return {};
  std::vector<int> out;
  for (int c : node_cpus)
    if (std::find(usable_cpus.begin(), usable_cpus.end(), c) != usable_cpus.end()) out.push_back(c);
  return out;
}

CrewPlan plan_copy_crew(int numa_node) { return plan_copy_crew(numa_node, options()); }

CrewPlan plan_copy_crew(int numa_node, const Options& o) {
  const int64_t workers = o.integer("FERRY_COPY_WORKERS");
  const int64_t spin = o.integer("FERRY_COPY_SPIN_US");
  if (workers < 0 || workers > kMaxThreads)
    throw InvalidArgument("FERRY_COPY_WORKERS=" + std::to_string(workers) + ": expected 0 (one per core) .. 1024");
  if (spin < 0 || spin > 1000000)
    throw InvalidArgument("FERRY_COPY_SPIN_US=" + std::to_string(spin) + ": expected 0 .. 1000000");
  CrewPlan plan;
  plan.workers = static_cast<int>(workers);
  plan.spin_us = static_cast<int>(spin);
  plan.cpus = host_crew_cpus(numa_node < 0 ? -1 : numa_node);
  plan.numa_node = plan.cpus.empty() ? -1 : numa_node;
  plan.threads = workers > 0 ? plan.workers
                             : default_thread_count(plan.numa_node < 0 ? os::usable_cores()
                                                                       : os::cpus_or_usable(plan.cpus));
  return plan;
}

namespace {

// The process's crews. Never destroyed: the threads run for the life of the
// process, and crews left behind by fork() are leaked on purpose (see
// copy_crew.h).
struct Crews {
  std::mutex mu;
  std::map<int, Crew*> by_node;  // mu: requested node -> its crew (nodes served by the default crew map to it)
  uint64_t generation = 0;       // mu: fork_generation() the crews belong to
};

Crews& crews() {
  static auto* c = new Crews;
  return *c;
}

// A forked child makes its own crews: the lock is held across fork(),
// registered at load (fork.h says why not on first use).
[[maybe_unused]] const bool g_crews_held_across_fork = (hold_across_fork(&crews().mu), true);

// Forgets the crews of the parent (whose threads a forked child does not have).
void adopt_generation_locked(Crews& c) {
  if (c.generation == fork_generation()) return;
  c.by_node.clear();
  c.generation = fork_generation();
}

}  // namespace

Crew& copy_crew(int numa_node) {
  Crews& c = crews();
  if (numa_node < 0) numa_node = -1;
  {
    std::lock_guard lock(c.mu);
    adopt_generation_locked(c);
    if (auto it = c.by_node.find(numa_node); it != c.by_node.end()) return *it->second;
  }
  // The options and the host's facts are read without the lock (system calls).
  CrewPlan plan = plan_copy_crew(numa_node);
  const int home = plan.numa_node;
  const ThreadAffinity affinity{std::move(plan.cpus), &os::bind_thread_to_cpus};
  std::lock_guard lock(c.mu);
  adopt_generation_locked(c);  // a fork() between the two locks
  auto made = c.by_node.find(home);
  if (made == c.by_node.end())  // the first crew of this node: its threads start here, once
    made = c.by_node.emplace(home, new Crew(plan.threads - 1, plan.spin_us, affinity)).first;
  c.by_node[numa_node] = made->second;
  return *made->second;
}

}  // namespace ferry
