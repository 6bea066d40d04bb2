// fault.h — fault injection: make a chosen real call fail, for error-path tests.
//
// Points: mmap, madvise, memfd (the OS layer), touch (first touch of a new chunk
// and the copy engine's staging copies), register (cudaHostRegister).
//
// Spec: "call:N" — the (N+1)-th call of that kind fails once; "call:N+" — every
// call after the first N fails; either may end in "=ERRNO" (e.g. "madvise:0=EAGAIN")
// to choose the errno the OS layer reports instead of the call's usual one (a
// transient failure, for instance). Several rules separated by ','. Calls: mmap,
// madvise, memfd, touch, register. N is 0 .. 10^9, digits only. Nothing else is
// faked: the call sites ask fault_error() just before the real call and, if
// told to, report the errno (or CUDA error) a real failure would give.
//
// Locking: one mutex guards the rules and counters; no system call under it.
#pragma once

#include <string>
#include <vector>

namespace ferry {

enum class FaultPoint { mmap, madvise, memfd, touch, register_host, count_ };

struct FaultRule {
  FaultPoint point;
  long after;       // calls that succeed first
  bool persistent;  // keep failing after the first failure
  int error = 0;    // errno to report; 0 = the call site's usual one
};

inline constexpr long kMaxFaultCount = 1'000'000'000;

// Pure: parse a spec; throws InvalidArgument quoting the bad part.
std::vector<FaultRule> parse_fault_spec(const std::string& spec);

// Replace the active rules and reset the counters ("" clears).
void set_fault_injection(const std::string& spec);

// Counts a call at `point`; 0 when it runs, else the errno it must report
// (the rule's, or `usual_error`). Reads FERRY_FAULT_INJECT on first use.
int fault_error(FaultPoint point, int usual_error) noexcept;

// The same, for call sites that do not report an errno (CUDA calls).
inline bool fault_injected(FaultPoint point) noexcept { return fault_error(point, 1) != 0; }

const char* fault_point_name(FaultPoint point) noexcept;

}  // namespace ferry
