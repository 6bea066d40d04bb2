// managed_pool.cpp — size classes, best fit, splitting, stream-ordered reuse and
// coalescing of the managed pool (states and locking: managed/managed_pool.h).
#include "managed/managed_pool.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <sstream>

#include "core/error.h"
#include "pool/stats.h"

namespace ferry {

namespace {

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

constexpr size_t kMaxRequest = size_t{1} << 50;  // 1 PiB: anything above is a bug

}  // namespace

size_t ManagedPool::size_class(size_t n) {
  if (n == 0) throw InvalidArgument("managed pool: a request of 0 bytes has no block");
  if (n > kMaxRequest)
    throw InvalidArgument("managed pool: a request of " + std::to_string(n) + " bytes is not plausible");
  if (n <= kMinBlock) return kMinBlock;
  // 2^k < n <= 2^(k+1): four classes per octave, multiples of 512.
  const size_t k = std::bit_width(n - 1) - 1;
  const size_t step = std::max(kMinBlock, (size_t{1} << k) / 4);
  const size_t grid = round_up(n, step);
  if (n <= kGranule) return grid;
  return std::min(grid, round_up(n, kGranule));
}

void ManagedPool::validate(const ManagedPoolOptions& o) {
  if (o.chunk_bytes == 0 || o.chunk_bytes % kGranule != 0)
    throw InvalidArgument("managed pool: chunk_bytes=" + std::to_string(o.chunk_bytes) +
                          " must be a positive multiple of 2 MiB");
  if (o.small_chunk_bytes == 0 || o.small_chunk_bytes % kGranule != 0)
    throw InvalidArgument("managed pool: small_chunk_bytes=" + std::to_string(o.small_chunk_bytes) +
                          " must be a positive multiple of 2 MiB");
}

ManagedPool::ManagedPool(ManagedPoolOptions options, ChunkSource source)
    : source_(std::move(source)), opts_(options) {
  validate(options);
  if (!source_.obtain || !source_.release)
    throw InvalidArgument("managed pool: the chunk source needs obtain and release");
}

ManagedPool::~ManagedPool() {
  std::vector<std::pair<void*, size_t>> all;
  std::unordered_map<uintptr_t, std::unique_ptr<Node>> nodes;  // fences die after the lock
  {
    std::lock_guard lk(mu_);
    for (auto& [base, c] : chunks_) all.emplace_back(reinterpret_cast<void*>(base), c->size);
    nodes.swap(nodes_);
    live_.clear();
    for (int k = 0; k < 2; ++k) {
      idle_[k].clear();
      pending_[k].clear();
    }
  }
  nodes.clear();
  for (auto& [p, n] : all) source_.release(p, n);
}

void ManagedPool::set_options(const ManagedPoolOptions& options) {
  validate(options);
  std::lock_guard lk(mu_);
  opts_ = options;
}

ManagedPoolOptions ManagedPool::options() const {
  std::lock_guard lk(mu_);
  return opts_;
}

// ---- free sets --------------------------------------------------------------

void ManagedPool::insert_free_locked(Node* n) {
  const int kind = n->chunk->small ? 1 : 0;
  if (n->state == Node::State::idle)
    idle_[kind].insert({n->size, n->addr});
  else
    pending_[kind][n->stream].insert({n->size, n->addr});
}

void ManagedPool::erase_free_locked(Node* n) {
  const int kind = n->chunk->small ? 1 : 0;
  if (n->state == Node::State::idle) {
    idle_[kind].erase({n->size, n->addr});
  } else if (n->state == Node::State::pending) {
    auto it = pending_[kind].find(n->stream);
    if (it != pending_[kind].end()) {
      it->second.erase({n->size, n->addr});
      if (it->second.empty()) pending_[kind].erase(it);
    }
  }
}

bool ManagedPool::mergeable(const Node* a, const Node* b) const {
  if (!a || !b || a->chunk != b->chunk) return false;
  if (a->state == Node::State::idle && b->state == Node::State::idle) return true;
  return a->state == Node::State::pending && b->state == Node::State::pending &&
         a->stream == b->stream;
}

ManagedPool::Node* ManagedPool::merge_locked(Node* a, Node* b, Graveyard& g) {
  // Both are out of their free sets. a keeps the later fence (same stream).
  if (a->state == Node::State::pending && b->seq > a->seq) {
    if (a->fence) g.push_back(std::move(a->fence));
    a->fence = std::move(b->fence);
    a->seq = b->seq;
  } else if (b->fence) {
    g.push_back(std::move(b->fence));
  }
  a->size += b->size;
  a->next = b->next;
  if (b->next) b->next->prev = a;
  nodes_.erase(b->addr);
  return a;
}

ManagedPool::Node* ManagedPool::coalesce_locked(Node* n, Graveyard& g) {
  // n is free and in no set; its neighbours may be in sets.
  if (mergeable(n->prev, n)) {
    Node* p = n->prev;
    erase_free_locked(p);
    n = merge_locked(p, n, g);
  }
  if (mergeable(n, n->next)) {
    Node* nx = n->next;
    erase_free_locked(nx);
    n = merge_locked(n, nx, g);
  }
  insert_free_locked(n);
  return n;
}

// Makes ready pending blocks idle. kind: 0, 1, or -1 for both. Streams equal to
// `except` are skipped unless all_streams (a stream's own pending blocks are
// usable by it anyway). Fences of one stream complete in the order they were
// made, so when the latest pending fence of a stream is ready, every pending
// block of that stream is, and only that one fence is queried. Returns how
// many blocks became idle.
size_t ManagedPool::poll_locked(int kind, StreamId except, bool all_streams, Graveyard& g) {
  std::vector<uintptr_t> ready;
  for (int k = 0; k < 2; ++k) {
    if (kind != -1 && k != kind) continue;
    for (auto& [stream, set] : pending_[k]) {
      if (!all_streams && stream == except) continue;
      Node* latest = nullptr;
      for (const Key& key : set) {
        Node* n = nodes_.at(key.second).get();
        if (!latest || n->seq > latest->seq) latest = n;
      }
      const bool all_ready = latest && latest->fence && latest->fence->ready();
      for (const Key& key : set) {
        Node* n = nodes_.at(key.second).get();
        if (all_ready || (n != latest && n->fence && n->fence->ready())) ready.push_back(n->addr);
      }
    }
  }
  // Converting one block only merges it with idle neighbours; blocks still in
  // `ready` are pending, so none of them is merged away before its turn.
  for (uintptr_t a : ready) {
    Node* n = nodes_.at(a).get();
    erase_free_locked(n);
    if (n->fence) g.push_back(std::move(n->fence));
    n->state = Node::State::idle;
    n->stream = 0;
    n->seq = 0;
    coalesce_locked(n, g);
  }
  stats_.reuse_after_fence += ready.size();
  return ready.size();
}

// ---- allocation ---------------------------------------------------------------

ManagedPool::Node* ManagedPool::find_locked(size_t cls, bool small, StreamId stream,
                                            Graveyard& g) {
  const int kind = small ? 1 : 0;
  auto best_in = [&](const FreeSet& set) -> const Key* {
    auto it = set.lower_bound({cls, 0});
    return it == set.end() ? nullptr : &*it;
  };
  // Like PyTorch's allocator (process_events on every malloc): first turn
  // other streams' finished blocks idle, so that best fit sees them.
  poll_locked(kind, stream, false, g);
  const Key* idle = best_in(idle_[kind]);
  const Key* own = nullptr;
  auto ps = pending_[kind].find(stream);
  if (ps != pending_[kind].end()) own = best_in(ps->second);
  if (own && (!idle || own->first <= idle->first)) {
    ++stats_.reuse_same_stream;
    return nodes_.at(own->second).get();
  }
  if (idle) return nodes_.at(idle->second).get();
  if (!opts_.stream_wait) return nullptr;
  // Other streams' pending blocks, best fit first; take the first whose fence
  // this stream can be made to wait on.
  std::vector<Key> candidates;
  for (auto& [other, set] : pending_[kind]) {
    if (other == stream) continue;
    if (const Key* k = best_in(set)) candidates.push_back(*k);
  }
  std::sort(candidates.begin(), candidates.end());
  for (const Key& k : candidates) {
    Node* n = nodes_.at(k.second).get();
    if (n->fence && n->fence->order_before(stream)) {
      ++stats_.reuse_by_wait;
      return n;
    }
  }
  return nullptr;
}

ManagedPool::Block ManagedPool::carve_locked(Node* n, size_t cls, size_t requested,
                                             StreamId stream, Graveyard& g) {
  erase_free_locked(n);
  if (n->size - cls >= kMinBlock) {
    auto rest = std::make_unique<Node>();
    rest->addr = n->addr + cls;
    rest->size = n->size - cls;
    rest->chunk = n->chunk;
    rest->prev = n;
    rest->next = n->next;
    if (n->next) n->next->prev = rest.get();
    n->next = rest.get();
    rest->state = n->state;
    rest->stream = n->stream;
    rest->fence = std::move(n->fence);  // the rest still waits for the same work
    rest->seq = n->seq;
    n->size = cls;
    Node* r = rest.get();
    nodes_.emplace(r->addr, std::move(rest));
    insert_free_locked(r);  // its other neighbour was not mergeable with n, so not with r
  }
  if (n->fence) g.push_back(std::move(n->fence));
  n->state = Node::State::allocated;
  n->stream = stream;
  n->seq = 0;
  n->requested = requested;
  live_.emplace(n->addr, n);
  counter_add(stats_.allocated, n->size);
  counter_add(stats_.requested, requested);
  ++stats_.allocations;
  Block b{reinterpret_cast<void*>(n->addr), n->size, false};
  claim_prefetch_locked(*n, b);
  return b;
}

void ManagedPool::claim_prefetch_locked(const Node& n, Block& b) {
  Chunk& c = *n.chunk;
  const size_t first = (n.addr - c.base) / kGranule, last = (n.addr + n.size - 1 - c.base) / kGranule;
  size_t lo = SIZE_MAX, hi = 0;
  for (size_t i = first; i <= last; ++i) {
    if (c.prefetched[i]) continue;
    c.prefetched[i] = true;
    lo = std::min(lo, i);
    hi = i;
  }
  if (lo == SIZE_MAX) return;
  const uintptr_t begin = c.base + lo * kGranule;
  const uintptr_t end = std::min(c.base + c.size, c.base + (hi + 1) * kGranule);
  b.prefetch_ptr = reinterpret_cast<void*>(begin);
  b.prefetch_bytes = end - begin;
}

ManagedPool::Node* ManagedPool::add_chunk_locked(void* base, size_t bytes, bool small) {
  auto c = std::make_unique<Chunk>();
  c->base = reinterpret_cast<uintptr_t>(base);
  c->size = bytes;
  c->small = small;
  c->prefetched.assign((bytes + kGranule - 1) / kGranule, false);
  auto n = std::make_unique<Node>();
  n->addr = c->base;
  n->size = bytes;
  n->chunk = c.get();
  n->state = Node::State::idle;
  c->first = n.get();
  Node* raw = n.get();
  nodes_.emplace(raw->addr, std::move(n));
  chunks_.emplace(c->base, std::move(c));
  counter_add(stats_.reserved, bytes);
  ++stats_.chunk_obtains;
  return raw;  // not in a free set yet
}

ManagedPool::Block ManagedPool::allocate(size_t n, StreamId stream) {
  const size_t cls = size_class(n);
  const bool small = cls <= kSmallMax;
  size_t chunk_bytes = 0;
  {
    Graveyard g;
    std::lock_guard lk(mu_);
    if (Node* b = find_locked(cls, small, stream, g)) return carve_locked(b, cls, n, stream, g);
    chunk_bytes = small ? opts_.small_chunk_bytes : std::max(opts_.chunk_bytes, round_up(cls, kGranule));
  }
  void* base = nullptr;
  try {
    base = source_.obtain(chunk_bytes, stream);
  } catch (const OutOfMemory&) {
    {
      std::lock_guard lk(mu_);
      ++stats_.chunk_failures;
    }
    if (trim() == 0) throw;
    base = source_.obtain(chunk_bytes, stream);  // a second failure goes to the caller
  }
  if (!base || reinterpret_cast<uintptr_t>(base) % kMinBlock != 0) {
    if (base) source_.release(base, chunk_bytes);
    throw InvalidArgument("managed pool: the chunk source returned " +
                          format_address(reinterpret_cast<uintptr_t>(base)) +
                          " (NULL or not 512-byte aligned)");
  }
  Graveyard g;
  std::lock_guard lk(mu_);
  Node* fresh = add_chunk_locked(base, chunk_bytes, small);
  insert_free_locked(fresh);
  Block b = carve_locked(fresh, cls, n, stream, g);
  b.new_chunk = true;
  return b;
}

// ---- free, trim ---------------------------------------------------------------

void ManagedPool::deallocate(void* p, StreamId stream, std::unique_ptr<Fence> fence) {
  Graveyard g;
  std::lock_guard lk(mu_);
  auto it = live_.find(reinterpret_cast<uintptr_t>(p));
  if (it == live_.end())
    throw InvalidArgument("managed pool: " + format_address(reinterpret_cast<uintptr_t>(p)) +
                          " is not a live allocation of this pool (foreign pointer, interior "
                          "pointer or double free)");
  Node* n = it->second;
  live_.erase(it);
  counter_sub(stats_.allocated, n->size);
  counter_sub(stats_.requested, n->requested);
  ++stats_.frees;
  n->requested = 0;
  n->stream = stream;
  if (fence) {
    n->state = Node::State::pending;
    n->fence = std::move(fence);
    n->seq = ++seq_;
  } else {
    n->state = Node::State::idle;
    n->stream = 0;
    n->seq = 0;
  }
  coalesce_locked(n, g);
}

std::vector<std::pair<void*, size_t>> ManagedPool::take_free_chunks_locked(Graveyard& g) {
  std::vector<std::pair<void*, size_t>> out;
  for (auto it = chunks_.begin(); it != chunks_.end();) {
    Chunk* c = it->second.get();
    Node* n = c->first;
    if (n->size == c->size && n->state == Node::State::idle) {
      erase_free_locked(n);
      if (n->fence) g.push_back(std::move(n->fence));
      nodes_.erase(n->addr);
      out.emplace_back(reinterpret_cast<void*>(c->base), c->size);
      counter_sub(stats_.reserved, c->size);
      ++stats_.chunk_releases;
      it = chunks_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

size_t ManagedPool::trim() {
  std::vector<std::pair<void*, size_t>> freed;
  {
    Graveyard g;
    std::lock_guard lk(mu_);
    poll_locked(-1, 0, true, g);
    freed = take_free_chunks_locked(g);
  }
  size_t bytes = 0;
  for (auto& [p, n] : freed) {
    source_.release(p, n);
    bytes += n;
  }
  return bytes;
}

// ---- queries ------------------------------------------------------------------

size_t ManagedPool::allocation_size(const void* p) const {
  std::lock_guard lk(mu_);
  auto it = live_.find(reinterpret_cast<uintptr_t>(p));
  return it == live_.end() ? 0 : it->second->size;
}

void ManagedPool::note_prefetch(size_t bytes) noexcept {
  std::lock_guard lk(mu_);
  stats_.prefetched_bytes += bytes;
  ++stats_.prefetches;
}

ManagedPoolStats ManagedPool::stats() const {
  std::lock_guard lk(mu_);
  ManagedPoolStats s = stats_;
  s.chunks = chunks_.size();
  s.live_blocks = live_.size();
  s.idle_blocks = idle_[0].size() + idle_[1].size();
  s.pending_blocks = 0;
  for (int k = 0; k < 2; ++k)
    for (auto& [stream, set] : pending_[k]) s.pending_blocks += set.size();
  return s;
}

std::string ManagedPool::check() const {
  std::lock_guard lk(mu_);
  std::ostringstream err;
  size_t reserved = 0, allocated = 0, requested = 0, blocks = 0, idle = 0, pending = 0;
  for (auto& [base, c] : chunks_) {
    reserved += c->size;
    uintptr_t at = c->base;
    const Node* prev = nullptr;
    for (const Node* n = c->first; n; n = n->next) {
      ++blocks;
      if (n->addr != at) err << "gap or overlap at " << format_address(at) << " in chunk " << format_address(base) << "; ";
      if (n->prev != prev) err << "bad prev link at " << format_address(n->addr) << "; ";
      if (n->chunk != c.get()) err << "block " << format_address(n->addr) << " names another chunk; ";
      if (n->size < kMinBlock || n->size % kMinBlock) err << "odd block size " << n->size << "; ";
      auto found = nodes_.find(n->addr);
      if (found == nodes_.end() || found->second.get() != n) err << "block not indexed " << format_address(n->addr) << "; ";
      const int kind = c->small ? 1 : 0;
      const Key key{n->size, n->addr};
      switch (n->state) {
        case Node::State::allocated:
          allocated += n->size;
          requested += n->requested;
          if (!live_.count(n->addr)) err << "allocated block not live " << format_address(n->addr) << "; ";
          if (n->fence) err << "allocated block holds a fence; ";
          break;
        case Node::State::idle:
          ++idle;
          if (!idle_[kind].count(key)) err << "idle block not in its set " << format_address(n->addr) << "; ";
          if (n->fence) err << "idle block holds a fence; ";
          break;
        case Node::State::pending: {
          ++pending;
          auto ps = pending_[kind].find(n->stream);
          if (ps == pending_[kind].end() || !ps->second.count(key))
            err << "pending block not in its stream's set " << format_address(n->addr) << "; ";
          if (!n->fence) err << "pending block without a fence; ";
          break;
        }
      }
      if (prev && mergeable(prev, n)) err << "mergeable neighbours at " << format_address(n->addr) << "; ";
      at = n->addr + n->size;
      prev = n;
    }
    if (at != c->base + c->size) err << "chunk " << format_address(base) << " not tiled to its end; ";
  }
  size_t set_idle = idle_[0].size() + idle_[1].size(), set_pending = 0;
  for (int k = 0; k < 2; ++k)
    for (auto& [s, set] : pending_[k]) {
      if (set.empty()) err << "empty pending set left for a stream; ";
      set_pending += set.size();
    }
  if (blocks != nodes_.size()) err << "index has " << nodes_.size() << " blocks, chunks " << blocks << "; ";
  if (set_idle != idle || set_pending != pending) err << "free sets out of step with blocks; ";
  if (reserved != stats_.reserved.current) err << "reserved " << stats_.reserved.current << " != " << reserved << "; ";
  if (allocated != stats_.allocated.current) err << "allocated " << stats_.allocated.current << " != " << allocated << "; ";
  if (requested != stats_.requested.current) err << "requested " << stats_.requested.current << " != " << requested << "; ";
  if (live_.size() + idle + pending != blocks) err << "live count out of step; ";
  return err.str();
}

}  // namespace ferry
