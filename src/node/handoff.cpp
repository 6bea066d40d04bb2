// handoff.cpp — the node handoff's protocol (handoff.h): the plan, the ring's
// words, the two sides' steps, bounded waits that watch the peer, and the
// device ring's publish/map/withdraw handshake (its CUDA side injected).
#include "node/handoff.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>
#include <utility>

#include <unistd.h>

#include "core/fork.h"
#include "node/node_region.h"

namespace ferry::node {
namespace {

uint64_t align_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

// A key as Python's repr() writes a plain str ('req-7'): the messages are the
// same from Python and from C.
std::string repr_key(const std::string& key) {
  const char q = key.find('\'') != std::string::npos && key.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : key) {
    if (c == '\\' || c == static_cast<unsigned char>(q)) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + q;
}

// Bytes as ferry.units.fmt_bytes writes them: "12 KiB", "1.5 MiB", "512 B".
std::string size_text(uint64_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 6) {
    v /= 1024;
    ++u;
  }
  char buf[48];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
    return buf;
  }
  std::snprintf(buf, sizeof buf, "%.1f", v);
  std::string s(buf);
  if (s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0) s.resize(s.size() - 2);
  return s + " " + units[u];
}

std::string seconds_text(double s) {  // Python's {s:g}
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

std::string sizes_text(uint64_t slots, uint64_t slot_bytes) {
  return "slots=" + std::to_string(slots) + ", slot_bytes=" + std::to_string(slot_bytes) + " (" +
         size_text(slot_bytes) + ")";
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool is_forever(double t) { return std::isinf(t) || t > 1e9; }

void check_timeout(double t, const char* what) {
  if (std::isnan(t) || t < 0)
    throw InvalidArgument(std::string(what) + "=" + seconds_text(t) +
                          ": out of range: expected seconds >= 0 (infinity: no limit)");
}

}  // namespace

const char* handoff_route_name(HandoffRoute r) noexcept {
  switch (r) {
    case HandoffRoute::automatic: return "auto";
    case HandoffRoute::pool: return "pool";
    case HandoffRoute::peer: return "peer";
  }
  return "?";
}

HandoffRoute parse_handoff_route(const std::string& name) {
  if (name == "auto") return HandoffRoute::automatic;
  if (name == "pool") return HandoffRoute::pool;
  if (name == "peer") return HandoffRoute::peer;
  throw InvalidArgument("route=" + repr_key(name) + ": expected 'auto', 'pool' or 'peer'");
}

uint64_t handoff_header_bytes(uint32_t slots, uint64_t granule) {
  return align_up(4 * (kHandoffHeaderWords + uint64_t{2 + kHandoffMetaWords} * slots), granule);
}

void host_copy_many(void* const* dsts, const void* const* srcs, const size_t* sizes, size_t n) {
  for (size_t i = 0; i < n; ++i) std::memmove(dsts[i], srcs[i], sizes[i]);
}

// ---- the plan -----------------------------------------------------------------------------

HandoffPlan plan_handoff(std::span<const uint64_t> sizes, uint64_t slot_bytes) {
  if (slot_bytes == 0) throw InvalidArgument("plan_handoff: slot_bytes 0");
  HandoffPlan p;
  uint64_t at = 0;  // where the next item starts in the stream
  bool any = false;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const uint64_t n = sizes[i];
    if (n == 0) continue;
    if (any) at = align_up(at, kHandoffAlign);
    any = true;
    for (uint64_t done = 0; done < n;) {
      const uint64_t pos = at + done;
      const uint64_t chunk = pos / slot_bytes, in_slot = pos % slot_bytes;
      const uint64_t len = std::min(n - done, slot_bytes - in_slot);
      while (p.chunks.size() <= chunk) p.chunks.push_back(p.pieces.size());
      p.pieces.push_back({i, done, in_slot, len});
      done += len;
    }
    at += n;
    p.stream_bytes = at;
  }
  if (any) p.chunks.push_back(p.pieces.size());
  return p;
}

// ---- opening ------------------------------------------------------------------------------

