// options.h — ferry's options: one table of {name, default, doc}, read from
// FERRY_* environment variables once.
//
// Invariants: every FERRY_ variable in the environment names a row of the table
// (else InvalidArgument quoting it); every value parses by its row's type and
// lies in its row's range (else InvalidArgument quoting the value and what was
// expected). Counts and durations are range-checked here, where they are
// parsed, so no caller converts an out-of-range value (a 10^13 ms release
// delay once overflowed into a busy loop). Parsing is a pure function of
// (name, value) pairs so that it is tested without touching environ.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace ferry {

enum class OptionType { size, boolean, integer, choice, text };

// Ranges shared by the option table and the option structs it fills (the
// pool checks the same bounds for values that come from code, not FERRY_*).
// A release delay longer than a day is no different from "only trim" (0),
// and a bounded delay keeps every ms -> ns conversion far from overflow.
inline constexpr int64_t kMaxReleaseDelayMs = 86'400'000;
inline constexpr int64_t kMaxThreads = 1024;  // touch and copy threads

// A chunk size (FERRY_CHUNK_SIZE, PoolOptions::chunk_bytes): a nonzero multiple
// of 2 MiB, at most the x86-64 user address space. check_chunk_bytes() is the
// one check of both: ferry.check_options() and Pool() agree (issue 21, item 8).
// Throws InvalidArgument: `what` (which names the value) + what was expected.
inline constexpr uint64_t kChunkBytesGranule = uint64_t{2} << 20;
inline constexpr uint64_t kMaxChunkBytes = uint64_t{1} << 47;
void check_chunk_bytes(uint64_t bytes, const std::string& what);

struct OptionSpec {
  const char* name;           // environment variable, e.g. "FERRY_CHUNK_SIZE"
  const char* default_value;  // as it would be written in the environment
  const char* doc;            // one line for `ferry options` and docs
  OptionType type;
  const char* choices;        // for choice: "a|b|c"
  int64_t min_value;          // for integer: the accepted range, inclusive
  int64_t max_value;
  // For size: a further check of the parsed value (e.g. check_chunk_bytes), or null.
  void (*check_size)(uint64_t bytes, const std::string& what) = nullptr;
};

std::span<const OptionSpec> option_table();

// Parsed values, by option name. Getters throw InvalidArgument for a name that
// is not in the table (a bug in the caller) or of another type.
class Options {
 public:
  // Pure: parse (name, value) pairs; names not starting with FERRY_ are ignored.
  static Options parse(const std::vector<std::pair<std::string, std::string>>& env);

  uint64_t size(const char* name) const;
  bool boolean(const char* name) const;
  int64_t integer(const char* name) const;
  const std::string& text(const char* name) const;  // choice and text options

 private:
  const std::string& raw(const char* name, OptionType type) const;
  std::map<std::string, std::string> values_;  // validated text, defaults filled in
};

// The process's options, parsed from the environment on first call.
// Throws InvalidArgument (every call, not only the first) if the environment is bad.
const Options& options();

// Value parsers, exposed for tests. Throw InvalidArgument naming `what`.
uint64_t parse_size(const std::string& text, const std::string& what);
bool parse_bool(const std::string& text, const std::string& what);
// Decimal integer in [min_value, max_value]; the message gives the range.
int64_t parse_integer(const std::string& text, const std::string& what,
                      int64_t min_value = INT64_MIN, int64_t max_value = INT64_MAX);

}  // namespace ferry
