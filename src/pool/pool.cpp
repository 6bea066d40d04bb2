// pool.cpp — Pool: exact-size allocation from huge/small chunks, recycling,
// chunk preparation (touch overlapped with registration) and the background
// target. Release (trim, background, limit) is in pool_release.cpp. The range
// states, the locks and the fields they guard are in pool_impl.h.
#include "pool/pool.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "core/options.h"
#include "os/memory.h"
#include "pool/first_touch.h"
#include "pool/pool_impl.h"
#include "pool/stats.h"

namespace ferry {
namespace {

constexpr size_t kMaxAlignment = os::kHugePage2MBytes;
constexpr size_t kMaxRequest = size_t{1} << 47;    // the x86-64 user address space
constexpr size_t kChunkGranule = os::kHugePage2MBytes;  // chunks are 2 MiB aligned and sized

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

uint64_t ns_since(Clock::time_point start) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
}

// HugeWant::automatic: huge for a (rounded) size of 2 MiB or more.
PageKind resolve_kind(HugeWant want, size_t size) {
  switch (want) {
    case HugeWant::yes: return PageKind::huge;
    case HugeWant::no: return PageKind::small;
    case HugeWant::automatic: break;
  }
  return size >= os::kHugePage2MBytes ? PageKind::huge : PageKind::small;
}

// Clears the spans; with up to `threads` threads when they are big (a
// recycled 1 GiB range takes ~100 ms on one thread). Returns the bytes cleared.
size_t zero_spans(const std::vector<Span>& spans, int threads) {
  constexpr size_t kParallelFrom = size_t{64} << 20, kShare = size_t{16} << 20;
  size_t total = 0;
  for (const Span& d : spans) total += d.size;
  if (total < kParallelFrom || threads < 2) {
    for (const Span& d : spans) std::memset(reinterpret_cast<void*>(d.begin), 0, d.size);
    return total;
  }
  std::vector<Span> shares;  // the spans cut in kShare pieces, handed out by a cursor
  for (const Span& d : spans)
    for (size_t off = 0; off < d.size; off += kShare) shares.push_back(Span{d.begin + off, std::min(kShare, d.size - off)});
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < shares.size();)
      std::memset(reinterpret_cast<void*>(shares[i].begin), 0, shares[i].size);
  };
  std::vector<std::thread> helpers;
  try {
    for (int t = 1; t < threads; ++t) helpers.emplace_back(work);
  } catch (...) {
    // Fewer threads: the caller does the rest.
  }
  work();
  for (std::thread& t : helpers) t.join();
  return total;
}

const PoolOptions& validated(const PoolOptions& o) {
  o.validate();
  return o;
}

}  // namespace

// ---- FreedHistory --------------------------------------------------------

void FreedHistory::remember(uintptr_t start, size_t size) {
  const uint64_t sequence = next_sequence_++;
  by_start_[start] = Record{size, sequence};
  order_.emplace_back(start, sequence);
  if (order_.size() > kCapacity) {
    const auto [oldest, oldest_sequence] = order_.front();
    order_.pop_front();
    auto it = by_start_.find(oldest);
    if (it != by_start_.end() && it->second.sequence == oldest_sequence) by_start_.erase(it);
  }
}

size_t FreedHistory::find(uintptr_t start) const {
  auto it = by_start_.find(start);
  return it == by_start_.end() ? 0 : it->second.size;
}

// ---- Impl: allocation ------------------------------------------------------

Pool::Impl::Impl(PoolOptions o, std::shared_ptr<ChunkHooks> h)
    : options(validated(o)),
      hooks(std::move(h)),
      target_kind(resolve_kind(o.target_kind, o.chunk_bytes)),
      target_chunk_bytes(round_up(options.target_bytes, kChunkGranule)),
      arena(options, hooks != nullptr) {}

PageKind Pool::Impl::kind_for(HugeWant want, size_t size) const {
  if (want == HugeWant::automatic && options.target_bytes > 0 && size < kChunkGranule) return target_kind;
  return resolve_kind(want, size);
}