struct Handoff::CallGuard {  // one call at a time per object
  explicit CallGuard(Handoff& h, const char* what) : h(h) {
    if (h.busy_.exchange(true, std::memory_order_acquire))
      throw InvalidArgument("Handoff " + repr_key(h.key_) + "." + what +
                            ": another call on this Handoff is in progress (one call at a time per object)");
  }
  ~CallGuard() { h.busy_.store(false, std::memory_order_release); }
  Handoff& h;
};

Handoff::Handoff(std::shared_ptr<NodePool> pool, std::string key, HandoffOptions options, HandoffCopy copy,
                 std::unique_ptr<HandoffDevice> device)
    : Handoff(std::move(pool), std::move(key), options,
              std::make_unique<HandoffCopyMover>(copy ? std::move(copy) : HandoffCopy(host_copy_many)),
              std::move(device)) {}

Handoff::Handoff(std::shared_ptr<NodePool> pool, std::string key, HandoffOptions options,
                 std::unique_ptr<HandoffMover> pool_mover, std::unique_ptr<HandoffDevice> device)
    : pool_(std::move(pool)), key_(std::move(key)), options_(options), pool_mover_(std::move(pool_mover)),
      device_(std::move(device)) {
  if (!pool_) throw InvalidArgument("Handoff: no pool");
  if (options_.slots < 1 || options_.slots > kHandoffMaxSlots)
    throw InvalidArgument("slots=" + std::to_string(options_.slots) + ": out of range: expected 1 .. " +
                          std::to_string(kHandoffMaxSlots));
  if (options_.slot_bytes < 1 || options_.slot_bytes > kHandoffMaxSlotBytes)
    throw InvalidArgument("slot_bytes=" + std::to_string(options_.slot_bytes) + ": out of range: expected 1 .. 2^44");
  options_.slot_bytes = align_up(options_.slot_bytes, kHandoffSlotAlign);
  check_timeout(options_.timeout_s, "timeout");
  if (!(options_.poll_s > 0) || std::isinf(options_.poll_s))
    throw InvalidArgument("poll=" + seconds_text(options_.poll_s) + ": expected seconds > 0");
  if (!pool_mover_) pool_mover_ = std::make_unique<HandoffCopyMover>(host_copy_many);
  if (options_.route == HandoffRoute::peer && !device_)
    throw NotSupported("Handoff " + repr_key(key_) + ": route='peer' needs a GPU on this side (device=) and a "
                       "CUDA build; route='auto' or 'pool' go through the node pool");
  generation_ = fork_generation();
  open_block();
}

Handoff::~Handoff() { close(); }

void Handoff::open_block() {
  header_bytes_ = handoff_header_bytes(options_.slots, pool_->granule());
  const uint64_t bytes = header_bytes_ + uint64_t{options_.slots} * options_.slot_bytes;
  try {
    block_ = pool_->allocate_named(key_, bytes, &created_);
  } catch (const InvalidArgument&) {
    const std::string other = other_side();
    if (other.empty()) throw;
    throw InvalidArgument("Handoff " + repr_key(key_) + ": the other side opened it with " + other +
                          "; this side asked " + sizes_text(options_.slots, options_.slot_bytes) +
                          ": give both sides the same slots and slot_bytes (or another key)");
  }
  closed_ = false;
  slot_base_ = pool_->data() + block_.offset + header_bytes_;
  try {
    write_or_check_header();
  } catch (...) {
    close();  // a failed open leaves nothing behind
    throw;
  }
}

