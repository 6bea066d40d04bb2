// options.h — ferry's options: one table of {name, default, doc}, read from
// FERRY_* environment variables once.
//
// Invariants: every FERRY_ variable in the environment names a row of the table
// (else InvalidArgument quoting it); every value parses by its row's type (else
// InvalidArgument quoting the value and what was expected). Parsing is a pure
// function of (name, value) pairs so that it is tested without touching environ.
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

struct OptionSpec {
  const char* name;           // environment variable, e.g. "FERRY_CHUNK_SIZE"
  const char* default_value;  // as it would be written in the environment
  const char* doc;            // one line for `ferry options` and docs
  OptionType type;
  const char* choices;        // for choice: "a|b|c"
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
int64_t parse_integer(const std::string& text, const std::string& what);

}  // namespace ferry
