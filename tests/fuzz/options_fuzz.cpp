// options_fuzz.cpp — FERRY_* option values: Options::parse over "NAME=VALUE"
// lines, and the value parsers with the table's ranges. Invariants: an accepted
// value parses again to the same result and lies in its row's range.
#include <string>
#include <utility>
#include <vector>

#include "core/options.h"
#include "fuzz_common.h"

using namespace ferry;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input = fuzz::text(data, size);
  std::vector<std::pair<std::string, std::string>> env;
  size_t pos = 0;
  while (pos <= input.size()) {
    size_t nl = input.find('\n', pos);
    if (nl == std::string::npos) nl = input.size();
    const std::string line = input.substr(pos, nl - pos);
    pos = nl + 1;
    const size_t eq = line.find('=');
    if (eq != std::string::npos) env.emplace_back(line.substr(0, eq), line.substr(eq + 1));
  }
  Options parsed;
  if (fuzz::accepted([&] { parsed = Options::parse(env); })) {
    for (const OptionSpec& s : option_table()) {
      switch (s.type) {
        case OptionType::size: parsed.size(s.name); break;
        case OptionType::boolean: parsed.boolean(s.name); break;
        case OptionType::integer: {
          const int64_t v = parsed.integer(s.name);
          fuzz::require(v >= s.min_value && v <= s.max_value, "an accepted integer option is out of its range");
          break;
        }
        case OptionType::choice:
        case OptionType::text: parsed.text(s.name); break;
      }
    }
  }
  for (const auto& entry : env) {
    const std::string& name = entry.first;
    const std::string& value = entry.second;
    uint64_t bytes = 0;
    if (fuzz::accepted([&] { bytes = parse_size(value, name); })) {
      uint64_t again = 0;
      fuzz::require(fuzz::accepted([&] { again = parse_size(value, name); }) && again == bytes,
                    "parse_size is not a function of its text");
    }
    int64_t n = 0;
    if (fuzz::accepted([&] { n = parse_integer(value, name, -1000, kMaxReleaseDelayMs); }))
      fuzz::require(n >= -1000 && n <= kMaxReleaseDelayMs, "parse_integer broke its range");
    fuzz::accepted([&] { parse_bool(value, name); });
  }
  return 0;
}