// What the process that made the named block `key` asked, when it differs in
// size from this side's; "" if no such block is there. A look without holding
// the block (its maker may still be writing the header, or free it): a hint.
std::string Handoff::other_side() const {
  Region region(pool_->region_base());
  const bool repaired = region.lock();
  const uint32_t i = region.find_named(key_);
  uint64_t offset = 0, bytes = 0;
  if (i < kMaxNamed) {
    offset = region.named(i).first * pool_->granule();
    bytes = region.named(i).count * pool_->granule();
  }
  region.unlock();
  if (repaired) pool_->reclaim_dead();
  if (i >= kMaxNamed) return "";
  auto at = [&](uint32_t w) { return pool_->load(offset + 4ull * w); };
  const uint32_t magic = at(kHwMagic), ready = at(kHwReady), slots = at(kHwSlots), pages = at(kHwSlotPages);
  if (magic == kHandoffMagic && ready && slots >= 1 && slots <= kHandoffMaxSlots &&
      handoff_header_bytes(slots, pool_->granule()) + uint64_t{slots} * pages * kHandoffSlotAlign == bytes)
    return sizes_text(slots, uint64_t{pages} * kHandoffSlotAlign);
  return "a block of " + std::to_string(bytes) + " bytes (" + size_text(bytes) +
         "; its header is not a handoff's, or not written yet)";
}

// The pool zeroes a named block's first 4 KiB when it makes it, so READY reads
// 0 until the maker has written the whole header (which may run past 4 KiB: it
// clears that part first) and bumped READY.
void Handoff::write_or_check_header() {
  if (created_) {
    std::memset(pool_->data() + block_.offset, 0, 4 * (kHandoffHeaderWords + uint64_t{2 + kHandoffMetaWords} *
                                                                                  options_.slots));
    store(kHwMagic, kHandoffMagic);
    store(kHwSlots, options_.slots);
    store(kHwSlotPages, static_cast<uint32_t>(options_.slot_bytes / kHandoffSlotAlign));
    add(kHwReady);
  } else if (!pool_->wait_at_least(block_.offset + 4 * kHwReady, 1,
                                   is_forever(options_.timeout_s) ? kForever : options_.timeout_s)) {
    throw HandoffTimeout("handoff " + repr_key(key_) + ": the process that made its block did not finish writing "
                         "the header within " + seconds_text(options_.timeout_s) + " s");
  }
  const uint32_t magic = load(kHwMagic), slots = load(kHwSlots);
  const uint64_t slot_bytes = uint64_t{load(kHwSlotPages)} * kHandoffSlotAlign;
  if (magic != kHandoffMagic || slots != options_.slots || slot_bytes != options_.slot_bytes) {
    const std::string theirs = magic != kHandoffMagic ? "a block that is not a handoff's" : sizes_text(slots, slot_bytes);
    throw InvalidArgument("Handoff " + repr_key(key_) + ": the other side opened it with " + theirs +
                          "; this side asked " + sizes_text(options_.slots, options_.slot_bytes) +
                          ": give both sides the same slots and slot_bytes (or another key)");
  }
  // where each side is: what its counters say (so a reopened side resumes)
  for (uint32_t s = 0; s < options_.slots; ++s) {
    sent_ += load(filled_word(s));
    received_ += load(drained_word(s));
  }
}

// ---- words --------------------------------------------------------------------------------

uint32_t& Handoff::word(uint64_t index) const {
  return *reinterpret_cast<uint32_t*>(pool_->data() + block_.offset + 4 * index);
}
uint32_t Handoff::load(uint64_t index) const {  // seq_cst: the ring's withdrawal is a Dekker handshake
  return std::atomic_ref<uint32_t>(word(index)).load(std::memory_order_seq_cst);
}
void Handoff::store(uint64_t index, uint32_t value) const {
  std::atomic_ref<uint32_t>(word(index)).store(value, std::memory_order_seq_cst);
}
void Handoff::add(uint64_t index) const { pool_->add(block_.offset + 4 * index, 1); }

// ---- the two sides ------------------------------------------------------------------------

void Handoff::usable(const char* what) const {
  if (generation_ != fork_generation() || closed_) {
    if (generation_ != fork_generation()) pool_->load(block_.offset);  // the pool's NotSupported, with its words
    throw InvalidArgument("Handoff " + repr_key(key_) + "." + what + ": the handoff was closed; open it again");
  }
}

void Handoff::note_route(HandoffRoute r) {
  const bool peer = r == HandoffRoute::peer;
  (peer ? stats_.peer_slots : stats_.pool_slots) += 1;
  (peer ? stats_.last_peer_slots : stats_.last_pool_slots) += 1;
}

