// atomic_file.h — a file written whole or not at all: bytes go to a
// temporary file beside the final name (the name is the caller's:
// python/ferry/temp_names.py), which finish() cuts to its length, gives the
// mode and owner of the file it replaces and fsyncs, and publish() renames
// over the final name (then fsyncs the directory). Until publish() returns,
// the final name holds what it held before; abort() (and the destructor of a
// file not published) closes and removes the temporary file.
//
// O_DIRECT, in this one place for every writer of ferry: the temporary file
// is opened with O_DIRECT where the file system allows it (tmpfs refuses:
// then buffered). Direct writes need buffer address, length and offset
// aligned to os::kDirectIoAlignment; write(..., pad=true) pads the length
// (the buffer must have room: a slot, or memory readable to the end of its
// page) and finish() cuts the padding. A direct write the file system refuses with
// EINVAL switches the file to buffered writes for good (the remembered
// fallback): the file opened again without O_DIRECT, by its descriptor's
// path, owned here beside the direct one.
//
// Mode and owner (finish): the temporary file is created 0600; finish gives
// it the permission bits (0777) and owner of the first regular file of
// `like` (links followed), else 0666 & ~umask. The owner is kept where this
// process may (fchown: root, or a group it is in; EPERM/EINVAL: left as it
// is); a file system without modes (EPERM/EOPNOTSUPP on fchmod): left.
//
// Errors: OsError naming the final file and the call; InvalidArgument where
// the final name became something other than a regular file or nothing.
//
// Locking: write() may be called from several threads at once (each writes
// its own range); mu_ guards the fallback's opening (buffered_fd_ is atomic:
// writers read it without the lock). finish/publish/abort from one thread,
// after the writers are done.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace ferry::load {

// (permission bits, uid, gid) of the first regular file of `like`, or
// (0666 & ~umask, -1, -1): what a file replacing it gets.
struct ReplacedMode {
  unsigned mode = 0666;
  int64_t uid = -1, gid = -1;  // -1: a new file, this process's ids
};
ReplacedMode mode_of(const std::vector<std::string>& like);

class AtomicFile {
 public:
  // Creates temp_path (O_EXCL, 0600). direct: try O_DIRECT first.
  AtomicFile(std::string path, std::string temp_path, bool direct, bool durable);
  ~AtomicFile();  // abort() unless published
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // All `bytes` at `offset`. Any thread. While the file is O_DIRECT and
  // `pad` is true, align_up(bytes) are written from `data` (the caller
  // guarantees the room, and that no other write lands in the padding: the
  // write pipeline's last slot); with `pad` false, a length the direct write
  // cannot take is refused by the kernel (EINVAL) and the file goes buffered.
  void write(const void* data, size_t bytes, uint64_t offset, bool pad = false);

  // Reserves `length` bytes of disk for the file before it is written
  // (fallocate): a full disk fails here, before any byte is written, and
  // O_DIRECT writes neither allocate nor extend it (file systems serialize
  // writes that extend a file). A file system without fallocate: nothing
  // reserved, no error. finish() cuts what was not written.
  void reserve(uint64_t length);
  // Cut to `length`, mode and owner of mode_of(like), fsync (durable),
  // close. On error the temporary file is removed.
  void finish(uint64_t length, const std::vector<std::string>& like);
  // Rename over path(), if it holds a regular file or nothing; fsync the
  // directory (durable and fsync_dir). On error the temporary file is removed.
  void publish(bool fsync_dir);
  void abort() noexcept;

  const std::string& path() const noexcept { return path_; }
  void set_path(std::string path) { path_ = std::move(path); }  // before publish (a shard's name)
  const std::string& temp_path() const noexcept { return temp_path_; }
  bool direct() const noexcept { return direct_fd_ >= 0 && buffered_fd_.load() < 0; }
  bool durable() const noexcept { return durable_; }
  // The descriptor writes go to now (-1 once closed); still the file's.
  int fd() const noexcept { return buffered_fd_ >= 0 ? buffered_fd_.load() : direct_fd_; }
  bool published() const noexcept { return published_; }
  std::vector<std::string> notes() const;  // fallbacks taken

 private:
  int buffered_fd_or_open(int direct_err);
  void close_all() noexcept;

  std::string path_, temp_path_;
  const bool durable_;
  int direct_fd_ = -1;                // the O_DIRECT descriptor, or -1
  std::atomic<int> buffered_fd_{-1};  // the buffered descriptor (from the start, or the fallback's)
  bool published_ = false;
  bool removed_ = false;             // abort() removed the temporary file
  mutable std::mutex mu_;             // guards notes_ and the fallback's opening
  std::vector<std::string> notes_;    // guarded by mu_
};

// fsync of a directory (after renames in it); OsError naming it.
void sync_directory(const std::string& directory);

// "a directory", "a FIFO", ... for an st_mode.
std::string describe_mode(unsigned mode);

}  // namespace ferry::load
