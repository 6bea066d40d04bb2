// file_replace.cpp — open/fstat/ftruncate/fsync/fchown/fchmod/rename/unlink/
// flock, errno returns (file_replace.h).
#include "os/file_replace.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace ferry::os {
namespace {

int open_retrying(const char* path, int flags, unsigned mode, int* fd_out) {
  int fd;
  do {
    fd = ::open(path, flags, static_cast<mode_t>(mode));
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return errno;
  *fd_out = fd;
  return 0;
}

void to_status(const struct stat& st, FileStatus* out) {
  out->mode = st.st_mode;
  out->uid = st.st_uid;
  out->gid = st.st_gid;
  out->device = st.st_dev;
  out->inode = st.st_ino;
  out->size = static_cast<uint64_t>(st.st_size);
}

}  // namespace

int create_exclusive(const char* path, bool direct, unsigned mode, int* fd_out) noexcept {
  return open_retrying(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | (direct ? O_DIRECT : 0), mode, fd_out);
}

int status_of_fd(int fd, FileStatus* out) noexcept {
  struct stat st;
  if (::fstat(fd, &st) != 0) return errno;
  to_status(st, out);
  return 0;
}

int status_of_path(const char* path, bool follow_links, FileStatus* out) noexcept {
  struct stat st;
  if ((follow_links ? ::stat(path, &st) : ::lstat(path, &st)) != 0) return errno;
  to_status(st, out);
  return 0;
}

int truncate_fd(int fd, uint64_t length) noexcept {
  while (::ftruncate(fd, static_cast<off_t>(length)) != 0)
    if (errno != EINTR) return errno;
  return 0;
}

int reserve_fd(int fd, uint64_t length) noexcept {
  while (::fallocate(fd, 0, 0, static_cast<off_t>(length)) != 0)
    if (errno != EINTR) return errno;
  return 0;
}

int sync_fd(int fd) noexcept {
  while (::fsync(fd) != 0)
    if (errno != EINTR) return errno;
  return 0;
}

int change_owner(int fd, uint32_t uid, uint32_t gid) noexcept {
  return ::fchown(fd, static_cast<uid_t>(uid), static_cast<gid_t>(gid)) == 0 ? 0 : errno;
}

int change_mode(int fd, unsigned mode) noexcept { return ::fchmod(fd, static_cast<mode_t>(mode)) == 0 ? 0 : errno; }

int rename_path(const char* from, const char* to) noexcept { return ::rename(from, to) == 0 ? 0 : errno; }

int remove_path(const char* path) noexcept { return ::unlink(path) == 0 ? 0 : errno; }

int sync_directory(const char* directory) noexcept {
  int fd = -1;
  if (int err = open_retrying(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0, &fd)) return err;
  const int err = sync_fd(fd);
  ::close(fd);
  return err;
}

int sync_path(const char* path) noexcept {
  int fd = -1;
  if (int err = open_retrying(path, O_RDONLY | O_CLOEXEC, 0, &fd)) return err;
  const int err = sync_fd(fd);
  ::close(fd);
  return err;
}

int process_umask(unsigned* mask_out) noexcept {
  FILE* f = std::fopen("/proc/self/status", "re");
  if (!f) return errno;
  char line[256];
  int err = ENOENT;
  while (std::fgets(line, sizeof line, f)) {
    unsigned mask = 0;
    if (std::strncmp(line, "Umask:", 6) == 0 && std::sscanf(line + 6, "%o", &mask) == 1) {
      *mask_out = mask;
      err = 0;
      break;
    }
  }
  std::fclose(f);
  return err;
}

int open_lock_file(const char* path, int* fd_out) noexcept {
  const int flags = O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK;
  int err = open_retrying(path, flags | O_RDWR, 0666, fd_out);
  if (err == EACCES) err = open_retrying(path, flags | O_RDONLY, 0, fd_out);
  return err;
}

int try_lock_exclusive(int fd, bool* got) noexcept {
  for (;;) {
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      *got = true;
      return 0;
    }
    if (errno == EWOULDBLOCK) {
      *got = false;
      return 0;
    }
    if (errno != EINTR) return errno;
  }
}

}  // namespace ferry::os
