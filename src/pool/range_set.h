// range_set.h — the available (not in use) memory of one page kind: pure
// bookkeeping of address ranges, no memory behind it, tested table-driven.
//
// Two views of the same bytes:
//  - runs: maximal stretches of available memory inside one chunk (runs of
//    different chunks never merge, even when the chunks happen to be adjacent
//    in the address space). Allocation carves from runs; indexed by address
//    and by (size, address) for best fit.
//  - spans: the run's bytes by state, coalesced with neighbours of the same
//    state inside the same run:
//      zero      never handed out since the chunk was touched; reads as zero
//      dirty     freed after use ("cached"); must be zeroed if zero_recycled
//      released  returned to the OS (MADV_DONTNEED / MADV_REMOVE); reads as zero
//    In-use and releasing memory is not in the set at all (the pool holds it).
//
// Invariants (check() verifies them): runs do not overlap; adjacent runs
// belong to different chunks; by_size_ indexes exactly the runs; the spans
// tile the runs exactly; adjacent spans in one run differ in state;
// bytes_[state] is the sum of the spans of that state.
//
// Locking: none; the owner (the pool) guards a RangeSet with its mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace ferry {

enum class SpanState : uint8_t { zero = 0, dirty = 1, released = 2 };
const char* span_state_name(SpanState s) noexcept;

struct Span {
  uintptr_t begin = 0;
  size_t size = 0;
  SpanState state = SpanState::zero;
  uintptr_t end() const { return begin + size; }
  bool operator==(const Span&) const = default;
};

struct Run {
  uintptr_t begin = 0;
  size_t size = 0;
  uintptr_t chunk = 0;  // base of the chunk it lies in
  bool operator==(const Run&) const = default;
};

// What a take removed from the set.
struct Carved {
  uintptr_t begin = 0;
  size_t size = 0;
  uintptr_t chunk = 0;
  size_t bytes[3] = {};  // by SpanState
  size_t bytes_in(SpanState s) const { return bytes[static_cast<int>(s)]; }
};

class RangeSet {
 public:
  // Adds [begin, begin + size) of the chunk based at `chunk` in `state`,
  // merging with neighbouring runs of the same chunk and neighbouring spans of
  // the same state. Preconditions: size > 0; the range overlaps nothing in the set.
  void insert(uintptr_t chunk, uintptr_t begin, size_t size, SpanState state);

  // Best fit: among the runs that can hold `size` bytes at `alignment`, the
  // smallest, then the lowest address; the range is carved at the first
  // aligned address of that run. Appends the dirty parts of the result to
  // `dirty` when given. nullopt when no run fits.
  // Preconditions: size > 0; alignment a power of two.
  std::optional<Carved> take_best_fit(size_t size, size_t alignment, std::vector<Span>* dirty = nullptr);

  // Removes [begin, begin + size), appending the spans it held to `spans` when
  // given. Preconditions: the range lies inside one run.
  Carved take_exact(uintptr_t begin, size_t size, std::vector<Span>* spans = nullptr);

  // Stretches of available, not released memory (zero and dirty spans side by
  // side form one stretch) inside [begin, end), cut to `page` boundaries, by
  // address, at most `max_bytes` in all (the last one cut to the whole pages
  // that cover what is left of max_bytes). For trim.
  // Preconditions: page a power of two.
  std::vector<Run> releasable(uintptr_t begin, uintptr_t end, size_t page, size_t max_bytes) const;

  size_t bytes_in(SpanState s) const { return bytes_[static_cast<int>(s)]; }
  size_t available_bytes() const { return bytes_[0] + bytes_[1] + bytes_[2]; }

  // For tests and diagnostics.
  std::vector<Run> runs() const;
  std::vector<Span> spans() const;
  std::string check() const;  // "" when the invariants hold, else the first broken one

 private:
  struct RunInfo {
    size_t size;
    uintptr_t chunk;
  };
  struct SpanInfo {
    size_t size;
    SpanState state;
  };
  using RunMap = std::map<uintptr_t, RunInfo>;
  using SpanMap = std::map<uintptr_t, SpanInfo>;

  Carved take_from_run(RunMap::iterator run, uintptr_t begin, size_t size, std::vector<Span>* spans,
                       bool dirty_only);
  void add_run(uintptr_t begin, size_t size, uintptr_t chunk);
  void split_span_at(uintptr_t at);

  RunMap runs_;                                   // by begin
  std::set<std::pair<size_t, uintptr_t>> by_size_;  // (size, begin) of every run
  SpanMap spans_;                                 // by begin
  size_t bytes_[3] = {};                          // by SpanState
};

}  // namespace ferry
