// file.cpp — open/fstat/pread/pwrite/preadv2/posix_fadvise, errno returns.
#include "os/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>

namespace ferry::os {

int open_for_reading(const char* path, bool direct, int* fd_out) noexcept {
  // O_NONBLOCK: open() of a FIFO would wait for a writer for ever (a FIFO
  // among a checkpoint's shards hung the load). Cleared at once: reads of the
  // regular file the caller then checks for (regular_file_size) block as usual.
  // O_NOCTTY: a terminal named by mistake never becomes the controlling one.
  int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | (direct ? O_DIRECT : 0);
  int fd;
  do {
    fd = ::open(path, flags);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return errno;
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0 || ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
    const int err = errno;
    ::close(fd);
    return err;
  }
  *fd_out = fd;
  return 0;
}

int regular_file_size(int fd, uint64_t* bytes_out) noexcept {
  struct stat st;
  if (::fstat(fd, &st) != 0) return errno;
  if (S_ISDIR(st.st_mode)) return EISDIR;
  if (!S_ISREG(st.st_mode)) return EINVAL;
  *bytes_out = static_cast<uint64_t>(st.st_size);
  return 0;
}

namespace {
FileIdentity identity_of(const struct stat& st) {
  FileIdentity id;
  id.device = static_cast<uint64_t>(st.st_dev);
  id.inode = static_cast<uint64_t>(st.st_ino);
  id.size = static_cast<uint64_t>(st.st_size);
  id.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  id.mode = static_cast<uint32_t>(st.st_mode);
  return id;
}
}  // namespace

int file_identity(int fd, FileIdentity* out) noexcept {
  struct stat st;
  if (::fstat(fd, &st) != 0) return errno;
  *out = identity_of(st);
  return 0;
}

int path_identity(const char* path, FileIdentity* out) noexcept {
  struct stat st;
  if (::stat(path, &st) != 0) return errno;
  *out = identity_of(st);
  return 0;
}

int read_at(int fd, void* buffer, size_t bytes, uint64_t offset, size_t* got) noexcept {
  size_t done = 0;
  while (done < bytes) {
    ssize_t n = ::pread(fd, static_cast<char*>(buffer) + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) break;  // end of file
    done += static_cast<size_t>(n);
  }
  *got = done;
  return 0;
}

int open_for_writing(const char* path, int* fd_out) noexcept {
  int fd;
  do {
    fd = ::open(path, O_WRONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return errno;
  *fd_out = fd;
  return 0;
}

int write_at(int fd, const void* buffer, size_t bytes, uint64_t offset, size_t* done) noexcept {
  size_t at = 0;
  int err = 0;
  while (at < bytes) {
    ssize_t n = ::pwrite(fd, static_cast<const char*>(buffer) + at, bytes - at, static_cast<off_t>(offset + at));
    if (n < 0) {
      if (errno == EINTR) continue;
      err = errno;
      break;
    }
    if (n == 0) {  // no progress and no errno: a full disk in all but name
      err = ENOSPC;
      break;
    }
    at += static_cast<size_t>(n);
  }
  *done = at;
  return err;
}

int is_cached(int fd, uint64_t offset, bool* cached_out) noexcept {
  char byte;
  struct iovec iov = {&byte, 1};
  for (;;) {
    ssize_t n = ::preadv2(fd, &iov, 1, static_cast<off_t>(offset), RWF_NOWAIT);
    if (n >= 0) {
      *cached_out = n > 0;
      return 0;
    }
    if (errno == EAGAIN) {
      *cached_out = false;
      return 0;
    }
    if (errno != EINTR) return errno;
  }
}

int advise_sequential_reads(int fd) noexcept { return ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL); }

int open_stream_for_writing(const char* path, int* fd_out) noexcept {
  int fd;
  do fd = ::open(path, O_WRONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  while (fd < 0 && errno == EINTR);
  if (fd < 0) return errno;
  struct stat st;
  int err = 0;
  if (::fstat(fd, &st) != 0)
    err = errno;
  else if (!S_ISCHR(st.st_mode) && !S_ISFIFO(st.st_mode))
    err = EINVAL;
  else {
    const int fl = ::fcntl(fd, F_GETFL);
    if (fl < 0 || ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) err = errno;
  }
  if (err) {
    ::close(fd);
    return err;
  }
  *fd_out = fd;
  return 0;
}

int write_all(int fd, const void* buffer, size_t bytes, size_t* done) noexcept {
  size_t at = 0;
  int err = 0;
  while (at < bytes) {
    const ssize_t n = ::write(fd, static_cast<const char*>(buffer) + at, bytes - at);
    if (n < 0) {
      if (errno == EINTR) continue;
      err = errno;
      break;
    }
    if (n == 0) {
      err = EIO;
      break;
    }
    at += static_cast<size_t>(n);
  }
  *done = at;
  return err;
}

bool is_terminal(int fd) noexcept { return ::isatty(fd) == 1; }

}  // namespace ferry::os