// META then FILLED for a batch whose bytes are in place.
void Handoff::publish_slot(uint32_t slot, uint64_t stream_bytes, size_t items, uint32_t call, HandoffRoute route) {
  store(meta_word(slot, kMetaBytesLo), static_cast<uint32_t>(stream_bytes));
  store(meta_word(slot, kMetaBytesHi), static_cast<uint32_t>(stream_bytes >> 32));
  store(meta_word(slot, kMetaItems), static_cast<uint32_t>(items));
  store(meta_word(slot, kMetaCall), call);
  store(meta_word(slot, kMetaRoute), static_cast<uint32_t>(route));
  add(filled_word(slot));
}

// The producer's batch in flight: waits for its copy, then (device ring)
// RING_END, then META and FILLED. A failed copy leaves the handoff broken
// (the stream has a hole).
void Handoff::land(uint64_t stream_bytes, size_t items, uint32_t call) {
  if (!flight_.live) return;
  flight_.live = false;
  const bool peer = flight_.route == HandoffRoute::peer;
  try {
    mover(flight_.route).wait(flight_.ticket);
  } catch (...) {
    if (peer) add(kHwRingEnd);
    store(kHwBroken, 1);
    throw;
  }
  if (peer) add(kHwRingEnd);
  publish_slot(flight_.slot, stream_bytes, items, call, flight_.route);
}

uint64_t Handoff::send(const void* const* srcs, const uint64_t* sizes, size_t n) {
  CallGuard guard(*this, "send");
  usable("send");
  join(true);
  const HandoffPlan plan = plan_handoff(std::span<const uint64_t>(sizes, n), options_.slot_bytes);
  const uint32_t call = ++calls_;
  std::vector<void*> d;
  std::vector<const void*> s;
  std::vector<size_t> len;
  stats_.last_pool_slots = stats_.last_peer_slots = 0;
  // Under auto, small blocks take the pool: GPU to GPU they move as one DMA
  // descriptor each, slower than through host memory (2x H100, 2026-11-28:
  // 64 KiB blocks 13.2 GB/s peer, 39.9 pool; 600 blocks of 64 KiB-2 MiB,
  // 107 peer, 42.3 pool; 2 MiB 273 peer, 44 pool).
  uint64_t total = 0;
  for (size_t i = 0; i < n; ++i) total += sizes[i];
  const uint64_t min_mean = options_.peer_min_mean_bytes != kHandoffPeerMinMeanAuto ? options_.peer_min_mean_bytes
                            : device_                                              ? device_->min_mean_bytes()
                                                                                   : kHandoffPeerMinMeanBytes;
  const bool small_blocks = options_.route == HandoffRoute::automatic && n > 0 && total / n < min_mean;
  if (small_blocks && device_)
    refused_why_ = "blocks of this send average " + std::to_string(total / n) + " bytes, below " +
                   std::to_string(min_mean) +
                   ": GPU to GPU they move slower than through the pool";
  try {
    for (size_t c = 0; c < plan.chunk_count(); ++c) {
      const uint64_t b = sent_;
      const uint32_t slot = static_cast<uint32_t>(b % options_.slots);
      const uint64_t round = b / options_.slots;
      // the batch in flight lands first where this wait may need it, or the ring may change
      if (flight_.live && (static_cast<int32_t>(load(drained_word(slot)) - static_cast<uint32_t>(round)) < 0 ||
                           load(kHwRingState) != kRingPublished || load(kHwRingGen) != mapped_gen_))
        land(plan.stream_bytes, n, call);
      wait(drained_word(slot), round, false,
           "drain slot " + std::to_string(slot) + " (batch " + std::to_string(b) + ")", options_.timeout_s, -1);
      const HandoffRoute route = small_blocks ? HandoffRoute::pool : producer_route(slot);  // peer: RING_BEGIN bumped
      char* base = route == HandoffRoute::peer ? mapped_ + uint64_t{slot} * options_.slot_bytes : host_slot(slot);
      d.clear(), s.clear(), len.clear();
      for (size_t i = plan.chunks[c]; i < plan.chunks[c + 1]; ++i) {
        const HandoffPiece& p = plan.pieces[i];
        d.push_back(base + p.slot_offset);
        s.push_back(static_cast<const char*>(srcs[p.item]) + p.item_offset);
        len.push_back(p.bytes);
      }
      uint64_t ticket;
      try {
        ticket = mover(route).start(d.data(), s.data(), len.data(), d.size());
      } catch (...) {
        if (route == HandoffRoute::peer) add(kHwRingEnd);  // RING_END follows RING_BEGIN whatever the copy did
        throw;
      }
      land(plan.stream_bytes, n, call);  // batch b-1, while batch b's copy runs
      flight_ = {true, ticket, slot, route};
      if (!mover(route).overlaps()) land(plan.stream_bytes, n, call);  // copied already: published at once
      sent_ = b + 1;
      ++stats_.sent;
      note_route(route);
    }
    land(plan.stream_bytes, n, call);
  } catch (...) {
    if (flight_.live) {  // a copy may still run into the ring: the stream has a hole either way
      try {
        land(plan.stream_bytes, n, call);
      } catch (...) {
      }
      store(kHwBroken, 1);
    }
    throw;
  }
  return plan.stream_bytes;
}

