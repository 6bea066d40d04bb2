// host_target.h — a pipeline Target whose destinations are host memory: each
// copy is a memcpy done at once, so slots are free as soon as they are
// filled. It runs the whole pipeline (threads, slot ring, O_DIRECT, errors)
// with no GPU, which is how the core tests exercise it, and loads file ranges
// into host buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "load/pipeline.h"

namespace ferry::load {

class HostTarget final : public Target {
 public:
  HostTarget(size_t slot_count, size_t slot_bytes);  // slot_bytes: a multiple of 4 KiB
  ~HostTarget() override;

  size_t slot_count() const override { return slots_.size(); }
  size_t slot_bytes() const override { return slot_bytes_; }
  unsigned char* slot(size_t i) const override { return slots_[i]; }
  void wait_slot_free(size_t) override {}
  void copy_out(size_t i, const unsigned char* src, uintptr_t dst, size_t n) override;
  void slot_filled(size_t) override {}
  void finish() override {}
  void abort() noexcept override {}

 private:
  size_t slot_bytes_;
  std::vector<unsigned char*> slots_;
};

}  // namespace ferry::load
