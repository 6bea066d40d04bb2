// write_pipeline.h — a save's threads, the loader pipeline's twin
// (load/pipeline.h): the caller's thread fills a small ring of staging slots
// in file order through a Source (Python's save: GPU bytes by copy_many, CPU
// bytes by memmove, python/ferry/torch/save.py), while writer threads pwrite
// the filled slots. No CUDA here: the Source is the only way in.
//
// Per slot (caller's thread, then a writer):
//   take the oldest slot (core/slot_ring.h) -> if it is in flight, wait until
//   its write has landed -> Source::fill(slot, file offset, n) -> hand it to
//   a writer -> pwrite (O_DIRECT: the last write padded to 4 KiB; the caller
//   cuts the file to its length) -> landed: the slot may be filled again.
//
// O_DIRECT: the caller passes its descriptor and whether it is O_DIRECT. A
// direct write the file system refuses (EINVAL) switches the file to
// buffered writes for good (the remembered fallback): the first writer
// refused opens the file again without O_DIRECT (by path) and every write
// from then on goes through that descriptor, which the caller receives in
// WriteStats::buffered_fd (it owns it from then on).
//
// Host memory: the Source's slots only, whatever the file's size.
//
// Errors: the first failure (a Source error, a write error) stops the run:
// no slot is filled or written after it; the writers are waited for,
// Source::abort() is called, then the error is thrown, naming the file and
// the byte range. An error that is not a ferry::Error (a Python exception
// from a Python Source) is rethrown as it is. The file's content is then
// undefined (the caller removes it).
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

// Where a save's bytes come from. slot_count/slot_bytes/slot are asked by any
// thread; fill and abort only on the run's (caller's) thread.
class Source {
 public:
  virtual ~Source() = default;
  virtual size_t slot_count() const = 0;
  virtual size_t slot_bytes() const = 0;  // a multiple of os::kDirectIoAlignment
  // The bytes of slot i, asked after each fill(i, ...): the slot's buffer (4
  // KiB aligned), or memory the Source already holds the bytes in (a
  // snapshot's), valid until the slot lands. Its first align_up(n) bytes
  // are written when the file is O_DIRECT.
  virtual const unsigned char* slot(size_t i) const = 0;
  // Puts the file's bytes [file_offset, file_offset + n) in slot i. Called in
  // file order, never for a slot whose earlier write has not landed.
  virtual void fill(size_t i, uint64_t file_offset, size_t n) = 0;
  // After a failure, once every writer returned (before the error is thrown).
  virtual void abort() noexcept {}
};

// The file a run writes: its bytes [offset, offset + bytes) are written.
struct WriteFile {
  std::string name;      // for messages (the final name, not the temporary one)
  std::string path;      // the file itself: opened again for the buffered fallback
  int fd = -1;           // the caller's descriptor (it stays the caller's)
  bool direct = false;   // fd is O_DIRECT
  uint64_t offset = 0;   // first byte to write
  uint64_t bytes = 0;    // how many
};

struct WriteStats {
  uint64_t bytes = 0;           // bytes of the range written (padding not counted)
  uint64_t writes = 0, direct_writes = 0;
  int buffered_fd = -1;         // the fallback's descriptor (the caller closes it), or -1
  double seconds = 0;
  std::vector<std::string> notes;  // fallbacks taken
};

// Writes the file's range from `source` on `pool` (at least `writers`
// threads). Blocks until done; throws the first error.
WriteStats run_write_pipeline(const WriteFile& file, Source& source, WorkerPool& pool, int writers);

}  // namespace ferry::load
