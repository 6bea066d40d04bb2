// layout_source.h — a save's Source (load/write_pipeline.h) over the file's
// layout as the caller describes it: the header bytes, then each tensor's
// bytes in file order as (address, bytes, device), device -1 for host
// memory. Python describes (python/ferry/torch/save.py); this fills.
//
// Per slot, in file order: header and host bytes by memcpy on the caller's
// thread; device bytes are queued to a DeviceReads (the CUDA side,
// src/cuda/load/file_writer.h: the copy engine on a stream ordered after the
// caller's), and the slot's writer waits for them (wait_filled) before its
// write. A slot that lies wholly in one host part whose memory there is 4 KiB
// aligned (a snapshot laid out as its file, a large CPU tensor) is written
// straight from that memory: nothing copied.
//
// Ownership: the layout's header is copied in; the parts' memory is the
// caller's for the whole run (the tensors it saves); the slots are the
// caller's (SaveRing), 4 KiB aligned, slot_bytes each.
//
// Locking: none of its own; fill/abort on the run's thread, wait_filled on
// the slot's writer after the pipeline handed the slot over (its queue's
// mutex orders the two).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "load/write_pipeline.h"

namespace ferry::load {

// One tensor's bytes: host memory (device < 0) or memory of CUDA device `device`.
struct FilePart {
  uintptr_t address = 0;
  uint64_t bytes = 0;
  int device = -1;
};

struct FileLayout {
  std::string header;            // the file's first bytes
  std::vector<FilePart> parts;   // the rest of the file, in order
  uint64_t total() const;        // header + every part
};

// One device->host copy of a slot's fill.
struct DeviceCopy {
  int device = -1;
  void* dst = nullptr;       // in the slot (pinned memory)
  const void* src = nullptr; // device memory
  size_t bytes = 0;
};

// The device side of a save's fills (CUDA; the Source stays CUDA-free).
class DeviceReads {
 public:
  virtual ~DeviceReads() = default;
  // Queues slot `slot`'s copies (the run's thread); returns without waiting.
  virtual void read(size_t slot, std::span<const DeviceCopy> copies) = 0;
  // Returns once slot `slot`'s queued copies are done (a writer thread);
  // throws their error.
  virtual void wait(size_t slot) = 0;
  // Waits for every queued copy, errors ignored. Never throws.
  virtual void abort() noexcept = 0;
};

class LayoutSource final : public Source {
 public:
  // Throws InvalidArgument for a device part without `device` (no DeviceReads).
  LayoutSource(const FileLayout& layout, std::vector<unsigned char*> slots, size_t slot_bytes, DeviceReads* device);

  size_t slot_count() const override { return slots_.size(); }
  size_t slot_bytes() const override { return slot_bytes_; }
  const unsigned char* slot(size_t i) const override { return at_[i]; }
  void fill(size_t i, uint64_t file_offset, size_t n) override;
  void wait_filled(size_t i) override;
  void abort() noexcept override;

  uint64_t copied_bytes() const noexcept { return copied_; }  // host bytes memcpy'd (not viewed)

 private:
  const unsigned char* view_of(uint64_t file_offset, size_t n) const;

  const FileLayout& layout_;
  std::vector<uint64_t> starts_;        // file offset of each part
  std::vector<unsigned char*> slots_;
  std::vector<const unsigned char*> at_;  // where slot i's bytes are since its fill
  std::vector<char> on_device_;         // slot i's fill queued device copies
  size_t slot_bytes_;
  DeviceReads* device_;
  size_t part_ = 0;                     // the part holding the next file byte (fill's cursor)
  std::vector<DeviceCopy> copies_;      // one fill's device copies (reused)
  uint64_t copied_ = 0;
};

}  // namespace ferry::load
