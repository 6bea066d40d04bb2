// save_file.cpp — save_file: the ring, the pipeline, finish (save_file.h).
#include "load/save_file.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "core/worker_pool.h"
#include "load/write_pipeline.h"
#include "os/file.h"
#include "pool/pool.h"

namespace ferry::load {
namespace {

// The ring's slots from a pool, given back in every case.
class Ring {
 public:
  Ring(Pool& pool, size_t count, size_t slot_bytes) : pool_(pool) {
    for (size_t i = 0; i < count; ++i)
      slots_.push_back(static_cast<unsigned char*>(pool.allocate(slot_bytes, os::kDirectIoAlignment)));
  }
  ~Ring() {
    for (unsigned char* p : slots_) {
      try {
        pool_.deallocate(p);
      } catch (...) {  // never: the pointers are the pool's
      }
    }
  }
  const std::vector<unsigned char*>& slots() const { return slots_; }

 private:
  Pool& pool_;
  std::vector<unsigned char*> slots_;
};

void check(const SaveOptions& o) {
  if (o.slot_bytes == 0 || o.slot_bytes % os::kDirectIoAlignment != 0)
    throw InvalidArgument("save: slot_bytes=" + std::to_string(o.slot_bytes) + ": expected a positive multiple of " +
                          std::to_string(os::kDirectIoAlignment));
  if (o.slots < 1 || o.slots > 1024)
    throw InvalidArgument("save: slots=" + std::to_string(o.slots) + ": expected 1..1024");
  if (o.writers < 1 || o.writers > 64)
    throw InvalidArgument("save: writers=" + std::to_string(o.writers) + ": expected 1..64");
}

}  // namespace

SaveStats save_file(AtomicFile& file, const FileLayout& layout, Pool& ring_pool, DeviceReads* device,
                    const SaveOptions& o, const std::vector<std::string>& like) {
  const auto start = std::chrono::steady_clock::now();
  SaveStats st;
  try {
    check(o);
    st.bytes = layout.total();
    st.direct = file.direct();
    if (st.bytes > 0) {
      if (o.reserve) file.reserve(st.direct ? (st.bytes + os::kDirectIoAlignment - 1) / os::kDirectIoAlignment *
                                                  os::kDirectIoAlignment
                                            : st.bytes);
      const uint64_t chunks = (st.bytes + o.slot_bytes - 1) / o.slot_bytes;
      const size_t count = static_cast<size_t>(std::min<uint64_t>(o.slots, chunks));
      Ring ring(ring_pool, std::max<size_t>(count, 1), o.slot_bytes);
      LayoutSource source(layout, ring.slots(), o.slot_bytes, device);
      const int writers = static_cast<int>(std::min<size_t>(static_cast<size_t>(o.writers), ring.slots().size()));
      WorkerPool workers(writers);
      const WriteStats w = run_write_pipeline(file, 0, st.bytes, source, workers, writers);
      st.writes = w.writes;
      st.copied_bytes = source.copied_bytes();
    }
    st.direct = st.direct && file.direct();
    st.notes = file.notes();
    file.finish(st.bytes, like);
  } catch (...) {
    file.abort();
    throw;
  }
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return st;
}

}  // namespace ferry::load
