// smaps.cpp — the smaps parser and reader.
#include "os/smaps.h"

#include <cctype>

#include "os/sysfs.h"

namespace ferry::os {
namespace {

bool parse_hex(std::string_view s, uintptr_t* out) {
  if (s.empty() || s.size() > 16) return false;
  uintptr_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F')
      d = c - 'A' + 10;
    else
      return false;
    v = v * 16 + static_cast<uintptr_t>(d);
  }
  *out = v;
  return true;
}

// "7f0000000000-7f0004000000 rw-p ..." -> the mapping's range.
bool parse_header(std::string_view line, uintptr_t* begin, uintptr_t* end) {
  const size_t space = line.find(' ');
  const std::string_view range = line.substr(0, space);
  const size_t dash = range.find('-');
  return dash != std::string_view::npos && parse_hex(range.substr(0, dash), begin) &&
         parse_hex(range.substr(dash + 1), end);
}

// "AnonHugePages:    2048 kB" -> bytes; "THPeligible:    1" -> 1.
bool parse_value(std::string_view rest, uint64_t* out) {
  size_t i = 0;
  while (i < rest.size() && rest[i] == ' ') ++i;
  size_t j = i;
  uint64_t v = 0;
  while (j < rest.size() && std::isdigit(static_cast<unsigned char>(rest[j])))
    v = v * 10 + static_cast<uint64_t>(rest[j++] - '0');
  if (j == i) return false;
  const std::string_view unit = rest.substr(j);
  if (unit.find("kB") != std::string_view::npos) v <<= 10;
  *out = v;
  return true;
}

bool has_flag(std::string_view flags, std::string_view flag) {
  size_t i = 0;
  while (i < flags.size()) {
    while (i < flags.size() && flags[i] == ' ') ++i;
    size_t j = i;
    while (j < flags.size() && flags[j] != ' ') ++j;
    if (flags.substr(i, j - i) == flag) return true;
    i = j;
  }
  return false;
}

}  // namespace

SmapsTotals parse_smaps(std::string_view text, uintptr_t begin, uintptr_t end) {
  SmapsTotals t;
  bool inside = false;
  size_t eligible = 0;  // overlapping mappings that say THPeligible: 1
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);

    const size_t colon = line.find(':');
    const size_t space = line.find(' ');
    const bool field = colon != std::string_view::npos && (space == std::string_view::npos || colon < space);
    if (!field) {
      uintptr_t b = 0, e = 0;
      if (parse_header(line, &b, &e)) {
        inside = b < end && begin < e;
        if (inside) ++t.mappings;
      }
      continue;
    }
    if (!inside) continue;
    const std::string_view key = line.substr(0, colon), rest = line.substr(colon + 1);
    if (key == "VmFlags") {
      t.advised_huge = t.advised_huge || has_flag(rest, "hg");
      t.advised_no_huge = t.advised_no_huge || has_flag(rest, "nh");
      if (has_flag(rest, "dc")) ++t.dont_fork_mappings;
      else if (has_flag(rest, "sh")) ++t.shared_mappings;
      continue;
    }
    uint64_t v = 0;
    if (!parse_value(rest, &v)) continue;
    if (key == "Size")
      t.size_bytes += v;
    else if (key == "Rss")
      t.rss_bytes += v;
    else if (key == "AnonHugePages")
      t.anon_huge_bytes += v;
    else if (key == "ShmemPmdMapped" || key == "FilePmdMapped")
      t.pmd_mapped_bytes += v;
    else if (key == "Shared_Hugetlb" || key == "Private_Hugetlb")
      t.hugetlb_bytes += v;
    else if (key == "KernelPageSize")
      t.kernel_page_bytes = v > t.kernel_page_bytes ? v : t.kernel_page_bytes;
    else if (key == "THPeligible" && v == 1)
      ++eligible;
  }
  t.thp_eligible = t.mappings > 0 && eligible == t.mappings;
  return t;
}

int read_smaps(std::string* out) { return read_file("/proc/self/smaps", out, size_t{64} << 20); }

}  // namespace ferry::os
