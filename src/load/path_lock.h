// path_lock.h — the exclusive lock of a checkpoint path while a save
// publishes it (python/ferry/torch/publish.py's steps 1-3): flock on a lock
// file beside it (its name is the caller's: `.NAME.ferry-lock`), which the
// holder removes when done; a waiter that then holds the lock of a removed
// file opens the new one again. The holder writes who it is into the file
// (for the messages of waiters). A holder killed by SIGKILL leaves its lock
// file but no lock: the next save takes it. Where the file system has no
// locks (ENOLCK, EOPNOTSUPP, ENOSYS, EINVAL), saves are not serialized:
// acquire succeeds without a lock.
//
// The wait is bounded: try_for() tries for a while and returns; the caller
// loops until its deadline (checking for Ctrl-C between tries), then throws
// timeout_error(), which names the holder.
//
// Locking: a PathLock is used by one thread.
#pragma once

#include <string>

#include "core/error.h"

namespace ferry::load {

// An OsError whose text is a whole sentence (no "call failed: ..." form).
class OsErrorText : public OsError {
 public:
  OsErrorText(std::string text, int err) : OsError(text, err), text_(std::move(text)) {}
  const char* what() const noexcept override { return text_.c_str(); }

 private:
  std::string text_;
};

class PathLock {
 public:
  // path: the checkpoint's (for messages); lock: the lock file; holder: who
  // this process is ("process 123 (host ...)"), written into the lock file.
  PathLock(std::string path, std::string lock, std::string holder);
  ~PathLock();  // release()
  PathLock(const PathLock&) = delete;
  PathLock& operator=(const PathLock&) = delete;

  // Tries for up to `seconds` (backing off 1 ms .. 50 ms). True: held (or no
  // locks on this file system). Throws InvalidArgument where the lock file is
  // not a regular file, OsError for other failures.
  bool try_for(double seconds);
  // The ETIMEDOUT error after waiting `waited` seconds, naming the holder seen last.
  OsErrorText timeout_error(double waited) const;
  // Removes the lock file (while held: a waiter then opens the next one) and
  // unlocks. Never throws.
  void release() noexcept;
  bool held() const noexcept { return fd_ >= 0; }

 private:
  enum class Try { held, busy, no_locks };
  Try try_once();
  int open_checked();

  std::string path_, lock_, holder_;
  std::string last_holder_;  // what the lock file said while it was busy
  int fd_ = -1;              // the held lock's descriptor
};

}  // namespace ferry::load
