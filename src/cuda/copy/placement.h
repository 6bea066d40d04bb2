// placement.h — where an engine serves its device from, fixed at creation:
// the host NUMA node nearest the GPU (pool/numa_home.h), that node's crew of
// copy threads (copy/copy_crew.h, shared with other engines of the node) and
// pinned staging memory bound to the node. One-node hosts: node -1, one crew,
// no binding.
#pragma once

#include <memory>

namespace ferry {
class Crew;
class Pool;
}  // namespace ferry

namespace ferry::cuda {

struct EnginePlacement {
  int numa_node = -1;             // -1: none (one node, or unknown)
  Crew* crew = nullptr;           // the node's crew, started (its options checked)
  std::unique_ptr<Pool> staging;  // pinned pool of the lanes' slots and eager areas
};

// Preconditions: `device` is current. Throws like make_pinned_pool.
EnginePlacement place_engine(int device);

// Threads of the stream-ordered pipeline, per direction: `requested` (the
// engine option) if > 0, else `profile_workers` if > 0, else one per CPU of
// `crew` (or per usable core when the crew has no CPU list), capped.
int stream_worker_count(int requested, int profile_workers, const Crew& crew);

}  // namespace ferry::cuda
