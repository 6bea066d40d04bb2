// probe_common.h — what every probe needs: exit on a CUDA error, and the
// median time of a call after warm-up runs.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

namespace probe {

using Clock = std::chrono::steady_clock;

inline void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Median microseconds of `reps` calls of f, after `warmups` untimed ones.
inline double median_us(int reps, const std::function<void()>& f, int warmups = 5) {
  for (int i = 0; i < warmups; ++i) f();
  std::vector<double> t(reps);
  for (auto& x : t) {
    auto a = Clock::now();
    f();
    x = std::chrono::duration<double, std::micro>(Clock::now() - a).count();
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace probe
