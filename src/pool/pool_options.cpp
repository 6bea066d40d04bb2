// pool_options.cpp — PoolOptions: their ranges, their values from the FERRY_*
// option table, and the names of backings.
#include <string>

#include "core/error.h"
#include "core/options.h"
#include "os/sysfs.h"
#include "pool/pool_options.h"

namespace ferry {

const char* backing_name(Backing b) noexcept {
  switch (b) {
    case Backing::small_pages: return "small_pages";
    case Backing::thp: return "thp";
    case Backing::hugetlb_2m: return "hugetlb_2m";
    case Backing::hugetlb_1g: return "hugetlb_1g";
  }
  return "unknown";
}

namespace {

void check_range(const char* name, int64_t value, int64_t lo, int64_t hi, const char* meaning) {
  if (value < lo || value > hi)
    throw InvalidArgument("ferry pool: " + std::string(name) + "=" + std::to_string(value) +
                          ": expected " + std::to_string(lo) + " .. " + std::to_string(hi) + " (" +
                          meaning + ")");
}

}  // namespace

void PoolOptions::validate() const {
  check_chunk_bytes(chunk_bytes,
                    "ferry pool: chunk_bytes=" + std::to_string(chunk_bytes) + " (" + format_bytes(chunk_bytes) + ")");
  check_range("touch_threads", touch_threads, 0, kMaxThreads, "0 = one per core, at most 16");
  check_range("release_delay_ms", release_delay_ms, 0, kMaxReleaseDelayMs,
              "0 = only trim releases memory; at most a day");
  check_range("numa_node", numa_node, kNumaNeverBind, kMaxNumaNode, "-1 = no binding, -2 = never bind");
  // A target the machine cannot hold would only fail, or swap, later and
  // slowly; say so now.
  const uint64_t memory = os::physical_memory_bytes();
  if (target_bytes > 0 && memory > 0 && target_bytes > memory)
    throw OutOfMemory("ferry pool: target_bytes=" + std::to_string(target_bytes) + " (" +
                      format_bytes(target_bytes) + ") is more than this machine's memory (" +
                      format_bytes(memory) + ")");
}

HugePolicy parse_huge_policy(const std::string& text) {
  if (text == "auto") return HugePolicy::automatic;
  if (text == "hugetlb") return HugePolicy::hugetlb;
  if (text == "thp") return HugePolicy::thp;
  if (text == "off") return HugePolicy::off;
  throw InvalidArgument("huge_pages='" + text + "': expected auto, hugetlb, thp or off");
}

PoolOptions PoolOptions::from_options(const Options& o) {
  PoolOptions p;
  p.chunk_bytes = o.size("FERRY_CHUNK_SIZE");  // checked by the table (check_chunk_bytes)
  p.huge_pages = parse_huge_policy(o.text("FERRY_HUGE_PAGES"));
  p.limit_bytes = o.size("FERRY_POOL_LIMIT");
  p.release_batch_bytes = o.size("FERRY_RELEASE_BATCH");
  p.release_delay_ms = o.integer("FERRY_RELEASE_DELAY_MS");  // range-checked by the table
  p.touch_threads = static_cast<int>(o.integer("FERRY_TOUCH_THREADS"));
  p.zero_recycled = o.boolean("FERRY_ZERO_RECYCLED");
  return p;
}

PoolOptions PoolOptions::from_environment() { return from_options(options()); }

}  // namespace ferry