uint64_t Pool::Impl::reserved_locked() const {
  return counters.kind[0].reserved.current + counters.kind[1].reserved.current;
}

uint64_t Pool::Impl::cached_locked() const {
  return counters.kind[0].cached.current + counters.kind[1].cached.current;
}

bool Pool::Impl::fits_limit_locked(size_t chunk_bytes) const {
  return options.limit_bytes == 0 || reserved_locked() + pending_bytes + chunk_bytes <= options.limit_bytes;
}

std::string Pool::Impl::limit_message_locked(const std::string& what, size_t chunk_bytes) const {
  const uint64_t in_use = counters.kind[0].in_use.current + counters.kind[1].in_use.current;
  std::string m = "ferry pool limit of " + format_bytes(options.limit_bytes) + " reached: " +
                  format_bytes(reserved_locked()) + " reserved (" + format_bytes(in_use) + " in use";
  if (pending_bytes > 0) m += ", " + format_bytes(pending_bytes) + " more being reserved";
  return m + "), " + what + " needs a new " + format_bytes(chunk_bytes) + " chunk";
}

bool Pool::Impl::should_wait_for_target_locked(size_t size, PageKind kind) const {
  return target_running && !target_error && !stopping && kind == target_kind && size <= target_chunk_bytes;
}

bool Pool::Impl::register_chunk(MappedChunk& m, std::exception_ptr* error) {
  const auto start = Clock::now();
  try {
    hooks->on_chunk_ready(reinterpret_cast<void*>(m.base), m.bytes);
  } catch (...) {
    *error = std::current_exception();
    return false;
  }
  m.register_ns = ns_since(start);
  return true;
}

MappedChunk Pool::Impl::prepare_chunk(size_t bytes, PageKind kind, const std::atomic<bool>* cancel) {
  MappedChunk m = arena.map_chunk(bytes, kind);
  FirstTouch touch(m.base, m.bytes, arena.touch_threads());
  std::exception_ptr error;
  bool registered = false, tried = false;
  // The registration starts behind the touch front, on this thread, while
  // the helpers touch the rest (pool_impl.h, "Chunk preparation").
  if (hooks && options.register_lead_bytes < bytes && touch.wait_touched(options.register_lead_bytes, cancel)) {
    tried = true;
    registered = register_chunk(m, &error);
    if (!registered) touch.stop();  // refused: touching the rest is wasted
  }
  auto cancelled = [&] { return !tried && cancel && cancel->load(); };
  if (cancelled()) touch.stop();
  const int err = touch.join();
  m.touch_ns = touch.elapsed_ns();
  const bool cancel_now = cancelled();
  if (hooks && !tried && err == 0 && !cancel_now) registered = register_chunk(m, &error);
  if (!cancel_now && err == 0 && (registered || !hooks)) return m;
  if (registered) hooks->on_chunk_release(reinterpret_cast<void*>(m.base), m.bytes);
  arena.unmap(m);
  if (error) std::rethrow_exception(error);
  if (cancel_now || err == ECANCELED)
    throw OsError("preparing a " + format_bytes(bytes) + " pool chunk: cancelled (the pool is being destroyed)",
                  ECANCELED);
  throw OsError("first touch of a " + format_bytes(bytes) + " pool chunk", err);
}

Chunk& Pool::Impl::insert_chunk_locked(const MappedChunk& m) {
  const auto [it, inserted] = chunks.emplace(m.base, Chunk{m});
  assert(inserted);  // the kernel gives an address to one live mapping at a time
  Chunk& c = it->second;
  c.idle_since = Clock::now();
  c.generation = bump_generation_locked();
  available[index(m.kind)].insert(m.base, m.base, m.bytes, SpanState::zero);
  KindStats& k = kind_stats(counters, m.kind);
  counter_add(k.reserved, m.bytes);
  counter_add(k.committed, m.bytes);
  counter_add(k.cached, m.bytes);
  ++counters.chunk_reservations;
  ++counters.chunks_by_backing[static_cast<int>(m.backing)];
  counters.touch_ns += m.touch_ns;
  counters.register_ns += m.register_ns;
  return c;
}

