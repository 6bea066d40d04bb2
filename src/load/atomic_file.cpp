// atomic_file.cpp — AtomicFile: temporary file, the one O_DIRECT fallback,
// finish (cut, mode, owner, fsync), publish (rename, directory fsync).
#include "load/atomic_file.h"

#include <sys/stat.h>

#include <cerrno>

#include "core/error.h"
#include "os/file.h"
#include "os/file_replace.h"
#include "os/memory.h"

namespace ferry::load {
namespace {

constexpr uint64_t kAlign = os::kDirectIoAlignment;
uint64_t align_up(uint64_t v) { return (v + kAlign - 1) & ~(kAlign - 1); }

std::string directory_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// The owner first where permitted (EPERM, or EINVAL for an id this namespace
// cannot map: left as it is), then the mode (EPERM/EOPNOTSUPP: left).
int give_mode(int fd, const ReplacedMode& m) {
  if (m.uid >= 0) {
    os::FileStatus st;
    if (int err = os::status_of_fd(fd, &st)) return err;
    if (st.uid != m.uid || st.gid != m.gid) {
      int err = os::change_owner(fd, static_cast<uint32_t>(m.uid), static_cast<uint32_t>(m.gid));
      if (err == EPERM || err == EINVAL) err = os::change_owner(fd, 0xffffffffu, static_cast<uint32_t>(m.gid));
      if (err != 0 && err != EPERM && err != EINVAL) return err;
    }
  }
  const int err = os::change_mode(fd, m.mode);
  return err == EPERM || err == EOPNOTSUPP ? 0 : err;
}

}  // namespace

std::string describe_mode(unsigned mode) {
  switch (mode & S_IFMT) {
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a directory";
    case S_IFLNK: return "a symbolic link";
    case S_IFCHR: return "a character device";
    case S_IFIFO: return "a FIFO";
    case S_IFSOCK: return "a socket";
    case S_IFBLK: return "a block device";
    default: return "not a regular file";
  }
}

ReplacedMode mode_of(const std::vector<std::string>& like) {
  for (const std::string& p : like) {
    os::FileStatus st;
    if (os::status_of_path(p.c_str(), true, &st) == 0 && S_ISREG(st.mode))
      return ReplacedMode{st.mode & 0777u, st.uid, st.gid};
  }
  unsigned mask = 022;  // where /proc does not say: the usual default
  os::process_umask(&mask);
  return ReplacedMode{0666u & ~mask, -1, -1};
}

void sync_directory(const std::string& directory) {
  if (int err = os::sync_directory(directory.c_str())) throw OsError("fsync of directory " + directory, err);
}

AtomicFile::AtomicFile(std::string path, std::string temp_path, bool direct, bool durable)
    : path_(std::move(path)), temp_path_(std::move(temp_path)), durable_(durable) {
  int fd = -1;
  int err = direct ? os::create_exclusive(temp_path_.c_str(), true, 0600, &fd) : EINVAL;
  if (err == 0) {
    direct_fd_ = fd;
    return;
  }
  if (err != EINVAL) throw OsError("open (temporary file " + temp_path_ + ") for " + path_, err);
  if ((err = os::create_exclusive(temp_path_.c_str(), false, 0600, &fd)) != 0)  // tmpfs: EINVAL for O_DIRECT
    throw OsError("open (temporary file " + temp_path_ + ") for " + path_, err);
  buffered_fd_ = fd;
}

AtomicFile::~AtomicFile() {
  if (!published_) abort();
}

std::vector<std::string> AtomicFile::notes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return notes_;
}

// The buffered descriptor, opened by the first writer refused (the others wait on mu_).
int AtomicFile::buffered_fd_or_open(int direct_err) {
  std::lock_guard<std::mutex> lock(mu_);
  int fd = buffered_fd_.load();
  if (fd >= 0) return fd;
  if (int err = os::open_for_writing(temp_path_.c_str(), &fd))
    throw OsError("open of " + path_ + "'s temporary file for buffered writes (O_DIRECT write refused: errno " +
                      std::to_string(direct_err) + ")",
                  err);
  notes_.push_back(path_ + ": an O_DIRECT write gave EINVAL (alignment the file system does not accept); "
                   "buffered writes from here on");
  buffered_fd_ = fd;
  return fd;
}

void AtomicFile::write(const void* data, size_t bytes, uint64_t offset, bool pad) {
  size_t done = 0;
  int fd = buffered_fd_.load();
  if (fd < 0) {
    if (direct_fd_ < 0) throw InvalidArgument("write to " + path_ + ": the file is closed");
    const size_t padded = pad ? align_up(bytes) : bytes;  // finish() cuts the file to its length
    const int err = os::write_at(direct_fd_, data, padded, offset, &done);
    if (err == 0) return;
    if (err != EINVAL)
      throw OsError("O_DIRECT pwrite of " + path_ + ", bytes [" + std::to_string(offset) + ", " +
                        std::to_string(offset + padded) + ")",
                    err);
    fd = buffered_fd_or_open(err);
  }
  if (int err = os::write_at(fd, data, bytes, offset, &done))
    throw OsError("pwrite of " + path_ + ", bytes [" + std::to_string(offset) + ", " +
                      std::to_string(offset + bytes) + ")",
                  err);
}

void AtomicFile::reserve(uint64_t length) {
  const int fd = buffered_fd_ >= 0 ? buffered_fd_.load() : direct_fd_;
  if (fd < 0 || length == 0) return;
  const int err = os::reserve_fd(fd, length);
  if (err == 0 || err == EOPNOTSUPP || err == ENOSYS || err == EINVAL) return;
  throw OsError("fallocate of " + std::to_string(length) + " bytes for " + path_, err);
}

void AtomicFile::finish(uint64_t length, const std::vector<std::string>& like) {
  const int fd = buffered_fd_ >= 0 ? buffered_fd_.load() : direct_fd_;
  int err = fd < 0 ? EBADF : 0;
  const char* call = "ftruncate";
  if (!err) err = os::truncate_fd(fd, length);
  if (!err && (call = "fchown/fchmod", err = give_mode(fd, mode_of(like))) == 0 && durable_) {
    call = "fsync";
    err = os::sync_fd(fd);
  }
  if (err) {
    abort();
    throw OsError(std::string(call) + " of " + path_ + "'s temporary file", err);
  }
  close_all();
}

void AtomicFile::publish(bool fsync_dir) {
  os::FileStatus st;
  if (os::status_of_path(path_.c_str(), false, &st) == 0 && !S_ISREG(st.mode)) {
    abort();
    throw InvalidArgument(path_ + " became " + describe_mode(st.mode) +
                          " while it was written: not replaced (nothing was written there)");
  }
  if (int err = os::rename_path(temp_path_.c_str(), path_.c_str())) {
    abort();
    throw OsError("rename of " + temp_path_ + " to " + path_, err);
  }
  published_ = true;
  close_all();
  if (durable_ && fsync_dir) sync_directory(directory_of(path_));
}

void AtomicFile::close_all() noexcept {
  if (direct_fd_ >= 0) os::close_fd(direct_fd_);
  direct_fd_ = -1;
  const int fd = buffered_fd_.exchange(-1);
  if (fd >= 0) os::close_fd(fd);
}

void AtomicFile::abort() noexcept {
  close_all();
  if (!published_ && !removed_) os::remove_path(temp_path_.c_str());
  removed_ = true;
}

}  // namespace ferry::load
