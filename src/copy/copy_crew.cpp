// copy_crew.cpp — the process-wide copy crew.
#include "copy/copy_crew.h"

#include <unistd.h>

#include <algorithm>
#include <mutex>

#include "core/crew.h"
#include "core/error.h"
#include "core/options.h"
#include "os/sysfs.h"

namespace ferry {

Crew& copy_crew() {
  static std::mutex mu;  // guards crew and owner
  static Crew* crew = nullptr;
  static pid_t owner = 0;
  std::lock_guard lock(mu);
  const pid_t pid = getpid();
  if (crew && owner == pid) return *crew;
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
  owner = pid;
  return *crew;
}

}  // namespace ferry