// The consumer's batch in flight: waits for its copy, then adds its DRAINED.
// A failed copy breaks the handoff.
void Handoff::land_drained() {
  if (!drain_flight_.live) return;
  drain_flight_.live = false;
  try {
    mover(drain_flight_.route).wait(drain_flight_.ticket);
  } catch (...) {
    store(kHwBroken, 2);
    throw;
  }
  add(drained_word(drain_flight_.slot));
}

uint64_t Handoff::recv(void* const* dsts, const uint64_t* sizes, size_t n) {
  CallGuard guard(*this, "recv");
  usable("recv");
  join(false);
  const HandoffPlan plan = plan_handoff(std::span<const uint64_t>(sizes, n), options_.slot_bytes);
  if (!ring_decided_) consumer_publish(dsts, n);
  std::vector<void*> d;
  std::vector<const void*> s;
  std::vector<size_t> len;
  stats_.last_pool_slots = stats_.last_peer_slots = 0;
  try {
    for (size_t c = 0; c < plan.chunk_count(); ++c) {
      const uint64_t b = received_;
      const uint32_t slot = static_cast<uint32_t>(b % options_.slots);
      const uint64_t round = b / options_.slots;
      // the batch in flight lands first where the producer may need its slot for this one
      if (drain_flight_.live && static_cast<int32_t>(load(filled_word(slot)) - static_cast<uint32_t>(round + 1)) < 0)
        land_drained();
      wait(filled_word(slot), round + 1, true,
           "fill slot " + std::to_string(slot) + " (batch " + std::to_string(b) + ")", options_.timeout_s, -1);
      const uint64_t sent_bytes = load(meta_word(slot, kMetaBytesLo)) |
                                  uint64_t{load(meta_word(slot, kMetaBytesHi))} << 32;
      const uint32_t sent_items = load(meta_word(slot, kMetaItems));
      if (c == 0 && (sent_bytes != plan.stream_bytes || sent_items != static_cast<uint32_t>(n)))
        throw InvalidArgument("handoff " + repr_key(key_) + ": recv of " + std::to_string(n) + " items (" +
                              std::to_string(plan.stream_bytes) + " bytes in the stream) but the producer's send had " +
                              std::to_string(sent_items) + " items (" + std::to_string(sent_bytes) +
                              " bytes): give recv the sizes send had");
      const bool peer = load(meta_word(slot, kMetaRoute)) == static_cast<uint32_t>(HandoffRoute::peer);
      if (peer && !ring_)
        throw HandoffError("handoff " + repr_key(key_) + ": slot " + std::to_string(slot) + " came through a device "
                           "ring this consumer never published (two consumers on one key?)");
      const char* base = peer ? ring_ + uint64_t{slot} * options_.slot_bytes : host_slot(slot);
      d.clear(), s.clear(), len.clear();
      for (size_t i = plan.chunks[c]; i < plan.chunks[c + 1]; ++i) {
        const HandoffPiece& p = plan.pieces[i];
        d.push_back(static_cast<char*>(dsts[p.item]) + p.item_offset);
        s.push_back(base + p.slot_offset);
        len.push_back(p.bytes);
      }
      const HandoffRoute route = peer ? HandoffRoute::peer : HandoffRoute::pool;
      const uint64_t ticket = mover(route).start(d.data(), s.data(), len.data(), d.size());
      land_drained();  // batch b-1, while batch b's copy runs
      drain_flight_ = {true, ticket, slot, route};
      if (!mover(route).overlaps()) land_drained();  // copied already: drained at once
      received_ = b + 1;
      ++stats_.received;
      note_route(peer ? HandoffRoute::peer : HandoffRoute::pool);
    }
    land_drained();
  } catch (...) {
    if (drain_flight_.live) {  // its bytes may be in place or not: the stream has a hole either way
      try {
        land_drained();
      } catch (...) {
      }
      store(kHwBroken, 2);
    }
    throw;
  }
  return plan.stream_bytes;
}

