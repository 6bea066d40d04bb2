// managed_options.cpp — names, option strings and the oversubscription guard of
// the PyTorch allocators (managed/managed_options.h).
#include "managed/managed_options.h"

#include <set>
#include <vector>

#include "core/error.h"
#include "core/options.h"  // parse_size, parse_bool
#include "managed/managed_pool.h"

namespace ferry {

namespace {

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t' || s[b] == '\n')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t' || s[e - 1] == '\n')) --e;
  return std::string(s.substr(b, e - b));
}

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    size_t at = s.find(sep, start);
    out.push_back(trim(s.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start)));
    if (at == std::string_view::npos) break;
    start = at + 1;
  }
  return out;
}

const char* keys_of(ManagedKind kind) {
  switch (kind) {
    case ManagedKind::device: return "none (the device allocator takes no options)";
    case ManagedKind::managed: return "prefetch, advise, oversubscribe";
    case ManagedKind::managed_pool: return "prefetch, advise, oversubscribe, chunk_bytes, stream_wait";
  }
  return "";
}

bool takes(ManagedKind kind, const std::string& key) {
  if (kind == ManagedKind::device) return false;
  if (key == "prefetch" || key == "advise" || key == "oversubscribe") return true;
  return kind == ManagedKind::managed_pool && (key == "chunk_bytes" || key == "stream_wait");
}

const char* prefetch_name(PrefetchMode m) {
  switch (m) {
    case PrefetchMode::none: return "0";
    case PrefetchMode::alloc: return "alloc";
    case PrefetchMode::chunk: return "chunk";
  }
  return "?";
}

}  // namespace

const char* managed_kind_name(ManagedKind kind) noexcept {
  switch (kind) {
    case ManagedKind::device: return "device";
    case ManagedKind::managed: return "managed";
    case ManagedKind::managed_pool: return "managed_pool";
  }
  return "?";
}

ManagedKind parse_managed_kind(std::string_view name) {
  if (name == "device") return ManagedKind::device;
  if (name == "managed") return ManagedKind::managed;
  if (name == "managed_pool") return ManagedKind::managed_pool;
  throw InvalidArgument("unknown allocator '" + std::string(name) +
                        "': expected device, managed or managed_pool");
}

ManagedOptions default_managed_options(ManagedKind kind) {
  ManagedOptions o;
  if (kind == ManagedKind::managed_pool) o.prefetch = PrefetchMode::alloc;
  return o;
}

std::string ManagedOptions::text(ManagedKind kind) const {
  if (kind == ManagedKind::device) return "";
  std::string advise;
  if (preferred_location) advise += "preferred_location";
  if (accessed_by) advise += std::string(advise.empty() ? "" : "+") + "accessed_by";
  if (read_mostly) advise += std::string(advise.empty() ? "" : "+") + "read_mostly";
  if (advise.empty()) advise = "none";
  std::string t = std::string("prefetch=") +
                  (kind == ManagedKind::managed ? (prefetch == PrefetchMode::none ? "0" : "1")
                                                : prefetch_name(prefetch)) +
                  ",advise=" + advise + ",oversubscribe=" + (oversubscribe ? "1" : "0");
  if (kind == ManagedKind::managed_pool)
    t += ",chunk_bytes=" + std::to_string(chunk_bytes) + ",stream_wait=" + (stream_wait ? "1" : "0");
  return t;
}

ManagedOptions parse_managed_options(ManagedKind kind, std::string_view text) {
  const std::string who = std::string(managed_kind_name(kind)) + " allocator";
  ManagedOptions o = default_managed_options(kind);
  if (trim(text).empty()) return o;
  std::set<std::string> seen;
  for (const std::string& item : split(text, ',')) {
    if (item.empty()) continue;  // "a=1,,b=2" and a trailing comma are fine
    const size_t eq = item.find('=');
    if (eq == std::string::npos)
      throw InvalidArgument(who + ": option '" + item + "' is not key=value");
    const std::string key = trim(std::string_view(item).substr(0, eq));
    const std::string value = trim(std::string_view(item).substr(eq + 1));
    if (!takes(kind, key))
      throw InvalidArgument(who + ": unknown option '" + key + "' in '" + std::string(text) +
                            "' (options: " + keys_of(kind) + ")");
    if (!seen.insert(key).second)
      throw InvalidArgument(who + ": option '" + key + "' is given twice in '" + std::string(text) + "'");
    const std::string what = who + " option " + key;
    if (key == "prefetch") {
      if (kind == ManagedKind::managed_pool && (value == "alloc" || value == "chunk" || value == "none")) {
        o.prefetch = value == "alloc" ? PrefetchMode::alloc
                     : value == "chunk" ? PrefetchMode::chunk : PrefetchMode::none;
      } else {
        bool on;
        try {
          on = parse_bool(value, what);
        } catch (const InvalidArgument&) {
          throw InvalidArgument(what + "='" + value + "': expected " +
                                (kind == ManagedKind::managed_pool ? "0, 1, none, alloc or chunk"
                                                                   : "0 or 1 (true/false, yes/no, on/off)"));
        }
        o.prefetch = on ? PrefetchMode::alloc : PrefetchMode::none;
      }
    } else if (key == "advise") {
      o.preferred_location = o.accessed_by = o.read_mostly = false;
      if (value == "none" || value.empty()) continue;
      for (const std::string& a : split(value, '+')) {
        if (a == "preferred_location") o.preferred_location = true;
        else if (a == "accessed_by") o.accessed_by = true;
        else if (a == "read_mostly") o.read_mostly = true;
        else
          throw InvalidArgument(what + "='" + value + "': unknown advice '" + a +
                                "' (expected none, or preferred_location, accessed_by, read_mostly joined by '+')");
      }
    } else if (key == "oversubscribe") {
      o.oversubscribe = parse_bool(value, what);
    } else if (key == "chunk_bytes") {
      const uint64_t n = parse_size(value, what);
      if (n == 0 || n % ManagedPool::kGranule != 0)
        throw InvalidArgument(what + "='" + value + "': must be a positive multiple of 2 MiB");
      o.chunk_bytes = n;
    } else if (key == "stream_wait") {
      o.stream_wait = parse_bool(value, what);
    }
  }
  return o;
}

void check_managed_budget(size_t asked, size_t free_bytes, size_t total_bytes,
                          size_t live_managed_bytes, bool oversubscribe, const std::string& what) {
  if (oversubscribe) return;
  const std::string fix =
      "; pass oversubscribe=1 to allow it (oversubscribed managed memory pages to the host and "
      "can hang a shared GPU)";
  if (asked > free_bytes)
    throw OutOfMemory(what + ": refused to ask cudaMallocManaged for " + format_bytes(asked) + " (" +
                      std::to_string(asked) + " B): the device reports only " + format_bytes(free_bytes) +
                      " (" + std::to_string(free_bytes) + " B) free of " + format_bytes(total_bytes) + fix);
  if (live_managed_bytes + asked > total_bytes)
    throw OutOfMemory(what + ": refused to ask cudaMallocManaged for " + format_bytes(asked) + " (" +
                      std::to_string(asked) + " B): ferry already holds " + format_bytes(live_managed_bytes) +
                      " of managed memory on this device, and both together exceed its " +
                      format_bytes(total_bytes) + " (" + format_bytes(free_bytes) + " free)" + fix);
}

}  // namespace ferry
