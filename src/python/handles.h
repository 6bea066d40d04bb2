// handles.h — the C++ objects behind ferry._ferry's Python classes.
#pragma once

#include <memory>

#include "pool/pool.h"

namespace ferry::python {

struct PoolHandle {
  std::shared_ptr<Pool> pool;
  bool pinned = false;
  int device = -1;
};

}  // namespace ferry::python