void* Pool::Impl::hand_out_locked(const Carved& carved, PageKind kind) {
  Chunk& c = chunks.find(carved.chunk)->second;
  live.emplace(carved.begin, Allocation{carved.size, &c});
  ++c.live_allocations;
  const size_t released = carved.bytes_in(SpanState::released);
  c.released_bytes -= released;
  KindStats& k = kind_stats(counters, kind);
  counter_add(k.in_use, carved.size);
  counter_sub(k.cached, carved.size - released);
  counter_sub(k.released, released);
  if (released > 0) counter_add(k.committed, released);
  ++counters.allocations;
  if (carved.bytes_in(SpanState::dirty) > 0) ++counters.recycles;
  return reinterpret_cast<void*>(carved.begin);
}

void* Pool::Impl::allocate(size_t size, size_t alignment, PageKind kind, std::vector<Span>* dirty,
                           bool cached_only) {
  RangeSet& set = available[index(kind)];
  std::unique_lock lock(mu);
  for (;;) {
    if (std::optional<Carved> carved = set.take_best_fit(size, alignment, dirty))
      return hand_out_locked(*carved, kind);
    if (cached_only) return nullptr;
    if (should_wait_for_target_locked(size, kind)) {
      target_cv.wait(lock);
      continue;
    }
    // A request larger than a chunk gets a dedicated chunk of its own size:
    // the chunk base is 2 MiB aligned, so no alignment slack is needed.
    const size_t chunk_bytes = size <= options.chunk_bytes ? options.chunk_bytes : round_up(size, kChunkGranule);
    if (!fits_limit_locked(chunk_bytes)) {
      // Give back wholly free chunks, oldest first, if that makes room.
      std::vector<Chunk*> victims;
      uint64_t freed_bytes = 0;
      for (Chunk* c : idle_chunks_locked(Clock::time_point::max())) {
        if (reserved_locked() - freed_bytes + pending_bytes + chunk_bytes <= options.limit_bytes) break;
        victims.push_back(c);
        freed_bytes += c->mapping.bytes;
      }
      if (reserved_locked() - freed_bytes + pending_bytes + chunk_bytes > options.limit_bytes)
        throw OutOfMemory(limit_message_locked("request of " + format_bytes(size), chunk_bytes));
      release_chunks_locked(lock, victims);
      continue;  // the lock was dropped: look again
    }
    pending_bytes += chunk_bytes;
    lock.unlock();
    MappedChunk m;
    try {
      m = prepare_chunk(chunk_bytes, kind);
    } catch (...) {
      lock.lock();
      pending_bytes -= chunk_bytes;
      throw;
    }
    lock.lock();
    pending_bytes -= chunk_bytes;
    Chunk& c = insert_chunk_locked(m);
    return hand_out_locked(set.take_exact(c.mapping.base, size), kind);
  }
}

// ---- Impl: free --------------------------------------------------------------

std::string Pool::Impl::diagnose_free_locked(uintptr_t p) const {
  const std::string head = "ferry pool: deallocate(" + format_address(p) + "): ";
  if (p == 0) return head + "null pointer, not allocated by this pool";
  std::string around;  // the live allocation p points into, if any
  auto it = live.upper_bound(p);
  if (it != live.begin() && p < std::prev(it)->first + std::prev(it)->second.size) {
    --it;
    around = "an allocation of " + std::to_string(it->second.size) + " bytes starting at " + format_address(it->first);
  }
  if (const size_t freed_size = freed.find(p)) {
    std::string m = head + "already freed (it was an allocation of " + std::to_string(freed_size) + " bytes)";
    return around.empty() ? m : m + "; the memory now belongs to " + around;
  }
  if (!around.empty()) return head + "points inside " + around;
  auto c = chunks.upper_bound(p);
  if (c != chunks.begin() && p < std::prev(c)->second.end())
    return head + "not the start of a live allocation (double free or interior pointer)";
  return head + "not allocated by this pool";
}

