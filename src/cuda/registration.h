// registration.h — an explicit, long-lived pin of a user buffer
// (ferry.register / ferry_register): copies from or to it then go straight to
// the DMA engine.
//
// The registered range is the buffer widened to 2 MiB boundaries when that
// widened range is mapped (so no huge page is pinned in part, which would make
// the kernel split it), else to page boundaries.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ferry::cuda {

class Registration {
 public:
  // Throws InvalidArgument (NULL, size 0, unmapped range), CudaError (e.g. the
  // range overlaps another registration), NoDevice.
  Registration(void* ptr, size_t bytes, int device);
  ~Registration();  // unregisters; never throws
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;

  void* base() const noexcept { return base_; }        // what was registered
  size_t registered_bytes() const noexcept { return bytes_; }

 private:
  void* base_ = nullptr;
  size_t bytes_ = 0;
  int device_ = 0;
  uint64_t generation_ = 0;  // fork_generation() at creation: a forked child leaves it alone
};

}  // namespace ferry::cuda
