// options.cpp — the option table and its strict parser.
#include "core/options.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <optional>

#include "core/error.h"
#include "core/fault.h"

extern char** environ;

namespace ferry {
namespace {

// The one table. Keep it sorted by name; docs/options.md's Options table is generated
// from it by `ferry options --markdown` (tests/python/test_cli.py compares them).
const OptionSpec kOptions[] = {
    {"FERRY_CHUNK_SIZE", "64MiB",
     "bytes the arena reserves from the OS at a time (a multiple of 2 MiB)", OptionType::size,
     nullptr, 0, 0, check_chunk_bytes},
    {"FERRY_COPY_SPIN_US", "100",
     "how long idle copy threads keep looking for work before they sleep (a sleeping thread takes "
     "15-35 us to wake in a VM), 0 .. 1000000; 0 = sleep at once",
     OptionType::integer, nullptr, 0, 1'000'000},
    {"FERRY_COPY_STRATEGY", "auto",
     "force a copy strategy: auto, direct, staged, pin-in-place, hybrid, cuda, sm (sm: pinned memory only)",
     OptionType::choice, "auto|direct|staged|pin-in-place|hybrid|cuda|sm", 0, 0},
    {"FERRY_COPY_WORKERS", "0",
     "copy threads per crew, 0 .. 1024; 0 = one per usable core of the crew's NUMA node, at most 16 "
     "(one crew shared by every device's engine; on hosts with several NUMA nodes, one per node serving a GPU)",
     OptionType::integer, nullptr, 0, kMaxThreads},
    {"FERRY_FAULT_INJECT", "",
     "make chosen system or CUDA calls fail, for error-path tests: call:N[+][=ERRNO],... "
     "(calls: mmap, madvise, memfd, touch, register)",
     OptionType::text, nullptr, 0, 0},
    {"FERRY_HUGE_PAGES", "auto",
     "how huge chunks get huge pages: auto (hugetlb if reserved, else THP), hugetlb, thp, off",
     OptionType::choice, "auto|hugetlb|thp|off", 0, 0},
    {"FERRY_LOAD_DIRECT_IO", "auto",
     "checkpoint loads: O_DIRECT reads: auto (files mostly not in the page cache), never, always",
     OptionType::choice, "auto|never|always", 0, 0},
    {"FERRY_LOAD_SLOT", "16MiB", "checkpoint loads: bytes per read and per staging slot (a multiple of 4 KiB)",
     OptionType::size, nullptr, 0, 0},
    {"FERRY_LOAD_STAGING", "512MiB",
     "checkpoint loads: pinned staging memory per loader, the host memory a load adds", OptionType::size, nullptr,
     0, 0},
    {"FERRY_LOAD_THREADS", "0", "checkpoint loads: reader threads, 0 .. 1024; 0 = one per core, at most 16",
     OptionType::integer, nullptr, 0, kMaxThreads},
    {"FERRY_NODE_DIR", "",
     "node pools: the directory where the processes of a node find each other (their Unix sockets; this "
     "user's own, mode 0700); empty = /tmp/ferry-UID, UID the effective user id",
     OptionType::text, nullptr, 0, 0},
    {"FERRY_NODE_LOAD", "auto",
     "node loads (load_safetensors(node=)): each file's route: auto (each rank alone where the file is in the "
     "page cache, else through the node pool), pool, alone",
     OptionType::choice, "auto|pool|alone", 0, 0},
    {"FERRY_NODE_PIN_PIECE", "1GiB",
     "node pools: bytes of one cudaHostRegister, the unit a process pins of what it touches (a multiple of "
     "2 MiB; each call costs about 8 ms, docs/node.md)",
     OptionType::size, nullptr, 0, 0, check_chunk_bytes},
    {"FERRY_PROFILE", "",
     "machine profile file for the copy engine; empty = $XDG_CACHE_HOME/ferry/profile.txt "
     "(written by `ferry bench copy --calibrate`), built-in defaults when absent",
     OptionType::text, nullptr, 0, 0},
    {"FERRY_POOL_LIMIT", "0", "hard limit on bytes a pool reserves from the OS; 0 = none",
     OptionType::size, nullptr, 0, 0},
    {"FERRY_RELEASE_BATCH", "128MiB",
     "most bytes the background releaser returns to the OS per round", OptionType::size,
     nullptr, 0, 0},
    {"FERRY_RELEASE_DELAY_MS", "0",
     "background release: chunks free for this long go back to the OS, 0 .. 86400000 (a day); "
     "0 = only on trim",
     OptionType::integer, nullptr, 0, kMaxReleaseDelayMs},
    {"FERRY_TOUCH_THREADS", "0",
     "threads that first-touch a new chunk, 0 .. 1024; 0 = one per core, at most 16",
     OptionType::integer, nullptr, 0, kMaxThreads},
    {"FERRY_ZERO_RECYCLED", "0",
     "zero recycled memory before handing it out again (else it is uninitialized, like torch.empty; alloc(zero=True) clears one allocation)",
     OptionType::boolean, nullptr, 0, 0},
};

const OptionSpec* find_spec(const std::string& name) {
  for (const auto& s : kOptions)
    if (name == s.name) return &s;
  return nullptr;
}

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

void validate(const OptionSpec& spec, const std::string& value) {
  const std::string what = std::string(spec.name);
  switch (spec.type) {
    case OptionType::size: {
      const uint64_t bytes = parse_size(value, what);
      if (spec.check_size) spec.check_size(bytes, what + "='" + printable(value) + "'");
      break;
    }
    case OptionType::boolean: parse_bool(value, what); break;
    case OptionType::integer: parse_integer(value, what, spec.min_value, spec.max_value); break;
    case OptionType::text:
      if (what == "FERRY_FAULT_INJECT") {
        try {
          parse_fault_spec(value);
        } catch (const InvalidArgument& e) {
          throw InvalidArgument(what + "='" + printable(value) + "': " + e.what());
        }
      }
      break;
    case OptionType::choice: {
      std::string all = spec.choices, item;
      size_t pos = 0;
      while (pos <= all.size()) {
        size_t bar = all.find('|', pos);
        if (bar == std::string::npos) bar = all.size();
        if (all.substr(pos, bar - pos) == value) return;
        pos = bar + 1;
      }
      throw InvalidArgument(what + "='" + printable(value) + "': expected one of " + all);
    }
  }
}

}  // namespace

std::span<const OptionSpec> option_table() { return kOptions; }

void check_chunk_bytes(uint64_t bytes, const std::string& what) {
  if (bytes == 0 || bytes % kChunkBytesGranule != 0 || bytes > kMaxChunkBytes)
    throw InvalidArgument(what + ": expected a nonzero multiple of 2 MiB, at most 128 TiB");
}

uint64_t parse_size(const std::string& text, const std::string& what) {
  const std::string t = trim(text);
  auto bad = [&](const char* why) {
    return InvalidArgument(what + "='" + printable(text) + "': " + why +
                           " (expected a byte count such as 4096, 64MiB, 1G)");
  };
  if (t.empty() || !std::isdigit(static_cast<unsigned char>(t[0]))) throw bad("not a size");
  if (t.find('\0') != std::string::npos) throw bad("not a size");
  errno = 0;
  char* end = nullptr;
  unsigned long long n = std::strtoull(t.c_str(), &end, 10);
  if (errno == ERANGE) throw bad("too large");
  std::string unit = trim(end);
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  uint64_t mult = 1;
  if (unit.empty() || unit == "b")
    mult = 1;
  else if (unit == "k" || unit == "kb" || unit == "kib")
    mult = 1ull << 10;
  else if (unit == "m" || unit == "mb" || unit == "mib")
    mult = 1ull << 20;
  else if (unit == "g" || unit == "gb" || unit == "gib")
    mult = 1ull << 30;
  else if (unit == "t" || unit == "tb" || unit == "tib")
    mult = 1ull << 40;
  else
    throw bad("unknown unit");
  if (n > UINT64_MAX / mult) throw bad("too large");
  return n * mult;
}

bool parse_bool(const std::string& text, const std::string& what) {
  std::string t = trim(text);
  for (auto& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (t == "1" || t == "true" || t == "yes" || t == "on") return true;
  if (t == "0" || t == "false" || t == "no" || t == "off") return false;
  throw InvalidArgument(what + "='" + printable(text) + "': expected 1/0, true/false, yes/no or on/off");
}

int64_t parse_integer(const std::string& text, const std::string& what, int64_t min_value,
                      int64_t max_value) {
  const std::string t = trim(text);
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(t.c_str(), &end, 10);
  const bool digits = t.find('\0') == std::string::npos && !t.empty() && (std::isdigit(static_cast<unsigned char>(t[0])) ||
                                     ((t[0] == '-' || t[0] == '+') && t.size() > 1 &&
                                      std::isdigit(static_cast<unsigned char>(t[1]))));
  const bool bounded = min_value != INT64_MIN || max_value != INT64_MAX;
  const std::string range =
      bounded ? " " + std::to_string(min_value) + " .. " + std::to_string(max_value) : "";
  if (!digits || *end != '\0')
    throw InvalidArgument(what + "='" + printable(text) + "': expected an integer" + range);
  if (errno == ERANGE || v < min_value || v > max_value)
    throw InvalidArgument(what + "='" + printable(text) + "': out of range (expected an integer" + range + ")");
  return v;
}

Options Options::parse(const std::vector<std::pair<std::string, std::string>>& env) {
  Options o;
  for (const auto& s : kOptions) o.values_[s.name] = s.default_value;
  for (const auto& [name, value] : env) {
    if (name.rfind("FERRY_", 0) != 0) continue;
    const OptionSpec* spec = find_spec(name);
    if (!spec)
      throw InvalidArgument("unknown option " + printable(name) + "='" + printable(value) +
                            "' (run `ferry options` for the list)");
    validate(*spec, value);
    o.values_[name] = trim(value);
  }
  return o;
}

const std::string& Options::raw(const char* name, OptionType type) const {
  const OptionSpec* spec = find_spec(name);
  if (!spec || (spec->type != type && !(type == OptionType::text && spec->type == OptionType::choice)))
    throw InvalidArgument(std::string("internal: no option ") + name + " of that type");
  return values_.at(name);
}

uint64_t Options::size(const char* name) const { return parse_size(raw(name, OptionType::size), name); }
bool Options::boolean(const char* name) const { return parse_bool(raw(name, OptionType::boolean), name); }
int64_t Options::integer(const char* name) const {
  const OptionSpec* spec = find_spec(name);
  return parse_integer(raw(name, OptionType::integer), name, spec->min_value, spec->max_value);
}
const std::string& Options::text(const char* name) const { return raw(name, OptionType::text); }

const Options& options() {
  // Parsed once; a bad environment is remembered and reported on every call.
  static std::once_flag once;
  static std::optional<Options> parsed;
  static std::string failure;
  std::call_once(once, [] {
    std::vector<std::pair<std::string, std::string>> env;
    for (char** e = environ; e && *e; ++e) {
      std::string kv = *e;
      size_t eq = kv.find('=');
      if (eq != std::string::npos) env.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
    }
    try {
      parsed = Options::parse(env);
    } catch (const Error& e) {
      failure = e.what();
    }
  });
  if (!parsed) throw InvalidArgument(failure);
  return *parsed;
}

}  // namespace ferry
