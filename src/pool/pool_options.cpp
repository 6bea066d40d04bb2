// pool_options.cpp — PoolOptions from the FERRY_* option table, and the
// names of backings.
#include <string>

#include "core/error.h"
#include "core/options.h"
#include "pool/pool.h"

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

PoolOptions PoolOptions::from_options(const Options& o) {
  PoolOptions p;
  p.chunk_bytes = o.size("FERRY_CHUNK_SIZE");
  if (p.chunk_bytes == 0 || p.chunk_bytes % (size_t{2} << 20) != 0)
    throw InvalidArgument("FERRY_CHUNK_SIZE=" + std::to_string(p.chunk_bytes) + " (" +
                          format_bytes(p.chunk_bytes) + "): expected a nonzero multiple of 2 MiB");
  const std::string& huge = o.text("FERRY_HUGE_PAGES");
  p.huge_pages = huge == "hugetlb" ? HugePolicy::hugetlb
                 : huge == "thp"   ? HugePolicy::thp
                 : huge == "off"   ? HugePolicy::off
                                   : HugePolicy::automatic;
  p.limit_bytes = o.size("FERRY_POOL_LIMIT");
  p.release_batch_bytes = o.size("FERRY_RELEASE_BATCH");
  p.release_delay_ms = o.integer("FERRY_RELEASE_DELAY_MS");
  if (p.release_delay_ms < 0)
    throw InvalidArgument("FERRY_RELEASE_DELAY_MS=" + std::to_string(p.release_delay_ms) +
                          ": expected milliseconds >= 0 (0 = only trim releases memory)");
  const int64_t threads = o.integer("FERRY_TOUCH_THREADS");
  if (threads < 0 || threads > 1024)
    throw InvalidArgument("FERRY_TOUCH_THREADS=" + std::to_string(threads) +
                          ": expected 0 (one per core, at most 16) .. 1024");
  p.touch_threads = static_cast<int>(threads);
  p.zero_recycled = o.boolean("FERRY_ZERO_RECYCLED");
  return p;
}

PoolOptions PoolOptions::from_environment() { return from_options(options()); }

}  // namespace ferry
