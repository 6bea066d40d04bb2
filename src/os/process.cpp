// process.cpp — /proc/PID/stat, the boot id and the PID namespace link.
#include "os/process.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>

namespace ferry::os {
namespace {

// The whole of a small /proc file (at most 4 KiB: a stat line, a boot id).
int read_small(const char* path, std::string* out) noexcept {
  int fd;
  do fd = ::open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
  while (fd < 0 && errno == EINTR);
  if (fd < 0) return errno;
  char buf[4096];
  size_t have = 0;
  int err = 0;
  while (have < sizeof buf) {
    const ssize_t n = ::read(fd, buf + have, sizeof buf - have);
    if (n < 0) {
      if (errno == EINTR) continue;
      err = errno;
      break;
    }
    if (n == 0) break;
    have += static_cast<size_t>(n);
  }
  ::close(fd);
  if (err) return err;
  try {
    out->assign(buf, have);
  } catch (const std::bad_alloc&) {
    return ENOMEM;
  }
  return 0;
}

int read_link(const char* path, std::string* out) noexcept {
  char buf[256];
  const ssize_t n = ::readlink(path, buf, sizeof buf);
  if (n < 0) return errno;
  if (static_cast<size_t>(n) == sizeof buf) return ENAMETOOLONG;
  try {
    out->assign(buf, static_cast<size_t>(n));
  } catch (const std::bad_alloc&) {
    return ENOMEM;
  }
  return 0;
}

}  // namespace

int process_start_ticks(pid_t pid, uint64_t* ticks_out) noexcept {
  char path[48];
  if (pid == 0)
    std::strcpy(path, "/proc/self/stat");
  else
    std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  std::string text;
  if (int err = read_small(path, &text)) return err == ENOENT ? ESRCH : err;
  // The command name (field 2) may hold spaces and parentheses: fields 3.. follow the last ')'.
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return EPROTO;
  size_t at = close + 1;
  for (int field = 3; field <= 22; ++field) {
    while (at < text.size() && text[at] == ' ') ++at;
    const size_t end = text.find(' ', at);
    if (at >= text.size()) return EPROTO;
    if (field == 22) {
      const size_t stop = end == std::string::npos ? text.size() : end;
      if (stop == at) return EPROTO;
      uint64_t v = 0;
      for (size_t i = at; i < stop; ++i) {
        const char c = text[i];
        if (c < '0' || c > '9' || v > (UINT64_MAX - 9) / 10) return EPROTO;
        v = v * 10 + static_cast<uint64_t>(c - '0');
      }
      *ticks_out = v;
      return 0;
    }
    if (end == std::string::npos) return EPROTO;
    at = end;
  }
  return EPROTO;
}

int read_boot_id(std::string* out) noexcept {
  std::string text;
  if (int err = read_small("/proc/sys/kernel/random/boot_id", &text)) return err;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  if (text.empty()) return EPROTO;
  *out = std::move(text);
  return 0;
}

int read_pid_namespace(std::string* out) noexcept {
  std::string self;
  if (int err = read_link("/proc/self", &self)) return err;
  if (self != std::to_string(::getpid())) return EXDEV;
  std::string ns;
  if (int err = read_link("/proc/self/ns/pid", &ns)) return err;
  *out = std::move(ns);
  return 0;
}

}  // namespace ferry::os
