// test_engine.h — the copy engine the GPU tests copy through: device 0, its
// options from the environment (FERRY_*), made on first use, one for the test
// binary. (copy_engine_test.cpp keeps its own: it sets options of its own.)
#pragma once

#include "cuda/copy/copy_engine.h"

namespace ferry::cuda::testing {

inline CopyEngine& engine() {
  static CopyEngine e(CopyEngineOptions::from_environment(0));
  return e;
}

}  // namespace ferry::cuda::testing