void Handoff::drain(double timeout_s) {
  CallGuard guard(*this, "drain");
  usable("drain");
  check_timeout(timeout_s, "timeout");
  const bool forever = is_forever(timeout_s);
  const double deadline = forever ? 0 : now_s() + timeout_s;
  for (uint32_t s = 0; s < options_.slots; ++s) {
    const uint64_t need = sent_ / options_.slots + (s < sent_ % options_.slots ? 1 : 0);
    const double left = forever ? kForever : std::max(0.0, deadline - now_s());
    wait(drained_word(s), need, false, "drain slot " + std::to_string(s), left, timeout_s);
  }
  producer_unmap();  // everything landed: let go of the consumer's ring until the next send
}

uint64_t Handoff::pending() const {
  usable("pending");
  uint64_t n = 0;
  for (uint32_t s = 0; s < options_.slots; ++s) n += load(filled_word(s)) - load(drained_word(s));
  return n;
}

void Handoff::set_timeout(double timeout_s) {
  check_timeout(timeout_s, "timeout");
  options_.timeout_s = timeout_s;
}

// ---- waiting, watching the peer -----------------------------------------------------------

// Writes this process's pool slot and pid for its role, once, so the peer can watch it.
void Handoff::join(bool producer) {
  check_broken();
  bool& joined = joined_[producer ? 0 : 1];
  if (joined) return;
  const uint32_t w = producer ? kHwProducer : kHwConsumer;
  store(w + 1, static_cast<uint32_t>(::getpid()));
  store(w, pool_->slot() + 1);
  joined = true;
}

void Handoff::check_broken() const {
  const uint32_t why = load(kHwBroken);
  if (!why) return;
  const char* side = why == 1 ? "producer" : why == 2 ? "consumer" : "other side";
  throw HandoffError("handoff " + repr_key(key_) + " is broken: the " + side +
                     " gave up after an error; open a new key");
}

// "" while the peer is a live member (or has not joined), else why not.
std::string Handoff::peer_gone(bool producer_is_peer) {
  const uint32_t w = producer_is_peer ? kHwProducer : kHwConsumer;
  const uint32_t slot = load(w), pid = load(w + 1);
  if (slot == 0) return "";
  for (const HolderInfo& m : pool_->stats().members)
    if (m.slot + 1 == slot && static_cast<uint32_t>(m.pid) == pid) return "";
  return std::string("the ") + (producer_is_peer ? "producer" : "consumer") + " (pid " + std::to_string(pid) +
         ") left the pool";
}

