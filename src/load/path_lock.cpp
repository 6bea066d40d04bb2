// path_lock.cpp — PathLock: flock on a lock file, its holder named (path_lock.h).
#include "load/path_lock.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <thread>

#include "load/atomic_file.h"
#include "os/file.h"
#include "os/file_replace.h"
#include "os/memory.h"

namespace ferry::load {
namespace {

std::string read_holder(int fd) {
  char buf[200];
  size_t got = 0;
  if (os::read_at(fd, buf, sizeof buf, 0, &got) != 0) got = 0;
  std::string s(buf, got);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s.empty() ? "a process that did not say which" : s;
}

}  // namespace

PathLock::PathLock(std::string path, std::string lock, std::string holder)
    : path_(std::move(path)), lock_(std::move(lock)), holder_(std::move(holder)) {}

PathLock::~PathLock() { release(); }

int PathLock::open_checked() {
  int fd = -1;
  if (int err = os::open_lock_file(lock_.c_str(), &fd)) {
    if (err == ELOOP || err == EISDIR || err == ENXIO)
      throw InvalidArgument("cannot publish " + path_ + ": its lock file " + lock_ +
                            " is not a regular file (remove it)");
    throw OsError("open of " + lock_ + " (the lock of " + path_ + ")", err);
  }
  os::FileStatus st;
  const int err = os::status_of_fd(fd, &st);
  if (err || !S_ISREG(st.mode)) {
    os::close_fd(fd);
    if (err) throw OsError("fstat of " + lock_, err);
    throw InvalidArgument("cannot publish " + path_ + ": its lock file " + lock_ + " is " + describe_mode(st.mode) +
                          " (remove it)");
  }
  return fd;
}

PathLock::Try PathLock::try_once() {
  const int fd = open_checked();
  bool got = false;
  if (int err = os::try_lock_exclusive(fd, &got)) {
    os::close_fd(fd);
    if (err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS || err == EINVAL) return Try::no_locks;
    throw OsError("flock of " + lock_, err);
  }
  if (!got) {
    last_holder_ = read_holder(fd);
    os::close_fd(fd);
    return Try::busy;
  }
  // Its holder removed it before we got it: the lock is the file there now.
  os::FileStatus now, mine;
  if (os::status_of_path(lock_.c_str(), false, &now) != 0 || os::status_of_fd(fd, &mine) != 0 ||
      now.device != mine.device || now.inode != mine.inode) {
    os::close_fd(fd);
    return Try::busy;
  }
  fd_ = fd;
  const std::string info = holder_ + "\n";
  size_t done = 0;
  if (os::truncate_fd(fd, 0) == 0) os::write_at(fd, info.data(), info.size(), 0, &done);  // messages only
  return Try::held;
}

bool PathLock::try_for(double seconds) {
  using clock = std::chrono::steady_clock;
  const auto end = clock::now() + std::chrono::duration<double>(std::max(0.0, seconds));
  auto delay = std::chrono::microseconds(1000);
  for (;;) {
    if (fd_ >= 0) return true;
    const Try t = try_once();
    if (t != Try::busy) return true;
    if (clock::now() >= end) return false;
    std::this_thread::sleep_for(delay);
    delay = std::min(2 * delay, std::chrono::microseconds(50000));
  }
}

OsErrorText PathLock::timeout_error(double waited) const {
  char secs[32];
  std::snprintf(secs, sizeof secs, "%g", waited);
  const std::string holder = last_holder_.empty() ? "a process that did not say which" : last_holder_;
  return OsErrorText("cannot publish " + path_ + ": another save to it (" + holder + ") has held its lock " + lock_ +
                         " for over " + secs + " s. This save's files were removed; " + path_ +
                         " holds the other save's checkpoint or the earlier one, whole. Save from one process "
                         "(e.g. rank 0), or to another path",
                     ETIMEDOUT);
}

void PathLock::release() noexcept {
  if (fd_ < 0) return;
  os::remove_path(lock_.c_str());  // while held: a waiter then finds it gone and opens the next one
  os::close_fd(fd_);
  fd_ = -1;
}

}  // namespace ferry::load
