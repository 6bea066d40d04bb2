// pool_release.cpp — Pool::Impl's release of memory to the OS: whole idle
// chunks (trim, the background releaser, the limit path) and, without hooks,
// page-aligned free parts of chunks in use. The range states, the locks and
// the fields they guard are in pool_impl.h.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <vector>

#include "core/options.h"
#include "pool/pool.h"
#include "pool/pool_impl.h"
#include "pool/stats.h"

namespace ferry {

// ---- Impl: release -------------------------------------------------------------

std::vector<Chunk*> Pool::Impl::idle_chunks_locked(Clock::time_point idle_before) const {
  std::vector<Chunk*> out;
  for (const auto& [base, c] : chunks)
    if (c.idle() && c.idle_since <= idle_before) out.push_back(const_cast<Chunk*>(&c));
  std::stable_sort(out.begin(), out.end(), [](const Chunk* a, const Chunk* b) { return a->idle_since < b->idle_since; });
  return out;
}

uint64_t Pool::Impl::bump_generation_locked() {
  const uint64_t next = chunk_generation.load(std::memory_order_relaxed) + 1;
  chunk_generation.store(next, std::memory_order_release);
  return next;
}

void Pool::Impl::account_chunk_release_locked(const Chunk& c) {
  const MappedChunk& m = c.mapping;
  const size_t committed = m.bytes - c.released_bytes;
  KindStats& k = kind_stats(counters, m.kind);
  counter_sub(k.reserved, m.bytes);
  counter_sub(k.committed, committed);
  counter_sub(k.cached, committed);
  counter_sub(k.released, c.released_bytes);
  --counters.chunks_by_backing[static_cast<int>(m.backing)];
  ++counters.chunk_releases;
}

uint64_t Pool::Impl::release_chunks_locked(std::unique_lock<std::mutex>& lock, const std::vector<Chunk*>& victims) {
  if (victims.empty()) return 0;
  uint64_t committed = 0;
  std::vector<decltype(chunks)::node_type> held;  // the releasing chunks, out of `chunks`
  held.reserve(victims.size());
  for (Chunk* c : victims) {
    available[index(c->mapping.kind)].take_exact(c->mapping.base, c->mapping.bytes);
    committed += c->mapping.bytes - c->released_bytes;
    held.push_back(chunks.extract(c->mapping.base));
  }
  bump_generation_locked();  // the chunks left `chunks`: a registrar must drop them
  lock.unlock();
  for (const auto& node : held) {
    const MappedChunk& m = node.mapped().mapping;
    if (hooks) hooks->on_chunk_release(reinterpret_cast<void*>(m.base), m.bytes);
    arena.unmap(m);
  }
  lock.lock();
  for (const auto& node : held) account_chunk_release_locked(node.mapped());
  return committed;
}

uint64_t Pool::Impl::release_parts_locked(std::unique_lock<std::mutex>& lock, uint64_t max_bytes) {
  struct Part {
    Chunk* chunk;
    Run range;
    std::vector<Span> spans;  // what it held, to restore if madvise fails
    int err;
  };
  std::vector<Part> parts;
  uint64_t planned = 0;
  for (auto& [base, c] : chunks) {
    if (planned >= max_bytes) break;
    RangeSet& set = available[index(c.mapping.kind)];
    const size_t page = Arena::page_bytes(c.mapping.backing);
    for (const Run& r : set.releasable(base, c.end(), page, max_bytes - planned)) {
      Part part{&c, r, {}, 0};
      set.take_exact(r.begin, r.size, &part.spans);
      c.releasing_bytes += r.size;
      planned += r.size;
      parts.push_back(std::move(part));
    }
  }
  if (parts.empty()) return 0;
  lock.unlock();
  for (Part& part : parts) part.err = arena.release_pages(part.chunk->mapping, part.range.begin, part.range.size);
  lock.lock();
  uint64_t released = 0;
  for (Part& part : parts) {
    Chunk& c = *part.chunk;
    RangeSet& set = available[index(c.mapping.kind)];
    c.releasing_bytes -= part.range.size;
    if (part.err != 0) {
      for (const Span& s : part.spans) set.insert(c.mapping.base, s.begin, s.size, s.state);
      continue;
    }
    set.insert(c.mapping.base, part.range.begin, part.range.size, SpanState::released);
    c.released_bytes += part.range.size;
    c.generation = bump_generation_locked();  // new pages will back this part
    KindStats& k = kind_stats(counters, c.mapping.kind);
    counter_sub(k.cached, part.range.size);
    counter_sub(k.committed, part.range.size);
    counter_add(k.released, part.range.size);
    released += part.range.size;
  }
  return released;
}

size_t Pool::Impl::trim(size_t keep_bytes) {
  std::unique_lock lock(mu);
  // Idle chunks, oldest first, while more than keep_bytes stay cached; idle
  // chunks with nothing committed (all released) go in any case.
  const uint64_t need = cached_locked() > keep_bytes ? cached_locked() - keep_bytes : 0;
  std::vector<Chunk*> victims;
  uint64_t selected = 0;
  for (Chunk* c : idle_chunks_locked(Clock::time_point::max())) {
    const uint64_t committed = c->mapping.bytes - c->released_bytes;
    if (committed > 0 && selected >= need) continue;
    victims.push_back(c);
    selected += committed;
  }
  uint64_t released = release_chunks_locked(lock, victims);
  // Pinned (hooked) memory is released in whole chunks only: never
  // MADV_DONTNEED registered memory.
  if (!hooks && cached_locked() > keep_bytes) released += release_parts_locked(lock, cached_locked() - keep_bytes);
  return released;
}

void Pool::Impl::run_releaser() {
  // validate() bounds the delay (a day), so now() +/- delay never overflows:
  // an overflowed deadline lies in the past and turned this loop into a spin.
  const auto delay = std::chrono::milliseconds(std::min(options.release_delay_ms, kMaxReleaseDelayMs));
  std::unique_lock lock(mu);
  while (!stopping) {
    release_cv.wait_for(lock, delay, [&] { return stopping; });
    if (stopping) break;
    // Chunks idle for at least the delay, oldest first, in a batch of at
    // most release_batch_bytes (at least one chunk), never going below the
    // target_bytes that the pool was asked to hold.
    std::vector<Chunk*> victims;
    uint64_t batch = 0, reserved = reserved_locked();
    for (Chunk* c : idle_chunks_locked(Clock::now() - delay)) {
      const size_t bytes = c->mapping.bytes;
      if (!victims.empty() && batch + bytes > options.release_batch_bytes) break;
      if (reserved < options.target_bytes + bytes) continue;
      victims.push_back(c);
      batch += bytes;
      reserved -= bytes;
    }
    release_chunks_locked(lock, victims);
  }
}

}  // namespace ferry
