// write_pipeline.h — a save's threads, the loader pipeline's twin
// (load/pipeline.h): the caller's thread fills a small ring of staging slots
// in file order through a Source (load/layout_source.h: host bytes by
// memcpy, device bytes queued to a DeviceReads, src/cuda/load/file_writer.h),
// while writer threads write the filled slots into an AtomicFile. No CUDA
// here: the Source is the only way in. No Python either: nothing here calls
// back into the interpreter.
//
// Per slot (caller's thread, then a writer):
//   take the oldest slot (core/slot_ring.h) -> if it is in flight, wait until
//   its write has landed -> Source::fill(slot, file offset, n) -> hand it to
//   a writer -> Source::wait_filled(slot) (a device copy still on its way) ->
//   AtomicFile::write (O_DIRECT: the last write padded to 4 KiB, cut by
//   finish; a refused direct write: the file's buffered fallback,
//   load/atomic_file.h) -> landed: the slot may be filled again.
//
// Host memory: the Source's slots only, whatever the file's size.
//
// Errors: the first failure (a Source error, a write error) stops the run:
// no slot is filled or written after it; the writers are waited for,
// Source::abort() is called, then the error is thrown, naming the file and
// the byte range. The file's content is then undefined (the caller aborts it).
//
// Locking: WriteRun::mu guards the writers' queue, the slots' "landed" flags,
// the first error and the count of running writers (see write_pipeline.cpp);
// no system call and no Source call under it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ferry {
class WorkerPool;
}

namespace ferry::load {

class AtomicFile;

// Where a save's bytes come from. slot_count/slot_bytes/slot are asked by any
// thread; fill and abort only on the run's (caller's) thread; wait_filled by
// the writer that writes the slot.
class Source {
 public:
  virtual ~Source() = default;
  virtual size_t slot_count() const = 0;
  virtual size_t slot_bytes() const = 0;  // a multiple of os::kDirectIoAlignment
  // The bytes of slot i, asked after each fill(i, ...): the slot's buffer (4
  // KiB aligned), or memory the Source already holds the bytes in (4 KiB
  // aligned, readable to the end of its last page), valid until the slot
  // lands. Its first align_up(n) bytes are written when the file is O_DIRECT.
  virtual const unsigned char* slot(size_t i) const = 0;
  // Puts the file's bytes [file_offset, file_offset + n) in slot i, or queues
  // the copies that will (then wait_filled waits for them). Called in file
  // order, never for a slot whose earlier write has not landed.
  virtual void fill(size_t i, uint64_t file_offset, size_t n) = 0;
  // On a writer, before slot i's write: returns once its fill is complete.
  virtual void wait_filled(size_t) {}
  // After a failure, once every writer returned (before the error is thrown).
  virtual void abort() noexcept {}
};

struct WriteStats {
  uint64_t bytes = 0;           // bytes of the range written (padding not counted)
  uint64_t writes = 0;
  double seconds = 0;
};

// Writes bytes [offset, offset + bytes) of `file` from `source` on `pool`
// (at least `writers` threads). Blocks until done; throws the first error.
WriteStats run_write_pipeline(AtomicFile& file, uint64_t offset, uint64_t bytes, Source& source, WorkerPool& pool,
                              int writers);

}  // namespace ferry::load
