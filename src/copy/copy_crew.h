// copy_crew.h — the process's crews of copy threads, shared by the engines of
// every device (one host budget: two GPUs do not start two sets of threads on
// the same cores), one per NUMA node that serves a GPU.
//
// copy_crew(-1), and copy_crew(N) on a host with one online NUMA node, is the
// default crew: one per process, its threads wherever the process may run, no
// affinity set. On a host with several nodes, copy_crew(N) is node N's crew:
// its threads are bound (sched_setaffinity) to the CPUs of N that this thread
// may use (/sys/devices/system/node/nodeN/cpulist within sched_getaffinity),
// so a GPU's staging memcpys run beside its staging memory (pool/numa_home.h).
// A node none of whose CPUs may be used (numactl bound the process to another)
// gets the default crew.
//
// Size of each crew: FERRY_COPY_WORKERS threads if set, else one per usable
// core (of its node; of the process for the default crew), at most 16,
// counting the calling thread (so the crew has one fewer). Idle threads spin
// FERRY_COPY_SPIN_US before they sleep. plan_copy_crew() is that decision,
// made without starting a thread: copy_crew() makes the crew it plans, and
// `ferry doctor` asks it through the Python binding (ferry._ferry.plan_copy_crew,
// python/ferry/facts/copy_engine.py), so the two cannot disagree. A crew is
// made on first use and runs for the life of the process.
//
// After fork() the child has none of the parent's threads: its first call
// makes new crews, and the parent's are left alone (their std::thread objects
// cannot be joined or destroyed in the child).
#pragma once

#include <vector>

namespace ferry {

class Crew;
class Options;

// Throws InvalidArgument if the FERRY_COPY_* options are bad.
Crew& copy_crew(int numa_node = -1);

// The crew copy_crew(numa_node) makes, by the rules above; starts nothing.
struct CrewPlan {
  int threads = 1;        // counting the calling thread: the crew starts threads - 1
  int numa_node = -1;     // the node its threads are bound to; -1: the default crew
  std::vector<int> cpus;  // the CPUs they bind to (host_crew_cpus); empty: not bound
  int workers = 0;        // FERRY_COPY_WORKERS as parsed; 0: one per usable core
  int spin_us = 0;        // FERRY_COPY_SPIN_US
};

// From options() and this host's facts (sysfs, sched_getaffinity). Throws
// InvalidArgument if the options are bad, as copy_crew() does.
CrewPlan plan_copy_crew(int numa_node);
// From `options` (Options::parse, for tests) and this host's facts.
CrewPlan plan_copy_crew(int numa_node, const Options& options);

// crew_cpus() on this host's facts (sysfs, sched_getaffinity): the CPUs a
// thread serving node `numa_node` binds to; empty (no binding) for -1, a
// one-node host, or facts that cannot be read. The checkpoint loader's
// readers bind there too (cuda/load/file_loader.h).
std::vector<int> host_crew_cpus(int numa_node);

// The CPUs node `numa_node`'s crew binds to, from the host's facts: the
// node's CPUs that are in `usable_cpus`, when `online_nodes` has several
// nodes and `numa_node` is one of them; empty (the default crew) otherwise.
std::vector<int> crew_cpus(int numa_node, const std::vector<int>& online_nodes, const std::vector<int>& node_cpus,
                           const std::vector<int>& usable_cpus);

}  // namespace ferry
