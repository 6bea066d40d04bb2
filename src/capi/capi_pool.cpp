// capi_pool.cpp — C API over ferry::Pool and the pinned pool.
#include <string>

#include "capi/guard.h"
#include "capi/struct_size.h"
#include "cuda/pinned_pool.h"
#include "pool/pool.h"

using ferry::capi::guarded;
using ferry::capi::live;
using ferry::capi::read_struct;
using ferry::capi::require;
using ferry::capi::write_struct;

struct ferry_pool : ferry::capi::HandleOf<ferry::capi::kPoolMagic> {
  std::unique_ptr<ferry::Pool> pool;
};

namespace {

ferry_pool_options_t to_c(const ferry::PoolOptions& p) {
  ferry_pool_options_t o{};
  o.struct_size = sizeof o;
  o.chunk_bytes = p.chunk_bytes;
  o.memfd = p.memfd;
  o.huge_pages = static_cast<ferry_huge_policy_t>(static_cast<int>(p.huge_pages));
  o.limit_bytes = p.limit_bytes;
  o.zero_recycled = p.zero_recycled;
  o.touch_threads = p.touch_threads;
  o.release_delay_ms = p.release_delay_ms;
  o.release_batch_bytes = p.release_batch_bytes;
  o.numa_node = p.numa_node;
  o.target_bytes = p.target_bytes;
  return o;
}

// The caller's options over the defaults (members beyond its struct_size keep them).
ferry::PoolOptions to_cpp(const ferry_pool_options_t* given) {
  ferry::PoolOptions p = ferry::PoolOptions::from_environment();
  if (!given) return p;
  const ferry_pool_options_t c = read_struct(given, to_c(p), "options");
  const ferry_pool_options_t* o = &c;
  p.chunk_bytes = o->chunk_bytes;
  p.memfd = o->memfd != 0;
  switch (o->huge_pages) {
    case FERRY_HUGE_POLICY_AUTO: p.huge_pages = ferry::HugePolicy::automatic; break;
    case FERRY_HUGE_POLICY_HUGETLB: p.huge_pages = ferry::HugePolicy::hugetlb; break;
    case FERRY_HUGE_POLICY_THP: p.huge_pages = ferry::HugePolicy::thp; break;
    case FERRY_HUGE_POLICY_OFF: p.huge_pages = ferry::HugePolicy::off; break;
    default:
      throw ferry::InvalidArgument("huge_pages=" + std::to_string(o->huge_pages) +
                                   ": expected a ferry_huge_policy_t value");
  }
  p.limit_bytes = o->limit_bytes;
  p.zero_recycled = o->zero_recycled != 0;
  p.touch_threads = o->touch_threads;
  p.release_delay_ms = o->release_delay_ms;
  p.release_batch_bytes = o->release_batch_bytes;
  p.numa_node = o->numa_node;
  p.target_bytes = o->target_bytes;
  return p;
}

ferry::HugeWant to_cpp(ferry_huge_t h) {
  switch (h) {
    case FERRY_HUGE_AUTO: return ferry::HugeWant::automatic;
    case FERRY_HUGE_YES: return ferry::HugeWant::yes;
    case FERRY_HUGE_NO: return ferry::HugeWant::no;
  }
  throw ferry::InvalidArgument("huge=" + std::to_string(static_cast<int>(h)) +
                               ": expected FERRY_HUGE_AUTO, FERRY_HUGE_YES or FERRY_HUGE_NO");
}

ferry_counter_t to_c(const ferry::Counter& c) { return {c.current, c.peak, c.total}; }

ferry_pool_kind_stats_t to_c(const ferry::KindStats& k) {
  return {to_c(k.reserved), to_c(k.committed), to_c(k.in_use), to_c(k.cached), to_c(k.released)};
}

thread_local std::string t_note;  // ferry_pool_get_note()'s text

}  // namespace

