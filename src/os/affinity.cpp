// affinity.cpp — sched_getaffinity / sched_setaffinity with dynamically sized sets.
#include "os/affinity.h"

#include <sched.h>

#include <cerrno>
#include <memory>

#include "os/sysfs.h"

namespace ferry::os {
namespace {

struct CpuSet {
  explicit CpuSet(int cpus) : count(cpus), set(CPU_ALLOC(cpus)), bytes(CPU_ALLOC_SIZE(cpus)) {
    if (set) CPU_ZERO_S(bytes, set);
  }
  ~CpuSet() {
    if (set) CPU_FREE(set);
  }
  CpuSet(const CpuSet&) = delete;
  CpuSet& operator=(const CpuSet&) = delete;
  int count;
  cpu_set_t* set;
  size_t bytes;
};

}  // namespace

int thread_cpus(std::vector<int>* cpus) {
  // The kernel refuses (EINVAL) a set smaller than its own CPU mask: grow it.
  for (int n = 1024; n <= kMaxCpuId + 1; n *= 2) {
    CpuSet s(n);
    if (!s.set) return ENOMEM;
    if (::sched_getaffinity(0, s.bytes, s.set) != 0) {
      if (errno == EINVAL) continue;
      return errno;
    }
    std::vector<int> out;
    for (int i = 0; i < n; ++i)
      if (CPU_ISSET_S(i, s.bytes, s.set)) out.push_back(i);
    *cpus = std::move(out);
    return 0;
  }
  return EINVAL;
}

int bind_thread_to_cpus(const std::vector<int>& cpus) noexcept {
  if (cpus.empty()) return EINVAL;
  int top = 0;
  for (int c : cpus) {
    if (c < 0 || c > kMaxCpuId) return EINVAL;
    if (c > top) top = c;
  }
  CpuSet s(top + 1);
  if (!s.set) return ENOMEM;
  for (int c : cpus) CPU_SET_S(c, s.bytes, s.set);
  return ::sched_setaffinity(0, s.bytes, s.set) == 0 ? 0 : errno;
}

}  // namespace ferry::os