// Waits until the word reaches value, at most timeout_s (kForever: no limit;
// told_s >= 0: the limit the message names, if not that).
void Handoff::wait(uint64_t word_index, uint64_t value, bool producer_is_peer, const std::string& what,
                   double timeout_s, double told_s) {
  const bool forever = is_forever(timeout_s);
  const double deadline = forever ? 0 : now_s() + timeout_s;
  const double step = forever ? options_.poll_s : std::min(options_.poll_s, timeout_s);
  const uint32_t target = static_cast<uint32_t>(value);
  while (!pool_->wait_at_least(block_.offset + 4 * word_index, target, step)) {
    check_broken();
    if (!producer_is_peer && load(kHwRingState) != kRingPublished) producer_unmap();  // withdrawn: let go now
    const std::string gone = peer_gone(producer_is_peer);
    if (gone.empty() && (forever || now_s() < deadline)) continue;
    const char* peer = producer_is_peer ? "producer" : "consumer";
    store(kHwBroken, producer_is_peer ? 2 : 1);  // the peer's waits fail too
    if (!gone.empty())
      throw HandoffPeerGone("handoff " + repr_key(key_) + ": waiting for the " + peer + " to " + what + ", but " + gone +
                            " (died, was killed or closed the pool): " + std::to_string(pending()) +
                            " slots undelivered");
    const double told = told_s >= 0 ? told_s : timeout_s;
    const std::string where = load(producer_is_peer ? kHwProducer : kHwConsumer) == 0
                                  ? std::string("it has not started: no ") + (producer_is_peer ? "send" : "recv") +
                                        " call yet"
                                  : "it is still in the pool: " + pool_->describe_holders();
    throw HandoffTimeout("handoff " + repr_key(key_) + ": the " + peer + " did not " + what + " within " +
                         seconds_text(told) + " s (" + where + "); raise timeout= if it is slow");
  }
}

// ---- the device ring ----------------------------------------------------------------------

// Producer: the route of the slot about to be filled. On peer, RING_BEGIN was
// bumped and the caller bumps RING_END after its copy.
HandoffRoute Handoff::producer_route(uint32_t) {
  if (!device_ || options_.route == HandoffRoute::pool) return HandoffRoute::pool;
  uint32_t state = load(kHwRingState), gen = load(kHwRingGen);
  if (options_.route == HandoffRoute::peer && state != kRingPublished) {
    // peer insists: the consumer publishes at its first recv; wait for it (bounded)
    const bool forever = is_forever(options_.timeout_s);
    const double deadline = forever ? 0 : now_s() + options_.timeout_s;
    while ((state = load(kHwRingState)) != kRingPublished) {
      check_broken();
      if (state == kRingWithdrawn || (!forever && now_s() >= deadline) || !peer_gone(false).empty())
        throw NotSupported("handoff " + repr_key(key_) + ": route='peer' but the consumer " +
                           (state == kRingWithdrawn ? "withdrew its device ring"
                                                    : "published no device ring within " +
                                                          seconds_text(options_.timeout_s) +
                                                          " s (it runs route='pool', has no GPU, or has not "
                                                          "called recv)"));
      pool_->wait_at_least(block_.offset + 4 * kHwRingGen, 1, std::min(options_.poll_s, 0.01));
    }
    gen = load(kHwRingGen);
  }
  if (state != kRingPublished) {
    if (mapped_) producer_unmap();
    return HandoffRoute::pool;
  }
  if (gen != mapped_gen_) {
    producer_unmap();
    if (gen == refused_gen_) return HandoffRoute::pool;
    HandoffRingExport e;
    std::memcpy(e.handle, &word(kHwRingHandle), kHandoffExportBytes);
    std::memcpy(e.bus_id, &word(kHwRingBus), kHandoffBusIdBytes);
    e.bus_id[kHandoffBusIdBytes - 1] = '\0';
    e.bytes = load(kHwRingBytes) | uint64_t{load(kHwRingBytes + 1)} << 32;
    std::string why;
    char* base = nullptr;
    try {
      base = e.bytes >= uint64_t{options_.slots} * options_.slot_bytes ? device_->map(e, &why) : nullptr;
    } catch (const Error& err) {  // a CUDA error asking: the pool route, saying why
      why = err.what();
    }
    if (!base) {
      refused_gen_ = gen;
      refused_why_ = why.empty() ? "the device ring is smaller than the slots" : why;
      if (options_.route == HandoffRoute::peer)
        throw NotSupported("handoff " + repr_key(key_) + ": route='peer' but " + refused_why_);
      return HandoffRoute::pool;
    }
    mapped_ = base;
    mapped_gen_ = gen;
    store(kHwRingMapped, gen);
  }
  add(kHwRingBegin);
  std::atomic_thread_fence(std::memory_order_seq_cst);  // the re-read below sees a withdrawal stored before it
  if (load(kHwRingState) == kRingPublished && load(kHwRingGen) == mapped_gen_) return HandoffRoute::peer;
  add(kHwRingEnd);
  producer_unmap();
  if (options_.route == HandoffRoute::peer)
    throw NotSupported("handoff " + repr_key(key_) + ": route='peer' but the consumer withdrew its device ring");
  return HandoffRoute::pool;
}

