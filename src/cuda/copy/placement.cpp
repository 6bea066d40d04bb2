// placement.cpp — an engine's NUMA node, crew and staging memory (placement.h).
#include "cuda/copy/placement.h"

#include <algorithm>

#include "copy/copy_crew.h"
#include "pool/numa_home.h"
#include "core/crew.h"
#include "core/thread_counts.h"
#include "cuda/device.h"
#include "cuda/pinned_pool.h"
#include "os/sysfs.h"
#include "pool/pool.h"

namespace ferry::cuda {

EnginePlacement place_engine(int device) {
  EnginePlacement p;
  p.numa_node = numa_home(pci_bus_id(device));
  p.crew = &copy_crew(p.numa_node);
  PoolOptions staging;
  staging.chunk_bytes = 64u << 20;
  staging.numa_node = p.numa_node >= 0 ? p.numa_node : kNumaNeverBind;  // one node: bind nothing
  p.staging = make_pinned_pool(staging, device);
  return p;
}

int stream_worker_count(int requested, int profile_workers, const Crew& crew) {
  const int w = requested > 0 ? requested : profile_workers;
  return w > 0 ? w : default_thread_count(os::cpus_or_usable(crew.cpus()));
}

}  // namespace ferry::cuda
