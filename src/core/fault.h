// fault.h — fault injection: make a chosen real call fail, for error-path tests.
//
// Points: mmap, madvise, memfd (the OS layer), touch (first touch of a new chunk
// and the copy engine's staging copies), register (cudaHostRegister).
//
// Spec: "call:N" — the (N+1)-th call of that kind fails once; "call:N+" — every
// call after the first N fails. Several rules separated by ','. Calls: mmap,
// madvise, memfd, touch, register. Nothing else is faked: the call sites ask
// fault_injected() just before the real call and, if told to, report the errno
// (or CUDA error) a real failure would give.
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
};

// Pure: parse a spec; throws InvalidArgument quoting the bad part.
std::vector<FaultRule> parse_fault_spec(const std::string& spec);

// Replace the active rules and reset the counters ("" clears).
void set_fault_injection(const std::string& spec);

// Counts a call at `point`; true when this call must fail. Reads
// FERRY_FAULT_INJECT on first use.
bool fault_injected(FaultPoint point) noexcept;

const char* fault_point_name(FaultPoint point) noexcept;

}  // namespace ferry
