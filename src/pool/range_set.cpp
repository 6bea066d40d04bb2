// range_set.cpp — runs, spans and best fit.
#include "pool/range_set.h"

#include <algorithm>
#include <cassert>
#include <iterator>

namespace ferry {
namespace {

int index(SpanState s) { return static_cast<int>(s); }
uintptr_t align_up(uintptr_t v, size_t a) { return (v + a - 1) & ~(uintptr_t{a} - 1); }
uintptr_t align_down(uintptr_t v, size_t a) { return v & ~(uintptr_t{a} - 1); }

}  // namespace

const char* span_state_name(SpanState s) noexcept {
  switch (s) {
    case SpanState::zero: return "zero";
    case SpanState::dirty: return "dirty";
    case SpanState::released: return "released";
  }
  return "?";
}

void RangeSet::add_run(uintptr_t begin, size_t size, uintptr_t chunk) {
  runs_.emplace(begin, RunInfo{size, chunk});
  by_size_.emplace(size, begin);
}

void RangeSet::insert(uintptr_t chunk, uintptr_t begin, size_t size, SpanState state) {
  assert(size > 0);
  const uintptr_t end = begin + size;

  // Runs: absorb the neighbours of the same chunk.
  uintptr_t run_begin = begin;
  size_t run_size = size;
  auto next = runs_.lower_bound(begin);
  assert(next == runs_.end() || next->first >= end);
  if (next != runs_.end() && next->first == end && next->second.chunk == chunk) {
    run_size += next->second.size;
    by_size_.erase({next->second.size, next->first});
    next = runs_.erase(next);
  }
  if (next != runs_.begin()) {
    auto prev = std::prev(next);
    assert(prev->first + prev->second.size <= begin);
    if (prev->first + prev->second.size == begin && prev->second.chunk == chunk) {
      run_begin = prev->first;
      run_size += prev->second.size;
      by_size_.erase({prev->second.size, prev->first});
      runs_.erase(prev);
    }
  }
  add_run(run_begin, run_size, chunk);
  const uintptr_t run_end = run_begin + run_size;

  // Spans: absorb the neighbours of the same state inside the (merged) run.
  uintptr_t span_begin = begin;
  size_t span_size = size;
  auto after = spans_.lower_bound(begin);
  if (after != spans_.end() && after->first == end && end < run_end && after->second.state == state) {
    span_size += after->second.size;
    after = spans_.erase(after);
  }
  if (after != spans_.begin() && begin > run_begin) {
    auto before = std::prev(after);
    if (before->second.state == state) {
      span_begin = before->first;
      span_size += before->second.size;
      after = spans_.erase(before);
    }
  }
  spans_.emplace_hint(after, span_begin, SpanInfo{span_size, state});
  bytes_[index(state)] += size;
}

void RangeSet::split_span_at(uintptr_t at) {
  auto it = spans_.upper_bound(at);
  if (it == spans_.begin()) return;
  --it;
  const uintptr_t begin = it->first;
  const size_t size = it->second.size;
  if (begin < at && at < begin + size) {
    it->second.size = at - begin;
    spans_.emplace_hint(std::next(it), at, SpanInfo{begin + size - at, it->second.state});
  }
}

Carved RangeSet::take_from_run(RunMap::iterator run, uintptr_t begin, size_t size,
                               std::vector<Span>* spans, bool dirty_only) {
  const uintptr_t run_begin = run->first;
  const RunInfo info = run->second;
  const uintptr_t end = begin + size, run_end = run_begin + info.size;
  assert(run_begin <= begin && end <= run_end);
  by_size_.erase({info.size, run_begin});
  runs_.erase(run);
  if (begin > run_begin) add_run(run_begin, begin - run_begin, info.chunk);
  if (end < run_end) add_run(end, run_end - end, info.chunk);

  split_span_at(begin);
  split_span_at(end);
  Carved carved;
  carved.begin = begin;
  carved.size = size;
  carved.chunk = info.chunk;
  for (auto it = spans_.find(begin); it != spans_.end() && it->first < end;) {
    const SpanState state = it->second.state;
    carved.bytes[index(state)] += it->second.size;
    bytes_[index(state)] -= it->second.size;
    if (spans && (!dirty_only || state == SpanState::dirty))
      spans->push_back(Span{it->first, it->second.size, state});
    it = spans_.erase(it);
  }
  return carved;
}

std::optional<Carved> RangeSet::take_best_fit(size_t size, size_t alignment, std::vector<Span>* dirty) {
  assert(size > 0 && alignment > 0 && (alignment & (alignment - 1)) == 0);
  for (auto it = by_size_.lower_bound({size, 0}); it != by_size_.end(); ++it) {
    const auto [run_size, run_begin] = *it;
    const uintptr_t aligned = align_up(run_begin, alignment);
    if (aligned - run_begin > run_size - size) continue;  // padding leaves too little
    return take_from_run(runs_.find(run_begin), aligned, size, dirty, true);
  }
  return std::nullopt;
}

Carved RangeSet::take_exact(uintptr_t begin, size_t size, std::vector<Span>* spans) {
  auto run = runs_.upper_bound(begin);
  assert(run != runs_.begin());
  --run;
  return take_from_run(run, begin, size, spans, false);
}

std::vector<Run> RangeSet::releasable(uintptr_t begin, uintptr_t end, size_t page,
                                      size_t max_bytes) const {
  std::vector<Run> out;
  size_t total = 0;
  auto add = [&](uintptr_t stretch_begin, uintptr_t stretch_end, uintptr_t chunk) {
    const uintptr_t a = align_up(stretch_begin, page), b = align_down(stretch_end, page);
    if (b <= a || total >= max_bytes) return;
    const size_t left = max_bytes - total;
    const size_t n = left >= b - a ? b - a : std::min<size_t>(b - a, align_up(left, page));
    out.push_back(Run{a, n, chunk});
    total += n;
  };
  auto run = runs_.upper_bound(begin);
  if (run != runs_.begin() && std::prev(run)->first + std::prev(run)->second.size > begin) --run;
  for (; run != runs_.end() && run->first < end && total < max_bytes; ++run) {
    const uintptr_t run_begin = std::max(run->first, begin);
    const uintptr_t run_end = std::min(run->first + run->second.size, end);
    auto span = std::prev(spans_.upper_bound(run_begin));
    bool in_stretch = false;
    uintptr_t stretch_begin = 0;
    for (; span != spans_.end() && span->first < run_end; ++span) {
      const uintptr_t span_begin = std::max(span->first, run_begin);
      if (span->second.state == SpanState::released) {
        if (in_stretch) add(stretch_begin, span_begin, run->second.chunk);
        in_stretch = false;
      } else if (!in_stretch) {
        in_stretch = true;
        stretch_begin = span_begin;
      }
    }
    if (in_stretch) add(stretch_begin, run_end, run->second.chunk);
  }
  return out;
}

std::vector<Run> RangeSet::runs() const {
  std::vector<Run> out;
  for (const auto& [begin, info] : runs_) out.push_back(Run{begin, info.size, info.chunk});
  return out;
}

std::vector<Span> RangeSet::spans() const {
  std::vector<Span> out;
  for (const auto& [begin, info] : spans_) out.push_back(Span{begin, info.size, info.state});
  return out;
}

std::string RangeSet::check() const {
  if (by_size_.size() != runs_.size()) return "by_size index and runs differ in count";
  size_t totals[3] = {};
  auto span = spans_.begin();
  uintptr_t previous_end = 0, previous_chunk = 0;
  bool first = true;
  for (const auto& [begin, info] : runs_) {
    const std::string where = "run at " + std::to_string(begin);
    if (info.size == 0) return where + " is empty";
    if (!by_size_.count({info.size, begin})) return where + " is missing from the size index";
    if (!first && begin < previous_end) return where + " overlaps the previous run";
    if (!first && begin == previous_end && info.chunk == previous_chunk)
      return where + " touches a run of the same chunk and was not merged";
    const uintptr_t end = begin + info.size;
    uintptr_t at = begin;
    bool first_span = true;
    SpanState previous_state = SpanState::zero;
    while (at < end) {
      if (span == spans_.end() || span->first != at) return where + ": spans do not tile it";
      if (!first_span && span->second.state == previous_state)
        return where + ": adjacent spans of the same state were not merged";
      if (span->first + span->second.size > end) return where + ": a span crosses its end";
      totals[index(span->second.state)] += span->second.size;
      previous_state = span->second.state;
      first_span = false;
      at += span->second.size;
      ++span;
    }
    previous_end = end;
    previous_chunk = info.chunk;
    first = false;
  }
  if (span != spans_.end()) return "a span lies outside every run";
  for (int s = 0; s < 3; ++s)
    if (totals[s] != bytes_[s])
      return std::string("byte count of state ") + span_state_name(static_cast<SpanState>(s)) + " is off";
  return "";
}

}  // namespace ferry
