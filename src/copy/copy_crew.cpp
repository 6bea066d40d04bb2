// copy_crew.cpp — the process-wide copy crew.
#include "copy/copy_crew.h"

#include <algorithm>
#include <mutex>

#include "core/crew.h"
#include "core/error.h"
#include "core/fork.h"
#include "core/options.h"
#include "os/sysfs.h"

namespace ferry {

Crew& copy_crew() {
  static std::mutex mu;  // guards crew and generation
  static const bool held = (hold_across_fork(&mu), true);  // a forked child makes its own crew
  (void)held;
  static Crew* crew = nullptr;
  static uint64_t generation = 0;
  std::lock_guard lock(mu);
  if (crew && generation == fork_generation()) return *crew;
  const Options& o = options();
  int64_t threads = o.integer("FERRY_COPY_WORKERS");
  const int64_t spin = o.integer("FERRY_COPY_SPIN_US");
  if (threads < 0 || threads > 1024)
    throw InvalidArgument("FERRY_COPY_WORKERS=" + std::to_string(threads) + ": expected 0 (one per core) .. 1024");
  if (spin < 0 || spin > 1000000)
    throw InvalidArgument("FERRY_COPY_SPIN_US=" + std::to_string(spin) + ": expected 0 .. 1000000");
  if (threads == 0) threads = std::clamp(os::usable_cores(), 1, 16);
  // Never destroyed: the threads run for the life of the process (a crew left
  // behind by fork() is leaked on purpose, see copy_crew.h).
  crew = new Crew(static_cast<int>(threads) - 1, static_cast<int>(spin));
  generation = fork_generation();
  return *crew;
}

}  // namespace ferry