void Pool::Impl::deallocate(uintptr_t p) {
  std::lock_guard lock(mu);
  auto it = live.find(p);
  if (it == live.end()) throw InvalidArgument(diagnose_free_locked(p));
  const Allocation a = it->second;
  live.erase(it);
  Chunk& c = *a.chunk;
  available[index(c.mapping.kind)].insert(c.mapping.base, p, a.size, SpanState::dirty);
  if (--c.live_allocations == 0) c.idle_since = Clock::now();
  KindStats& k = kind_stats(counters, c.mapping.kind);
  counter_sub(k.in_use, a.size);
  counter_add(k.cached, a.size);
  ++counters.frees;
  freed.remember(p, a.size);
}

// ---- Impl: background target ------------------------------------------------------

void Pool::Impl::run_target(Clock::time_point created) {
  const size_t bytes = target_chunk_bytes;
  std::exception_ptr error;
  std::unique_lock lock(mu);
  if (!fits_limit_locked(bytes)) {
    error = std::make_exception_ptr(
        OutOfMemory(limit_message_locked("the background target of " + format_bytes(options.target_bytes), bytes)));
  } else {
    pending_bytes += bytes;
    lock.unlock();
    MappedChunk m;
    try {
      m = prepare_chunk(bytes, target_kind, &cancel_target);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    pending_bytes -= bytes;
    if (!error) {
      insert_chunk_locked(m);  // also while stopping: shutdown() releases it with the others
      counters.target_ns = ns_since(created);
    }
  }
  target_error = error;
  target_running = false;
  target_cv.notify_all();
}

void Pool::Impl::wait_ready() {
  std::unique_lock lock(mu);
  target_cv.wait(lock, [&] { return !target_running; });
  if (target_error) std::rethrow_exception(target_error);
}

PoolStats Pool::Impl::stats() const {
  std::lock_guard lock(mu);
  PoolStats s = counters;
  s.notes = arena.notes();
  s.fallbacks = arena.fallbacks();
  s.zeroed_bytes = zeroed_bytes.load(std::memory_order_relaxed);
  s.zero_ns = zero_ns.load(std::memory_order_relaxed);
  return s;
}

void Pool::Impl::shutdown() noexcept {
  {
    std::lock_guard lock(mu);
    stopping = true;
  }
  cancel_target.store(true);
  target_cv.notify_all();
  release_cv.notify_all();
  target_worker.wait();
  if (releaser.joinable()) releaser.join();
  std::vector<MappedChunk> registered;
  {
    std::lock_guard lock(mu);
    for (const auto& [base, c] : chunks) registered.push_back(c.mapping);
    chunks.clear();
    bump_generation_locked();
  }
  for (const MappedChunk& m : registered) {
    if (hooks) hooks->on_chunk_release(reinterpret_cast<void*>(m.base), m.bytes);
    arena.unmap(m);
  }
}

// ---- Pool ------------------------------------------------------------------------

Pool::Pool(PoolOptions options, std::shared_ptr<ChunkHooks> hooks)
    : impl_(std::make_unique<Impl>(options, std::move(hooks))) {
  Impl& s = *impl_;
  const Clock::time_point created = Clock::now();
  try {
    if (s.options.release_delay_ms > 0) s.releaser = std::thread([&s] { s.run_releaser(); });
    if (s.options.target_bytes > 0) {
      s.target_running = true;  // no other thread runs yet
      s.target_worker.start([&s, created] { s.run_target(created); });
    }
  } catch (...) {
    {
      std::lock_guard lock(s.mu);
      s.target_running = false;  // no worker: nobody may wait for one
    }
    s.shutdown();
    throw;
  }
}

Pool::~Pool() {
  if (impl_->forked()) {
    abandon_in_child(impl_);
    return;
  }
  impl_->shutdown();
}

namespace {

// Throws InvalidArgument for a request allocate() does not serve; returns its rounded size.
size_t checked_size(size_t bytes, size_t alignment) {
  if (bytes == 0) throw InvalidArgument("ferry pool: cannot allocate 0 bytes (the size must be at least 1)");
  if (bytes > kMaxRequest)
    throw InvalidArgument("ferry pool: a request of " + std::to_string(bytes) +
                          " bytes is beyond the 128 TiB address space");
  if (alignment == 0 || (alignment & (alignment - 1)) != 0)
    throw InvalidArgument("ferry pool: alignment " + std::to_string(alignment) +
                          " is not a power of two (expected 1 .. 2 MiB)");
  if (alignment > kMaxAlignment)
    throw InvalidArgument("ferry pool: alignment " + std::to_string(alignment) + " (" +
                          format_bytes(alignment) + ") is above the 2 MiB maximum");
  return round_up(bytes, alignment);
}

}  // namespace

void* Pool::Impl::allocate_public(size_t bytes, size_t alignment, HugeWant huge, bool zero, bool cached_only) {
  const size_t size = checked_size(bytes, alignment);
  std::vector<Span> dirty;  // filled only when zeroing is asked for
  void* p = allocate(size, alignment, kind_for(huge, size), zero || options.zero_recycled ? &dirty : nullptr,
                     cached_only);
  if (!dirty.empty()) {
    const auto start = Clock::now();
    // allocate_cached() starts no thread (its callers hold a lock of their own).
    zeroed_bytes.fetch_add(zero_spans(dirty, cached_only ? 1 : arena.touch_threads()), std::memory_order_relaxed);
    zero_ns.fetch_add(ns_since(start), std::memory_order_relaxed);
  }
  return p;
}

void* Pool::allocate(size_t bytes, size_t alignment, HugeWant huge, bool zero) {
  impl_->refuse_if_forked();
  return impl_->allocate_public(bytes, alignment, huge, zero, false);
}

void* Pool::allocate_cached(size_t bytes, size_t alignment, HugeWant huge, bool zero) {
  impl_->refuse_if_forked();
  return impl_->allocate_public(bytes, alignment, huge, zero, true);
}

void Pool::deallocate(void* p) {
  if (impl_->forked()) return;  // the child's copy of the memory goes with the child
  impl_->deallocate(reinterpret_cast<uintptr_t>(p));
}

size_t Pool::trim(size_t keep_bytes) {
  impl_->refuse_if_forked();
  return impl_->trim(keep_bytes);
}

size_t Pool::allocation_size(const void* p) const {
  impl_->refuse_if_forked();
  std::lock_guard lock(impl_->mu);
  auto it = impl_->live.find(reinterpret_cast<uintptr_t>(p));
  return it == impl_->live.end() ? 0 : it->second.size;
}

void Pool::wait_ready() {
  impl_->refuse_if_forked();
  impl_->wait_ready();
}

PoolStats Pool::stats() const {
  impl_->refuse_if_forked();
  return impl_->stats();
}

const PoolOptions& Pool::options() const { return impl_->options; }

Pool::SharedLocation Pool::shared_location(const void* p) const {
  impl_->refuse_if_forked();
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard lock(impl_->mu);
  auto it = impl_->chunks.upper_bound(a);
  if (it == impl_->chunks.begin()) return {};
  const Chunk& c = std::prev(it)->second;
  if (a >= c.end() || c.mapping.fd < 0) return {};
  return SharedLocation{c.mapping.fd, a - c.mapping.base};
}

std::vector<Pool::ChunkView> Pool::chunks() const {
  impl_->refuse_if_forked();
  std::lock_guard lock(impl_->mu);
  std::vector<ChunkView> out;
  out.reserve(impl_->chunks.size());
  for (const auto& [base, c] : impl_->chunks) out.push_back(ChunkView{base, c.mapping.bytes, c.generation});
  return out;
}

uint64_t Pool::chunk_generation() const noexcept {
  return impl_->chunk_generation.load(std::memory_order_acquire);
}

}  // namespace ferry
