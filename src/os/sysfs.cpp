// sysfs.cpp — readers and parsers for sysfs/procfs facts.
#include "os/sysfs.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <vector>

#include "os/affinity.h"

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

// 1 to 10 decimal digits (the Python parser's bound), as a number.
bool parse_id_digits(std::string_view text, uint64_t* out) {
  if (text.empty() || text.size() > 10) return false;
  return parse_unsigned(text, out) && std::isdigit(static_cast<unsigned char>(text.front())) &&
         std::isdigit(static_cast<unsigned char>(text.back()));
}

// 1 to `max_digits` hex digits.
bool parse_hex(std::string_view text, size_t max_digits, unsigned* out) {
  if (text.empty() || text.size() > max_digits) return false;
  unsigned v = 0;
  for (char c : text) {
    const int d = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
                  : (c >= 'a' && c <= 'f')                    ? c - 'a' + 10
                  : (c >= 'A' && c <= 'F')                    ? c - 'A' + 10
                                                               : -1;
    if (d < 0) return false;
    v = v * 16 + static_cast<unsigned>(d);
  }
  *out = v;
  return true;
}

}  // namespace

int read_file(const char* path, std::string* out, size_t max_bytes) {
  // O_NONBLOCK: a FIFO opens at once (and is refused below) instead of waiting
  // for a writer; cleared before reading.
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return errno;
  struct stat st;
  const int fl = ::fcntl(fd, F_GETFL);
  if (::fstat(fd, &st) != 0 || fl < 0 || ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
    const int e = errno;
    ::close(fd);
    return e;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
  }
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

int read_unreserved_hugepages(size_t page_bytes, uint64_t* out) {
  uint64_t free_pages = 0, reserved = 0;
  if (int err = read_free_hugepages(page_bytes, &free_pages)) return err;
  std::string text;
  if (int err = read_file((hugepages_dir(page_bytes) + "/resv_hugepages").c_str(), &text)) return err;
  if (!parse_unsigned(text, &reserved)) return EINVAL;
  *out = free_pages > reserved ? free_pages - reserved : 0;
  return 0;
}

int usable_cores() noexcept {
  try {
    std::vector<int> cpus;
    if (thread_cpus(&cpus) == 0 && !cpus.empty()) return static_cast<int>(cpus.size());
  } catch (...) {  // no memory for the list: count the online CPUs instead
  }
  const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

bool parse_cpulist(std::string_view text, std::vector<int>* out) {
  constexpr uint64_t kMaxIds = uint64_t{1} << 17;
  text = strip(text);
  std::vector<int> ids;
  uint64_t budget = kMaxIds;
  while (!text.empty()) {
    const size_t comma = text.find(',');
    const std::string_view item = strip(text.substr(0, comma));
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    if (comma != std::string_view::npos && text.empty()) return false;  // "0-3,"
    // "N", "N-M" or "N-M:used/group".
    const size_t dash = item.find('-'), colon = item.find(':'), slash = item.find('/');
    uint64_t lo = 0, hi = 0, used = 1, group = 1;
    if (!parse_id_digits(item.substr(0, dash), &lo)) return false;
    hi = lo;
    if (dash != std::string_view::npos) {
      const std::string_view last = item.substr(dash + 1, colon == std::string_view::npos ? colon : colon - dash - 1);
      if (!parse_id_digits(last, &hi)) return false;
      if (colon != std::string_view::npos) {
        if (slash == std::string_view::npos || slash < colon ||
            !parse_id_digits(item.substr(colon + 1, slash - colon - 1), &used) ||
            !parse_id_digits(item.substr(slash + 1), &group))
          return false;
      }
    }
    if (colon != std::string_view::npos && dash == std::string_view::npos) return false;
    if (slash != std::string_view::npos && colon == std::string_view::npos) return false;
    if (hi < lo || used < 1 || group < used || hi > static_cast<uint64_t>(kMaxCpuId)) return false;
    if (hi - lo + 1 > budget) return false;
    budget -= hi - lo + 1;
    for (uint64_t base = lo; base <= hi; base += group)
      for (uint64_t id = base; id < std::min(base + used, hi + 1); ++id) ids.push_back(static_cast<int>(id));
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  *out = std::move(ids);
  return true;
}

std::string normalize_pci_bus_id(std::string_view bus_id) {
  // [domain:]bus:device.function, hex except the function (0-7).
  bus_id = strip(bus_id);
  const size_t dot = bus_id.rfind('.');
  if (dot == std::string_view::npos || dot + 2 != bus_id.size()) return "";
  const char function = bus_id[dot + 1];
  if (function < '0' || function > '7') return "";
  const std::string_view head = bus_id.substr(0, dot);
  const size_t last_colon = head.rfind(':');
  if (last_colon == std::string_view::npos) return "";
  const std::string_view front = head.substr(0, last_colon);
  const size_t first_colon = front.rfind(':');
  unsigned domain = 0, bus = 0, device = 0;
  if (first_colon != std::string_view::npos && !parse_hex(front.substr(0, first_colon), 8, &domain)) return "";
  const std::string_view bus_text = first_colon == std::string_view::npos ? front : front.substr(first_colon + 1);
  if (!parse_hex(bus_text, 2, &bus) || !parse_hex(head.substr(last_colon + 1), 2, &device)) return "";
  char out[32];
  std::snprintf(out, sizeof out, "%04x:%02x:%02x.%c", domain, bus, device, function);
  return out;
}

bool parse_numa_node(std::string_view text, int* out) {
  text = strip(text);
  if (text == "-1") {
    *out = -1;
    return true;
  }
  uint64_t v = 0;
  if (!parse_unsigned(text, &v) || v > static_cast<uint64_t>(kMaxCpuId)) return false;
  *out = static_cast<int>(v);
  return true;
}

int read_online_nodes(std::vector<int>* nodes) {
  std::string text;
  if (int err = read_file("/sys/devices/system/node/online", &text)) return err;
  return parse_cpulist(text, nodes) ? 0 : EINVAL;
}

int read_node_cpus(int node, std::vector<int>* cpus) {
  if (node < 0 || node > kMaxCpuId) return EINVAL;
  std::string text;
  const std::string path = "/sys/devices/system/node/node" + std::to_string(node) + "/cpulist";
  if (int err = read_file(path.c_str(), &text)) return err;
  return parse_cpulist(text, cpus) ? 0 : EINVAL;
}

int read_pci_numa_node(std::string_view bus_id, int* node) {
  const std::string name = normalize_pci_bus_id(bus_id);
  if (name.empty()) return EINVAL;
  std::string text;
  if (int err = read_file(("/sys/bus/pci/devices/" + name + "/numa_node").c_str(), &text)) return err;
  return parse_numa_node(text, node) ? 0 : EINVAL;
}

uint64_t physical_memory_bytes() noexcept {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
}

}  // namespace ferry::os
