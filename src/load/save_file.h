// save_file.h — one file of a save, whole: its layout (layout_source.h)
// through a ring of slots (write_pipeline.h) into an AtomicFile
// (atomic_file.h), then finished (cut, mode and owner, fsync, closed; not
// yet published: the caller renames it under its path's lock). Python hands
// the layout over and gets the finished file back: no Python call per slot,
// no Python object touched while this runs.
//
// The ring: min(slots, ceil(file / slot_bytes)) slots of slot_bytes from
// `ring_pool` (pinned where device bytes are copied into it, pageable
// otherwise), 4 KiB aligned, given back before this returns. Host memory
// the save adds: the ring, whatever the file's size.
//
// Errors: the first failure aborts the file (its temporary file removed) and
// is thrown, naming the file and the byte range.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "load/atomic_file.h"
#include "load/layout_source.h"

namespace ferry {
class Pool;
class WorkerPool;
}  // namespace ferry

namespace ferry::load {

struct SaveOptions {
  // 8 slots of 32 MiB: a slot is one write; 4 writers keep 4 of them in flight
  // (O_DIRECT needs queue depth to reach a disk's speed), while the caller's
  // thread fills the next ones (a GPU slot: ~0.6 ms at 55 GB/s; the disk: ~16 ms).
  size_t slot_bytes = size_t{32} << 20;
  size_t slots = 8;
  int writers = 4;
  bool reserve = true;  // fallocate the file's blocks first (AtomicFile::reserve)
};

struct SaveStats {
  uint64_t bytes = 0;          // the file's
  uint64_t writes = 0;
  uint64_t copied_bytes = 0;   // host bytes memcpy'd into slots (the rest: viewed, or from a device)
  bool direct = false;         // every write went O_DIRECT
  double seconds = 0;          // write and fsync
  std::vector<std::string> notes;
};

SaveStats save_file(AtomicFile& file, const FileLayout& layout, Pool& ring_pool, DeviceReads* device,
                    const SaveOptions& options, const std::vector<std::string>& like);

}  // namespace ferry::load