extern "C" {

ferry_status_t ferry_pool_options_defaults(ferry_pool_options_t* out) {
  return guarded([&] {
    require(out, "out");
    write_struct(out, to_c(ferry::PoolOptions::from_environment()), "out");
  });
}

ferry_status_t ferry_pool_create(const ferry_pool_options_t* options, ferry_pool_t* out) {
  return guarded([&] {
    require(out, "out");
    *out = nullptr;
    auto h = std::make_unique<ferry_pool>();
    h->pool = std::make_unique<ferry::Pool>(to_cpp(options));
    *out = h.release();
  });
}

ferry_status_t ferry_pinned_pool_create(const ferry_pool_options_t* options, int device,
                                        ferry_pool_t* out) {
  return guarded([&] {
    require(out, "out");
    *out = nullptr;
    auto h = std::make_unique<ferry_pool>();
    h->pool = ferry::cuda::make_pinned_pool(to_cpp(options), device);
    *out = h.release();
  });
}

ferry_status_t ferry_pool_destroy(ferry_pool_t pool) {
  return guarded([&] { ferry::capi::destroy(pool, "pool", [](ferry_pool& h) { h.pool.reset(); }); });
}

ferry_status_t ferry_pool_alloc(ferry_pool_t pool, size_t bytes, size_t alignment, ferry_huge_t huge,
                                void** out) {
  return guarded([&] {
    live(pool, "pool");
    require(out, "out");
    *out = nullptr;
    *out = pool->pool->allocate(bytes, alignment ? alignment : 256, to_cpp(huge));
  });
}

ferry_status_t ferry_pool_free(ferry_pool_t pool, void* ptr) {
  return guarded([&] {
    live(pool, "pool");
    require(ptr, "ptr");
    pool->pool->deallocate(ptr);
  });
}

ferry_status_t ferry_pool_trim(ferry_pool_t pool, size_t keep_bytes, size_t* released) {
  return guarded([&] {
    live(pool, "pool");
    size_t n = pool->pool->trim(keep_bytes);
    if (released) *released = n;
  });
}

ferry_status_t ferry_pool_wait_ready(ferry_pool_t pool) {
  return guarded([&] {
    live(pool, "pool");
    pool->pool->wait_ready();
  });
}

ferry_status_t ferry_pool_get_stats(ferry_pool_t pool, ferry_pool_stats_t* out) {
  return guarded([&] {
    live(pool, "pool");
    require(out, "out");
    ferry::capi::caller_struct_size(out, "out");  // before the work
    ferry::PoolStats s = pool->pool->stats();
    ferry_pool_stats_t c{};
    c.small = to_c(s.kind[0]);
    c.huge = to_c(s.kind[1]);
    c.allocations = s.allocations;
    c.frees = s.frees;
    c.recycles = s.recycles;
    c.chunk_reservations = s.chunk_reservations;
    c.chunk_releases = s.chunk_releases;
    c.fallbacks = s.fallbacks;
    c.touch_ns = s.touch_ns;
    c.register_ns = s.register_ns;
    c.chunks_small_pages = s.chunks_by_backing[0];
    c.chunks_thp = s.chunks_by_backing[1];
    c.chunks_hugetlb_2m = s.chunks_by_backing[2];
    c.chunks_hugetlb_1g = s.chunks_by_backing[3];
    c.note_count = s.notes.size();
    write_struct(out, c, "out");
  });
}

ferry_status_t ferry_pool_get_note(ferry_pool_t pool, size_t index, const char** note) {
  return guarded([&] {
    live(pool, "pool");
    require(note, "note");
    ferry::PoolStats s = pool->pool->stats();
    if (index >= s.notes.size())
      throw ferry::InvalidArgument("note index " + std::to_string(index) + " out of range (" +
                                   std::to_string(s.notes.size()) + " notes)");
    t_note = s.notes[index];
    *note = t_note.c_str();
  });
}

}  // extern "C"
