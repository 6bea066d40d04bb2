// sysfs_fuzz.cpp — the sysfs/procfs value parsers (src/os/sysfs.cpp): THP settings
// and unsigned integers. Invariants: a THP setting is one word without blanks or
// brackets that occurs in the text; an unsigned integer prints back as the
// digits it was read from (without leading zeros).
#include <string>

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
  return 0;
}
