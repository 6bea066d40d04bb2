// sysfs_fuzz.cpp — the sysfs/procfs value parsers (src/os/sysfs.cpp): THP settings,
// unsigned integers, cpulists and PCI bus ids. Invariants: a THP setting is one
// word without blanks or brackets that occurs in the text; an unsigned integer
// prints back as the digits it was read from (without leading zeros); a cpulist
// is sorted distinct ids in range, and the plain list it prints parses back the
// same; a normalized bus id is its own normal form.
#include <algorithm>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "os/sysfs.h"

using namespace ferry;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = fuzz::text(data, size);
  const std::string setting = os::parse_thp_setting(text);
  if (!setting.empty()) {
    fuzz::require(setting.find_first_of(" \t\n\r\f\v[]") == std::string::npos, "a setting with blanks or brackets");
    fuzz::require(text.find(setting) != std::string::npos, "a setting that is not in the text");
  }
  uint64_t v = 0;
  if (os::parse_unsigned(text, &v)) {
    const std::string digits = std::to_string(v);
    const size_t first = text.find_first_not_of(" \t\n\r\f\v0");
    fuzz::require(first != std::string::npos ? text.compare(first, digits.size(), digits) == 0 : v == 0,
                  "parse_unsigned does not read the digits");
  }
  std::vector<int> cpus;
  if (os::parse_cpulist(text, &cpus)) {
    fuzz::require(std::adjacent_find(cpus.begin(), cpus.end(), [](int a, int b) { return a >= b; }) == cpus.end(),
                  "a cpulist not sorted and distinct");
    fuzz::require(cpus.empty() || (cpus.front() >= 0 && cpus.back() <= os::kMaxCpuId), "a cpu id out of range");
    std::string plain;
    for (size_t i = 0; i < cpus.size(); ++i) plain += (i ? "," : "") + std::to_string(cpus[i]);
    std::vector<int> again;
    fuzz::require(os::parse_cpulist(plain, &again) && again == cpus, "a cpulist that does not print back");
  }
  const std::string bus = os::normalize_pci_bus_id(text);
  if (!bus.empty()) {
    fuzz::require(bus.size() >= 12 && bus.find('/') == std::string::npos, "a bus id that is no sysfs name");
    fuzz::require(os::normalize_pci_bus_id(bus) == bus, "a normalized bus id that is not its own normal form");
  }
  return 0;
}
