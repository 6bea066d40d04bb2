// file_replace.h — the system calls that replace a file whole (a checkpoint's
// save, ferry's reports): create a temporary file, cut, sync, give it a mode
// and an owner, rename it over the final name, sync the directory, and the
// flock that serializes the publications of one path.
//
// The contract of file.h and memory.h: every function returns 0 or an errno
// value, sets its outputs only on success, throws nothing and applies no
// policy (O_DIRECT refused, which owner to keep, how long to wait for a
// lock: that is load/atomic_file.h's and load/path_lock.h's job).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ferry::os {

// open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC [| O_DIRECT], mode).
// A file system without O_DIRECT (tmpfs) gives EINVAL.
int create_exclusive(const char* path, bool direct, unsigned mode, int* fd_out) noexcept;

// What stat says of a file.
struct FileStatus {
  unsigned mode = 0;  // st_mode: type and permission bits
  uint32_t uid = 0, gid = 0;
  uint64_t device = 0, inode = 0, size = 0;
};
int status_of_fd(int fd, FileStatus* out) noexcept;
// stat (follow_links) or lstat of a path.
int status_of_path(const char* path, bool follow_links, FileStatus* out) noexcept;

int truncate_fd(int fd, uint64_t length) noexcept;  // ftruncate
// fallocate(fd, 0, 0, length): blocks reserved and the size set, so that
// writes after it neither allocate nor extend the file. The Linux call, not
// posix_fallocate (whose emulation writes zeros): EOPNOTSUPP where the file
// system has none.
int reserve_fd(int fd, uint64_t length) noexcept;
int sync_fd(int fd) noexcept;                       // fsync
// fchown; uid or gid -1 (as uint32_t: 0xffffffff) leaves that id as it is.
int change_owner(int fd, uint32_t uid, uint32_t gid) noexcept;
int change_mode(int fd, unsigned mode) noexcept;    // fchmod
int rename_path(const char* from, const char* to) noexcept;
int remove_path(const char* path) noexcept;         // unlink
// open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC), fsync, close: the
// renames in it survive a crash.
int sync_directory(const char* directory) noexcept;

// open(path, O_RDONLY | O_CLOEXEC), fsync, close: a file another writer
// wrote (a baseline saver's, in `ferry bench save`) on disk.
int sync_path(const char* path) noexcept;

// This process's umask, read from /proc/self/status (setting it to read it
// would race with other threads creating files). ENOENT where /proc does
// not say.
int process_umask(unsigned* mask_out) noexcept;

// A lock file: open(path, O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK |
// O_RDWR, 0666), or O_RDONLY where it is another user's (flock needs no write
// access). ELOOP (a link), EISDIR, ENXIO (a socket) as open gives them.
int open_lock_file(const char* path, int* fd_out) noexcept;

// flock(fd, LOCK_EX | LOCK_NB): *got is false where another descriptor holds it.
int try_lock_exclusive(int fd, bool* got) noexcept;

}  // namespace ferry::os
