// smaps_fuzz.cpp — the /proc/self/smaps parser (src/os/smaps.cpp) on any text and
// any range (the first 16 bytes choose it). Invariants: no more overlapping
// mappings than header lines, eligibility only with mappings, and the whole
// address space sees at least as many mappings as any range.
#include <cstring>

#include "fuzz_common.h"
#include "os/smaps.h"

using namespace ferry;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uintptr_t begin = 0, end = 0;
  if (size >= 16) {
    std::memcpy(&begin, data, 8);
    std::memcpy(&end, data + 8, 8);
    data += 16;
    size -= 16;
  }
  const std::string text = fuzz::text(data, size);
  const os::SmapsTotals t = os::parse_smaps(text, begin, end);
  size_t lines = 1;
  for (char c : text) lines += c == '\n';
  fuzz::require(t.mappings <= lines, "more mappings than lines");
  fuzz::require(!t.thp_eligible || t.mappings > 0, "eligible without a mapping");
  const os::SmapsTotals all = os::parse_smaps(text, 0, UINTPTR_MAX);
  fuzz::require(all.mappings >= t.mappings, "a range sees more mappings than the whole space");
  return 0;
}
