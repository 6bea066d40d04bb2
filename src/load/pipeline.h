// pipeline.h — a load's threads: reads of a ReadPlan done by several reader
// threads into a small ring of staging slots, each slot's copies handed to a
// Target (device memory through DMA: cuda/load/file_loader.cpp; host memory:
// host_target.h), overlapped with the next reads. No CUDA here: the Target is
// the only way out.
//
// Per staged read (reader thread):
//   take the oldest free slot (FIFO ring) -> Target::wait_slot_free (its last
//   copies have read it) -> pread (O_DIRECT: the read widened to 4 KiB
//   alignment) -> Target::copy_out per copy -> Target::slot_filled -> give
//   the slot back.
// (A "mapped share", DMA straight from registered page-cache pages, was tried
// and removed: it was slower than staging at every share measured on the
// H200 machine, issue 24 item 8.)
//
// Host memory: the slots (the Target's), plus the page cache the kernel uses
// for buffered reads; never a copy of a whole file.
//
// Errors: the first failure (a short read, a read error, a Target error)
// stops every worker at its next read; run() waits until all have returned,
// calls Target::abort() (waits for what was enqueued), then throws that
// error, which names the file and the range.
//
// Locking: Run::mu guards the slot ring, the next-read cursors, the first
// error and the count of running workers (see pipeline.cpp); no system call
// and no Target call under it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "load/read_plan.h"
#include "os/file.h"

namespace ferry {
class WorkerPool;
}

namespace ferry::load {

enum class DirectIo { automatic, never, always };
const char* direct_io_name(DirectIo d) noexcept;
DirectIo parse_direct_io(const std::string& text);  // auto|never|always; InvalidArgument otherwise

// Where a load's bytes go. Calls come from reader threads concurrently
// (never two for the same slot at once), and finish/abort from the load's
// thread after every worker returned.
class Target {
 public:
  virtual ~Target() = default;
  virtual size_t slot_count() const = 0;
  virtual size_t slot_bytes() const = 0;        // >= the plan's window_bytes
  virtual unsigned char* slot(size_t i) const = 0;  // 4 KiB aligned
  // Blocks until the copies last enqueued out of slot i have read it.
  virtual void wait_slot_free(size_t i) = 0;
  // Copies n bytes at src (inside slot i) to dst, now or enqueued.
  virtual void copy_out(size_t i, const unsigned char* src, uintptr_t dst, size_t n) = 0;
  // Every copy of this fill of slot i is enqueued.
  virtual void slot_filled(size_t i) = 0;
  // Waits for every copy. Throws the first error.
  virtual void finish() = 0;
  // After a failure: waits for what was enqueued.
  virtual void abort() noexcept = 0;
};

// The files of one load, opened for it and closed by its destructor. Mode per file: buffered (pread through the page cache) or
// direct (O_DIRECT); automatic picks direct for a file less than half of
// which is in the page cache (kCacheProbes one-byte RWF_NOWAIT reads spread
// over the file), always forces it (where the file system allows O_DIRECT).
class FileSet {
 public:
  static constexpr int kCacheProbes = 64;
  struct File {
    std::string name;
    int fd = -1;         // buffered reads
    int direct_fd = -1;  // O_DIRECT reads, -1 when the file is read buffered
    uint64_t bytes = 0;
    double cached_share = -1;  // page-cache probes that hit, 0..1; -1 when not probed
    os::FileIdentity identity;  // fstat at open: what a header read earlier must match
  };
  // Throws OsError / InvalidArgument naming the file.
  FileSet(std::span<const std::string> paths, DirectIo direct);
  ~FileSet();
  FileSet(const FileSet&) = delete;
  FileSet& operator=(const FileSet&) = delete;

  size_t size() const noexcept { return files_.size(); }
  const File& operator[](size_t i) const { return files_[i]; }
  std::vector<uint64_t> sizes() const;
  std::vector<std::string> names() const;
  const std::vector<std::string>& notes() const noexcept { return notes_; }
  // The files whose fstat now differs from the one at open (size or
  // modification time: written, truncated or extended since), each named
  // with what changed. A file renamed over after the open is not among them:
  // the descriptors still read the file that was opened.
  std::vector<std::string> changed_since_open() const;

 private:
  void open_one(const std::string& path, DirectIo direct);
  void close_all() noexcept;
  std::vector<File> files_;
  std::vector<std::string> notes_;  // e.g. "a.safetensors: O_DIRECT refused (...); buffered reads"
};

struct PipelineOptions {
  int threads = 4;            // reader threads (the pool needs as many)
  bool progress = false;      // print bytes and rate to stderr after progress_after_s
  double progress_after_s = 2.0;
};

struct PipelineStats {
  uint64_t range_bytes = 0;   // bytes delivered
  uint64_t read_bytes = 0;    // bytes read from files (with merged gaps and O_DIRECT widening)
  uint64_t staged_bytes = 0;  // read bytes that went through the slots
  uint64_t reads = 0, direct_reads = 0;
  double seconds = 0;
  std::vector<std::string> notes;  // fallbacks taken (O_DIRECT refused, ...)
  // Per file of the FileSet: its identity at open (a caller compares it with
  // the one its header was read from: a file renamed over in between is
  // another inode), and after the reads, what changed (changed_since_open).
  std::vector<os::FileIdentity> identities;
  std::vector<std::string> changed;
};

// The share (0..1) of each file found in the page cache: FileSet's probe
// (kCacheProbes one-byte RWF_NOWAIT reads spread over the file); -1 where the
// file system cannot say, 1 for an empty file. For callers that choose a
// route by it (a node load steps aside for cached files). Throws OsError /
// InvalidArgument naming the file, as FileSet does.
std::vector<double> page_cache_shares(std::span<const std::string> paths);

// Runs the plan on `pool` (at least options.threads threads). The files must
// be those the plan was made for. Blocks until done; throws the first error.
PipelineStats run_pipeline(const ReadPlan& plan, const FileSet& files, Target& target, WorkerPool& pool,
                           const PipelineOptions& options);

}  // namespace ferry::load
