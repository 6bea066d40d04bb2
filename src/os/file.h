// file.h — the system calls a checkpoint loader and writer make on files:
// open for reading (buffered or O_DIRECT) or writing, size, positioned reads
// and writes, page-cache residency and read-ahead advice.
//
// The contract of memory.h: every function returns 0 or an errno value, sets
// its outputs only on success, throws nothing and applies no policy (when to
// use O_DIRECT, what to do when it is refused: that is load/pipeline's job).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ferry::os {

// The alignment O_DIRECT reads use here: file offset, length and buffer
// address. 4 KiB is a multiple of every logical block size Linux disks report
// up to 4Kn, and the page size.
constexpr size_t kDirectIoAlignment = 4096;

// open(path, O_RDONLY | O_CLOEXEC [| O_DIRECT]), never waiting: a FIFO opens
// at once (O_NONBLOCK, cleared after the open), for regular_file_size to
// refuse. A file system without O_DIRECT (tmpfs) gives EINVAL.
int open_for_reading(const char* path, bool direct, int* fd_out) noexcept;

// fstat: the size of a regular file; EISDIR for a directory, EINVAL for
// anything else that is not a regular file (a FIFO, a device).
int regular_file_size(int fd, uint64_t* bytes_out) noexcept;

// What fstat/stat say of a file: enough to tell whether two opens saw the same
// file, unchanged (device, inode, size, modification time), and its kind.
struct FileIdentity {
  uint64_t device = 0;
  uint64_t inode = 0;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  uint32_t mode = 0;  // st_mode: the kind (S_ISREG ...) and permissions
};
// fstat of descriptor fd.
int file_identity(int fd, FileIdentity* out) noexcept;
// stat of `path` (symbolic links followed).
int path_identity(const char* path, FileIdentity* out) noexcept;

// pread until `bytes` are read or the file ends (retrying EINTR and partial
// reads). *got is how many bytes arrived (fewer than asked only at the end of
// the file). O_DIRECT descriptors need buffer, offset and bytes aligned to
// kDirectIoAlignment.
int read_at(int fd, void* buffer, size_t bytes, uint64_t offset, size_t* got) noexcept;

// open(path, O_WRONLY | O_CLOEXEC): an existing file (no O_CREAT), written
// through the page cache; the buffered twin of an O_DIRECT descriptor whose
// writes the file system refused (load/atomic_file.h).
int open_for_writing(const char* path, int* fd_out) noexcept;

// pwrite until all `bytes` are written (retrying EINTR and partial writes).
// A write that makes no progress and sets no errno gives ENOSPC. *done is how
// many bytes were written before an error (all of them on success). O_DIRECT
// descriptors need buffer, offset and bytes aligned to kDirectIoAlignment
// (EINVAL otherwise, or where the file system refuses direct writes).
int write_at(int fd, const void* buffer, size_t bytes, uint64_t offset, size_t* done) noexcept;

// Whether the page of fd holding byte `offset` is in the page cache: a
// one-byte preadv2(RWF_NOWAIT), which reads only cached data (EAGAIN
// otherwise). Unlike mincore, it answers for files the caller may not write
// (mincore reports only mapped pages for those since Linux 5.2).
// EOPNOTSUPP where the file system has no RWF_NOWAIT.
int is_cached(int fd, uint64_t offset, bool* cached_out) noexcept;

// posix_fadvise(POSIX_FADV_SEQUENTIAL) over the whole file: larger read-ahead
// for buffered reads of a file that is not cached.
int advise_sequential_reads(int fd) noexcept;

// open(path, O_WRONLY | O_CLOEXEC | O_NOCTTY) of a character device or a FIFO
// to write into (never to replace), never waiting: a FIFO with no reader
// gives ENXIO at once (O_NONBLOCK, cleared after the open: the writes then
// block as usual). EINVAL: the path is neither (a regular file, a directory).
int open_stream_for_writing(const char* path, int* fd_out) noexcept;

// write() until all `bytes` are written (retrying EINTR and partial writes),
// for descriptors without positions (a pipe, a FIFO, a terminal). *done: how
// many bytes were written before an error (all of them on success).
int write_all(int fd, const void* buffer, size_t bytes, size_t* done) noexcept;

// Whether file descriptor fd is a terminal (isatty); false on any error.
bool is_terminal(int fd) noexcept;

}  // namespace ferry::os
