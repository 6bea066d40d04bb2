// fault.cpp — the fault-injection rules and their counters.
#include "core/fault.h"

#include <array>
#include <cstdlib>
#include <mutex>

#include "core/error.h"
#include "core/options.h"

namespace ferry {
namespace {

constexpr const char* kNames[] = {"mmap", "madvise", "memfd", "touch", "register"};

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
    size_t colon = item.find(':');
    auto bad = [&](const char* why) {
      return InvalidArgument("fault injection rule '" + item + "': " + why +
                             " (expected call:N or call:N+, calls: mmap, madvise, memfd, touch, register)");
    };
    if (colon == std::string::npos) throw bad("missing ':'");
    std::string name = item.substr(0, colon), count = item.substr(colon + 1);
    FaultRule r{FaultPoint::count_, 0, false};
    for (int i = 0; i < static_cast<int>(FaultPoint::count_); ++i)
      if (name == kNames[i]) r.point = static_cast<FaultPoint>(i);
    if (r.point == FaultPoint::count_) throw bad("unknown call");
    if (!count.empty() && count.back() == '+') {
      r.persistent = true;
      count.pop_back();
    }
    char* end = nullptr;
    r.after = std::strtol(count.c_str(), &end, 10);
    if (count.empty() || *end != '\0' || r.after < 0) throw bad("N must be a count >= 0");
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

bool fault_injected(FaultPoint point) noexcept {
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
  if (s.rules.empty()) return false;
  long n = ++s.calls[static_cast<size_t>(point)];  // this call's number, from 1
  for (const auto& r : s.rules)
    if (r.point == point && (n == r.after + 1 || (r.persistent && n > r.after))) return true;
  return false;
}

}  // namespace ferry
