// fault_fuzz.cpp — fault-injection specs (FERRY_FAULT_INJECT, set_fault_injection).
// Invariants: every accepted rule has a known call, a count within 0 .. 10^9 and
// an errno from the known list or 0.
#include "core/fault.h"
#include "fuzz_common.h"

using namespace ferry;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<FaultRule> rules;
  if (!fuzz::accepted([&] { rules = parse_fault_spec(fuzz::text(data, size)); })) return 0;
  for (const FaultRule& r : rules) {
    fuzz::require(r.point != FaultPoint::count_, "a rule without a call");
    fuzz::require(r.after >= 0 && r.after <= kMaxFaultCount, "a count out of range");
    fuzz::require(r.error >= 0 && r.error < 200, "an errno out of range");
    fuzz::require(fault_point_name(r.point) != nullptr, "a call without a name");
  }
  return 0;
}
