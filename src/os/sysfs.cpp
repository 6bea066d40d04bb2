// sysfs.cpp — readers and parsers for sysfs/procfs facts.
#include "os/sysfs.h"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <vector>

namespace ferry::os {
namespace {

std::string_view strip(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> words(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    size_t j = i;
    while (j < s.size() && !std::isspace(static_cast<unsigned char>(s[j]))) ++j;
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

int read_thp_file(const char* path, std::string* setting) {
  std::string text;
  if (int err = read_file(path, &text)) return err;
  std::string value = parse_thp_setting(text);
  if (value.empty()) return EINVAL;
  *setting = std::move(value);
  return 0;
}

}  // namespace

int read_file(const char* path, std::string* out, size_t max_bytes) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  std::string text;
  char buf[16384];
  int err = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      err = errno;
      break;
    }
    if (n == 0) break;
    if (text.size() + static_cast<size_t>(n) > max_bytes) {
      err = E2BIG;
      break;
    }
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  if (err == 0) *out = std::move(text);
  return err;
}

std::string parse_thp_setting(std::string_view text) {
  std::string_view selected;
  int brackets = 0;
  const auto all = words(text);
  for (std::string_view w : all) {
    const std::string_view inner = w.size() >= 2 ? w.substr(1, w.size() - 2) : std::string_view();
    if (w.size() >= 2 && w.front() == '[' && w.back() == ']' &&
        inner.find_first_of("[]") == std::string_view::npos) {  // "[always]]" is garbage
      selected = inner;
      ++brackets;
    } else if (w.find_first_of("[]") != std::string_view::npos) {
      return "";
    }
  }
  if (brackets == 1 && !selected.empty()) return std::string(selected);
  if (brackets == 0 && all.size() == 1) return std::string(all[0]);
  return "";
}

bool parse_unsigned(std::string_view text, uint64_t* out) {
  text = strip(text);
  if (text.empty()) return false;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

int read_thp_enabled(std::string* setting) {
  return read_thp_file("/sys/kernel/mm/transparent_hugepage/enabled", setting);
}

int read_thp_shmem_enabled(std::string* setting) {
  return read_thp_file("/sys/kernel/mm/transparent_hugepage/shmem_enabled", setting);
}

std::string hugepages_dir(size_t page_bytes) {
  return "/sys/kernel/mm/hugepages/hugepages-" + std::to_string(page_bytes >> 10) + "kB";
}

int read_free_hugepages(size_t page_bytes, uint64_t* out) {
  std::string text;
  if (int err = read_file((hugepages_dir(page_bytes) + "/free_hugepages").c_str(), &text)) return err;
  uint64_t n = 0;
  if (!parse_unsigned(text, &n)) return EINVAL;
  *out = n;
  return 0;
}

int usable_cores() noexcept {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

uint64_t physical_memory_bytes() noexcept {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
}

}  // namespace ferry::os
