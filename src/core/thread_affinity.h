// thread_affinity.h — where the threads of a Crew or WorkerPool run: each
// calls bind(cpus) as it starts, before its first task. The core makes no
// system call itself: src/copy passes os::bind_thread_to_cpus (src/os).
//
// Binding is a placement hint: a thread whose bind fails runs wherever its
// creator could, and the work is the same.
#pragma once

#include <vector>

namespace ferry {

struct ThreadAffinity {
  using BindFn = int (*)(const std::vector<int>& cpus) noexcept;  // 0 or an errno value
  std::vector<int> cpus;  // empty: not bound (the threads inherit their creator's CPUs)
  BindFn bind = nullptr;

  bool bound() const noexcept { return bind && !cpus.empty(); }
  void apply() const noexcept {
    if (bound()) bind(cpus);
  }
};

}  // namespace ferry
