// affinity.h — which CPUs a thread runs on: sched_getaffinity and
// sched_setaffinity of the calling thread, for CPU ids up to kMaxCpuId
// (sysfs.h), with sets sized for them (a cpu_set_t holds only 1024).
//
// Like the rest of src/os: 0 or an errno value, outputs set only on success,
// nothing thrown (but std::bad_alloc from a vector), no policy.
#pragma once

#include <vector>

namespace ferry::os {

// The CPUs this thread may run on, sorted.
int thread_cpus(std::vector<int>* cpus);

// Restricts this thread to `cpus` (ids 0 .. kMaxCpuId). The kernel keeps the
// CPUs of the list the thread's cpuset allows; EINVAL when none is, or the
// list is empty or names an id out of range. Threads the caller starts later
// inherit the set.
int bind_thread_to_cpus(const std::vector<int>& cpus) noexcept;

}  // namespace ferry::os
