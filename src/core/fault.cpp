// fault.cpp — the fault-injection rules and their counters.
#include "core/fault.h"

#include <array>
#include <cerrno>
#include <cstdlib>
#include <mutex>

#include "core/error.h"
#include "core/fork.h"
#include "core/options.h"

namespace ferry {
namespace {

constexpr const char* kNames[] = {"mmap", "madvise", "memfd", "touch", "register"};

// The errno values a rule may name: those the wrapped calls can really return.
struct ErrnoName {
  const char* name;
  int value;
};
constexpr ErrnoName kErrnos[] = {{"EAGAIN", EAGAIN}, {"ENOMEM", ENOMEM}, {"EINVAL", EINVAL},
                                 {"EPERM", EPERM},   {"EACCES", EACCES}, {"EFAULT", EFAULT},
                                 {"EIO", EIO},       {"ENOSPC", ENOSPC}, {"EBUSY", EBUSY},
                                 {"EMFILE", EMFILE}};

// N of a rule: digits only (no sign, no blanks), at most kMaxFaultCount.
bool parse_count(const std::string& text, long* out) {
  if (text.empty() || text.size() > 10) return false;
  long v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  if (v > kMaxFaultCount) return false;
  *out = v;
  return true;
}

int parse_errno(const std::string& text) {
  for (const auto& e : kErrnos)
    if (text == e.name) return e.value;
  return 0;
}

struct State {
  std::mutex mu;
  bool loaded = false;
  std::vector<FaultRule> rules;                                     // guarded by mu
  std::array<long, static_cast<size_t>(FaultPoint::count_)> calls{};  // guarded by mu
};

State& state() {
  static State s;
  return s;
}

// A forked child may inject faults: the lock is held across fork(), registered
// at load (fork.h says why not on first use).
[[maybe_unused]] const bool g_state_held_across_fork = (hold_across_fork(&state().mu), true);

}  // namespace

const char* fault_point_name(FaultPoint p) noexcept { return kNames[static_cast<int>(p)]; }

std::vector<FaultRule> parse_fault_spec(const std::string& spec) {
  std::vector<FaultRule> rules;
  size_t pos = 0;
  while (pos < spec.size()) {
    size_t comma = spec.find(',', pos);
    if (comma == std::string::npos) comma = spec.size();
    std::string item = spec.substr(pos, comma - pos);
    pos = comma + 1;
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    if (item.empty()) continue;
    auto bad = [&](const std::string& why) {
      return InvalidArgument("fault injection rule '" + printable(item) + "': " + why +
                             " (expected call:N, call:N+, optionally =ERRNO; calls: mmap, madvise, "
                             "memfd, touch, register)");
    };
    const size_t colon = item.find(':');
    if (colon == std::string::npos) throw bad("missing ':'");
    std::string name = item.substr(0, colon), count = item.substr(colon + 1);
    FaultRule r{FaultPoint::count_, 0, false, 0};
    for (int i = 0; i < static_cast<int>(FaultPoint::count_); ++i)
      if (name == kNames[i]) r.point = static_cast<FaultPoint>(i);
    if (r.point == FaultPoint::count_) throw bad("unknown call");
    if (const size_t eq = count.find('='); eq != std::string::npos) {
      const std::string err = count.substr(eq + 1);
      r.error = parse_errno(err);
      if (r.error == 0) {
        std::string names;
        for (const auto& e : kErrnos) names += std::string(names.empty() ? "" : ", ") + e.name;
        throw bad("unknown errno '" + err + "' (known: " + names + ")");
      }
      count.resize(eq);
    }
    if (!count.empty() && count.back() == '+') {
      r.persistent = true;
      count.pop_back();
    }
    if (!parse_count(count, &r.after))
      throw bad("N must be a count 0 .. " + std::to_string(kMaxFaultCount) + ", digits only");
    rules.push_back(r);
  }
  return rules;
}

void set_fault_injection(const std::string& spec) {
  auto rules = parse_fault_spec(spec);  // throws before changing anything
  State& s = state();
  std::lock_guard lock(s.mu);
  s.rules = std::move(rules);
  s.calls.fill(0);
  s.loaded = true;
}

int fault_error(FaultPoint point, int usual_error) noexcept {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (!s.loaded) {
    s.loaded = true;
    const char* env = std::getenv("FERRY_FAULT_INJECT");
    try {
      if (env) s.rules = parse_fault_spec(env);
    } catch (...) {
      // A bad spec is reported by options(); here it injects nothing.
    }
  }
  if (s.rules.empty()) return 0;
  long n = ++s.calls[static_cast<size_t>(point)];  // this call's number, from 1
  for (const auto& r : s.rules)
    if (r.point == point && (n == r.after + 1 || (r.persistent && n > r.after)))
      return r.error != 0 ? r.error : usual_error;
  return 0;
}

}  // namespace ferry
