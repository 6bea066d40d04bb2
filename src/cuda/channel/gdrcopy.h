// gdrcopy.h — GDRCopy as an optional backend for channel writes, found at run
// time: libgdrapi.so.2 is dlopen'ed and /dev/gdrdrv checked; GDRCopy is never a
// build dependency.
//
// GDRCopy maps GPU memory (BAR1) into the CPU's address space through its
// gdrdrv kernel module; a write is then a CPU store, with no GPU kernel in the
// path. Where gdrdrv is absent (our Firecracker VM loads no modules, and a CPU
// mmap of a GPU dma-buf fails there with errno 524) gdrcopy_status() says why.
//
// Invariants: the library is opened once per process and never closed; a
// GdrcopyWriter pins whole allocations, each once (keyed by the driver's
// process-unique buffer id, so a freed and reused address never hits a stale
// mapping), and unpins them on eviction (at most kMaxMappings) or destruction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ferry::cuda {

struct GdrcopyStatus {
  bool available = false;
  std::string reason;  // why not, or what was found ("libgdrapi.so.2 2.4, gdrdrv 2.4")
};

// Probed once per process, then cached. Never throws.
const GdrcopyStatus& gdrcopy_status() noexcept;

// A device allocation as the CUDA driver describes it.
struct DeviceAllocation {
  uintptr_t start = 0;
  size_t size = 0;
  unsigned long long buffer_id = 0;
};

// Writes host bytes into device memory through GDRCopy mappings.
// Locking: mutex_ guards mappings_; the copy itself runs outside it (a
// mapping in use is kept alive by its shared_ptr even if evicted meanwhile).
class GdrcopyWriter {
 public:
  // Throws NotSupported with gdrcopy_status().reason when GDRCopy is missing.
  GdrcopyWriter();
  ~GdrcopyWriter();
  GdrcopyWriter(const GdrcopyWriter&) = delete;
  GdrcopyWriter& operator=(const GdrcopyWriter&) = delete;

  // Copies n bytes to dst, which lies in `allocation`. False when the
  // allocation cannot be pinned (the caller uses the kernel path instead;
  // the failure is remembered). The bytes are in GPU memory when this returns
  // (the mapping is read back once after the write: PCIe read completions do
  // not pass posted writes).
  bool write(const DeviceAllocation& allocation, void* dst, const void* src, size_t n);

 private:
  struct Mapping;
  std::shared_ptr<Mapping> mapping_for(const DeviceAllocation& allocation);

  static constexpr size_t kMaxMappings = 64;
  void* gdr_ = nullptr;  // gdr_t
  std::mutex mutex_;
  std::vector<std::shared_ptr<Mapping>> mappings_;  // most recently used last
};

}  // namespace ferry::cuda
