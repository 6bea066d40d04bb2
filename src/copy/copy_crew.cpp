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
                             : std::clamp(plan.numa_node < 0 ? os::usable_cores() : static_cast<int>(plan.cpus.size()),
                                          1, kDefaultThreadCap);
  return plan;
}

Crew& copy_crew(int numa_node) {
  static std::mutex mu;  // guards crews and generation
  static const bool held = (hold_across_fork(&mu), true);  // a forked child makes its own crews
  (void)held;
  // Requested node -> its crew (nodes served by the default crew map to it).
  // Never destroyed: the threads run for the life of the process, and crews
  // left behind by fork() are leaked on purpose (see copy_crew.h).
  static auto* crews = new std::map<int, Crew*>();
  static uint64_t generation = 0;
  if (numa_node < 0) numa_node = -1;
  {
    std::lock_guard lock(mu);
    if (generation != fork_generation()) {
      crews->clear();
      generation = fork_generation();
    }
    if (auto it = crews->find(numa_node); it != crews->end()) return *it->second;
  }
  // The options and the host's facts are read without the lock (system calls).
  CrewPlan plan = plan_copy_crew(numa_node);
  const int home = plan.numa_node;
  const ThreadAffinity affinity{std::move(plan.cpus), &os::bind_thread_to_cpus};
  std::lock_guard lock(mu);
  if (generation != fork_generation()) {  // a fork() between the two locks
    crews->clear();
    generation = fork_generation();
  }
  auto made = crews->find(home);
  if (made == crews->end())  // the first crew of this node: its threads start here, once
    made = crews->emplace(home, new Crew(plan.threads - 1, plan.spin_us, affinity)).first;
  (*crews)[numa_node] = made->second;
  return *made->second;
}

}  // namespace ferry