void Handoff::producer_unmap() noexcept {
  if (!mapped_) return;
  device_->unmap();
  mapped_ = nullptr;
  mapped_gen_ = 0;
  try {
    store(kHwRingMapped, 0);
    pool_->add(block_.offset + 4 * kHwRingMapped, 0);  // wakes a withdrawing consumer
  } catch (...) {
  }
}

// Consumer, first recv: publishes a device ring when the route allows it.
void Handoff::consumer_publish(void* const* dsts, size_t n) {
  ring_decided_ = true;
  if (!device_ || options_.route == HandoffRoute::pool) {
    refused_why_ = !device_ ? "this consumer has no GPU side (device=)" : "this consumer asked route='pool'";
    return;
  }
  if (options_.route == HandoffRoute::automatic && !device_->on_device(dsts, n)) {
    refused_why_ = "the consumer's first recv went to memory that is not its GPU's (host memory: the pool route)";
    return;
  }
  HandoffRingExport e;
  try {
    ring_ = device_->publish(uint64_t{options_.slots} * options_.slot_bytes, &e);
  } catch (const Error& err) {
    if (options_.route == HandoffRoute::peer) throw;
    refused_why_ = std::string("the consumer could not publish a device ring: ") + err.what();
    return;  // auto: no device ring (out of GPU memory, no IPC here): every slot takes the pool
  }
  std::memcpy(&word(kHwRingHandle), e.handle, kHandoffExportBytes);
  std::memcpy(&word(kHwRingBus), e.bus_id, kHandoffBusIdBytes);
  store(kHwRingBytes, static_cast<uint32_t>(e.bytes));
  store(kHwRingBytes + 1, static_cast<uint32_t>(e.bytes >> 32));
  add(kHwRingGen);
  store(kHwRingState, kRingPublished);  // after RING_GEN: a producer that sees 1 reads the new generation
}

// Consumer, close: no copy into the ring in flight and the producer unmapped
// it (or left), at most the timeout; else the ring is leaked, never freed
// under a live mapping.
void Handoff::consumer_withdraw() noexcept {
  if (!ring_) return;
  bool safe = false;
  try {
    store(kHwRingState, kRingWithdrawn);
    std::atomic_thread_fence(std::memory_order_seq_cst);  // before the reads below (the producer's BEGIN)
    const uint32_t begun = load(kHwRingBegin);
    const bool forever = is_forever(options_.timeout_s);
    const double deadline = forever ? 0 : now_s() + options_.timeout_s;
    for (;;) {
      const bool quiet = static_cast<int32_t>(load(kHwRingEnd) - begun) >= 0 && load(kHwRingMapped) == 0;
      if (quiet || !peer_gone(true).empty()) {
        safe = true;
        break;
      }
      if (!forever && now_s() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::duration<double>(std::min(options_.poll_s, 0.01)));
    }
  } catch (...) {
  }
  if (safe) device_->free_ring();  // else leaked: the producer may still map it
  ring_ = nullptr;
}

void Handoff::close() noexcept {
  if (closed_) return;
  closed_ = true;
  if (generation_ != fork_generation()) {  // a forked child: nothing here is ours to free
    (void)device_.release();      // NOLINT: their CUDA state (streams, events, the ring)
    (void)pool_mover_.release();  // is the parent's: leaked on purpose, never touched here
    return;
  }
  try {
    producer_unmap();
    consumer_withdraw();
    pool_->release(block_.offset);
  } catch (...) {
  }
}

}  // namespace ferry::node
