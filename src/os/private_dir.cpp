// private_dir.cpp — mkdir, lstat, lock files.
#include "os/private_dir.h"

#include <cerrno>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <new>

namespace ferry::os {

int path_facts(const std::string& path, PathFacts* out) noexcept {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return errno;
  out->is_directory = S_ISDIR(st.st_mode);
  out->is_symlink = S_ISLNK(st.st_mode);
  out->owner = st.st_uid;
  out->mode = st.st_mode & 07777;
  return 0;
}

int make_directory(const std::string& path, unsigned mode) noexcept {
  if (::mkdir(path.c_str(), static_cast<mode_t>(mode)) != 0) return errno;
  return ::chmod(path.c_str(), static_cast<mode_t>(mode)) == 0 ? 0 : errno;
}

int open_lock_file(const std::string& path, int* fd_out) noexcept {
  int fd;
  do fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  while (fd < 0 && errno == EINTR);
  if (fd < 0) return errno;
  *fd_out = fd;
  return 0;
}

int names_file(int fd, const std::string& path, bool* same_out) noexcept {
  struct stat open_st {}, path_st {};
  if (::fstat(fd, &open_st) != 0) return errno;
  if (::lstat(path.c_str(), &path_st) != 0) {
    if (errno != ENOENT) return errno;
    *same_out = false;
    return 0;
  }
  *same_out = open_st.st_dev == path_st.st_dev && open_st.st_ino == path_st.st_ino;
  return 0;
}

int remove_file(const std::string& path) noexcept { return ::unlink(path.c_str()) == 0 ? 0 : errno; }

int list_directory(const std::string& path, std::vector<std::string>* names_out) noexcept {
  DIR* d = ::opendir(path.c_str());
  if (!d) return errno;
  std::vector<std::string> names;
  int err = 0;
  try {
    for (;;) {
      errno = 0;
      const dirent* e = ::readdir(d);
      if (!e) {
        err = errno;
        break;
      }
      const std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
  } catch (const std::bad_alloc&) {
    err = ENOMEM;
  }
  ::closedir(d);
  if (err == 0) names_out->swap(names);
  return err;
}

}  // namespace ferry::os
