// handoff.h — a ring of slots that hands batches of blocks (KV caches) from one
// process of the node (the producer) to another (the consumer): the node pool's
// named block `key` holds the ring's words and its host slots; where the two
// GPUs reach each other, the slots travel GPU to GPU through a device ring that
// the consumer exports (the peer route) and the host slots stay unused.
//
// Protocol (one producer and one consumer per key; both open the named block
// with the same slots and slot_bytes)
// ---------------------------------------------------------------------------
// Block layout (32-bit words from the block's start; kHandoff* below):
//   header, kHandoffHeaderWords words:
//     0  MAGIC        kHandoffMagic once the maker wrote the header
//     1  READY        0 until the maker wrote the whole header, then 1 (futex)
//     2  SLOTS        3  SLOT_PAGES (slot_bytes / 4096)
//     4  BROKEN       0; 1: the producer gave up, 2: the consumer gave up
//     6,7  PRODUCER   its node pool member slot + 1 (0: not joined yet), its pid
//     8,9  CONSUMER   the same for the consumer
//     10 RING_STATE   0: no device ring; 1: published; 2: withdrawn (consumer)
//     11 RING_GEN     bumped by the consumer at each publish
//     12 RING_BEGIN   producer: bumped before it touches the device ring
//     13 RING_END     producer: bumped after (the copy has landed)
//     14 RING_MAPPED  producer: the generation it has mapped (0: none)
//     16..31 RING_HANDLE   the ring's export (cudaIpcMemHandle_t, 64 bytes)
//     32..35 RING_BUS      the consumer GPU's PCI bus id ("0000:3b:00.0", NUL-ended)
//     36,37 RING_BYTES     the device ring's size (lo, hi)
//   FILLED[slots]    producer's counter per slot: rounds filled (futex)
//   DRAINED[slots]   consumer's counter per slot: rounds drained (futex)
//   META[slots][kHandoffMetaWords]  per slot, written by the producer before it
//                    bumps FILLED: stream bytes (lo, hi), item count, send call
//                    number, ROUTE (1: the host slot, 2: the device ring)
//   then, at handoff_header_bytes() (whole granules), `slots` host slots.
// Every word is written by one side only (the maker writes the first four, then
// never again; BROKEN by whichever side gives up); counters change through
// NodePool::add (an atomic read-modify-write that wakes futex waiters).
//
// The stream: a send call's items, each at a kHandoffAlign boundary after the
// previous one, cut every slot_bytes (plan_handoff: both sides compute the same
// plan from the sizes). Batch b of the stream uses slot b % slots, round b / slots.
//
// States of slot s (r = its round): free(r) while FILLED == DRAINED == r;
// filled(r) once FILLED == r + 1 (META and the bytes are in place, on the
// route ROUTE says); free(r + 1) once DRAINED == r + 1.
//   send, per batch: wait DRAINED[s] >= r (the consumer copied the slot's last
//     use out); choose the route (below); start the batch's pieces with ONE
//     copy call (a HandoffMover); once it landed: write META; add(FILLED[s]).
//   recv, per batch: wait FILLED[s] >= r + 1; the first batch of a call checks
//     META's stream bytes and item count against its own plan (a mismatch is
//     InvalidArgument and consumes nothing); start the pieces' copy out of the
//     place ROUTE names with ONE copy call; once it landed: add(DRAINED[s]).
// So the producer fills slot k+1 while the consumer drains slot k. Each side
// also overlaps its own batches (movers whose start() returns before the copy
// landed): the producer starts batch b's copy before it publishes batch b-1
// (waits for b-1's copy, writes META, adds FILLED), the consumer starts b's
// before it adds b-1's DRAINED, so a link stays busy while the host does the
// bookkeeping; a side lands b-1 first where batch b's wait needs it (one
// slot), and before its call returns. A synchronous copy is published at once.
//
// The device ring (peer route; HandoffDevice, made by the CUDA layer:
// cuda/ipc_ring.h). The consumer, at its first recv (route auto or peer, a
// HandoffDevice given, and for auto: that call's destinations are memory of its
// GPU), allocates slots * slot_bytes on its GPU, writes RING_HANDLE, RING_BUS,
// RING_BYTES, then RING_GEN += 1 and RING_STATE = 1 (release). The producer,
// per batch: if RING_STATE == 1, it maps generation RING_GEN once (the
// consumer's GPU must be visible here and reachable: same GPU or peer access;
// else it remembers "pool" for that generation), writes RING_MAPPED = gen;
// then add(RING_BEGIN), re-reads RING_STATE/RING_GEN (still 1 and its gen:
// copy into the device ring, ROUTE = 2; else the host slot, ROUTE = 1),
// add(RING_END). Slots filled before the consumer published went by the host
// slots (ROUTE = 1) and are read from there: each slot says where it is.
// Withdrawal (the consumer's close): RING_STATE = 2 (seq_cst), then wait until
// RING_END >= RING_BEGIN as read after that store (no copy into the ring in
// flight; the producer's re-read after its BEGIN sees 2) and RING_MAPPED == 0
// (the producer unmapped: CUDA says freeing memory that another process still
// maps is undefined), at most the timeout, watching the producer: a producer
// that left the pool took its mapping with it. The producer unmaps in drain()
// once everything is drained, in close(), and whenever a wait sees the ring
// withdrawn. A close that times out leaks the ring rather than free it.
//
// Waits are bounded (timeout_s; kForever: none) and watch the peer: every
// poll_s the waiter checks BROKEN and whether the peer (PRODUCER/CONSUMER
// words) is still a live member of the pool; a gone peer -> HandoffPeerGone,
// a timeout -> HandoffTimeout, and both set BROKEN, so the peer's waits fail
// too (HandoffError "broken"): open a new key. A peer that has not joined yet
// is only timed.
//
// Threads: one call at a time per Handoff object (a second concurrent call is
// InvalidArgument); no mutex, no lock held across a copy. A forked child's
// Handoff refuses every call (the pool does) and its close() releases nothing.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "node/node_pool.h"

namespace ferry::node {

constexpr uint32_t kHandoffMagic = 0x32484F46;  // "FOH2" (the layout before the device ring was "FODH")
constexpr uint64_t kHandoffAlign = 256;         // items start at this boundary in the stream
constexpr uint64_t kHandoffSlotAlign = 4096;    // slot_bytes is rounded up to this
constexpr uint32_t kHandoffMaxSlots = 4096;
constexpr uint64_t kHandoffMaxSlotBytes = uint64_t{1} << 44;
constexpr uint32_t kHandoffHeaderWords = 64;
constexpr uint32_t kHandoffMetaWords = 8;
constexpr size_t kHandoffExportBytes = 64;  // RING_HANDLE
constexpr size_t kHandoffBusIdBytes = 16;   // RING_BUS
// HandoffDevice::min_mean_bytes's default (copy engines GPU to GPU), and
// HandoffOptions::peer_min_mean_bytes's "ask the device"
constexpr uint64_t kHandoffPeerMinMeanBytes = uint64_t{256} << 10;
constexpr uint64_t kHandoffPeerMinMeanAuto = ~uint64_t{0};

// Header words (see the protocol above).
enum HandoffWord : uint32_t {
  kHwMagic = 0, kHwReady = 1, kHwSlots = 2, kHwSlotPages = 3, kHwBroken = 4,
  kHwProducer = 6, kHwConsumer = 8,  // (member slot + 1, pid)
  kHwRingState = 10, kHwRingGen = 11, kHwRingBegin = 12, kHwRingEnd = 13, kHwRingMapped = 14,
  kHwRingHandle = 16, kHwRingBus = 32, kHwRingBytes = 36,
};
enum HandoffMeta : uint32_t { kMetaBytesLo = 0, kMetaBytesHi = 1, kMetaItems = 2, kMetaCall = 3, kMetaRoute = 4 };
enum : uint32_t { kRingNone = 0, kRingPublished = 1, kRingWithdrawn = 2 };

// Which way a slot went (META's ROUTE) and what a Handoff may use.
enum class HandoffRoute : uint32_t { automatic = 0, pool = 1, peer = 2 };
const char* handoff_route_name(HandoffRoute r) noexcept;  // "auto", "pool", "peer"
HandoffRoute parse_handoff_route(const std::string& name);  // InvalidArgument quoting others

// Errors: the handoff cannot go on. HandoffError itself: it was broken by the
// other side (or an earlier error here).
class HandoffError : public Error {
 public:
  explicit HandoffError(const std::string& m, ferry_status_t s = FERRY_ERROR_BROKEN) : Error(s, m) {}
};
class HandoffTimeout : public HandoffError {
 public:
  explicit HandoffTimeout(const std::string& m) : HandoffError(m, FERRY_ERROR_TIMEOUT) {}
};
class HandoffPeerGone : public HandoffError {
 public:
  explicit HandoffPeerGone(const std::string& m) : HandoffError(m, FERRY_ERROR_PEER_GONE) {}
};

// The ring's header in bytes, whole granules: the host slots start after it.
uint64_t handoff_header_bytes(uint32_t slots, uint64_t granule);

// The plan of one call: pieces in stream order, chunk c (slot-sized batch c of
// the stream) being pieces[chunks[c] .. chunks[c + 1]). Items of size 0 have no
// piece; an item that crosses a slot boundary is split.
struct HandoffPiece {
  uint64_t item = 0;         // index into the call's items
  uint64_t item_offset = 0;  // where the piece starts in its item
  uint64_t slot_offset = 0;  // where it lands in its slot
  uint64_t bytes = 0;
};
struct HandoffPlan {
  uint64_t stream_bytes = 0;
  std::vector<HandoffPiece> pieces;
  std::vector<size_t> chunks;  // chunk_count() + 1 bounds (empty when nothing moves)
  size_t chunk_count() const { return chunks.empty() ? 0 : chunks.size() - 1; }
};
HandoffPlan plan_handoff(std::span<const uint64_t> sizes, uint64_t slot_bytes);

// The copy function the caller injects: n pieces, dsts[i] <- srcs[i], sizes[i]
// bytes; returns when every byte is in place (throws a ferry::Error otherwise).
// The CUDA layer gives the copy engine's copy_many; tests and CPU-only runs memcpy.
using HandoffCopy = std::function<void(void* const* dsts, const void* const* srcs, const size_t* sizes, size_t n)>;
void host_copy_many(void* const* dsts, const void* const* srcs, const size_t* sizes, size_t n);  // memcpy each

// The device ring (peer route), implemented by the CUDA layer (cuda/ipc_ring.h).
// One object per Handoff side; its calls come from that side's calling thread.
struct HandoffRingExport {
  uint8_t handle[kHandoffExportBytes] = {};
  char bus_id[kHandoffBusIdBytes] = {};
  uint64_t bytes = 0;
};
// Starts batches of copies and waits for them: the pool route's copies (the
// copy engine's async copy_many; a HandoffCopy runs synchronously) and the
// device ring's. start() returns a ticket at once; wait(ticket) returns when
// that batch landed (throws its error). At most 2 batches are started and not
// waited for; tickets are waited for in order. Calls come from one thread.
class HandoffMover {
 public:
  virtual ~HandoffMover() = default;
  virtual uint64_t start(void* const* dsts, const void* const* srcs, const size_t* sizes, size_t n) = 0;
  virtual void wait(uint64_t ticket) = 0;
  // Whether start() returns before the bytes landed (then the protocol overlaps
  // batches); a synchronous mover's batch is published at once.
  virtual bool overlaps() const { return true; }
};

// A HandoffCopy as a mover: start() copies, wait() has nothing to wait for.
class HandoffCopyMover : public HandoffMover {
 public:
  explicit HandoffCopyMover(HandoffCopy copy) : copy_(std::move(copy)) {}
  uint64_t start(void* const* d, const void* const* s, const size_t* n, size_t k) override {
    copy_(d, s, n, k);
    return 0;
  }
  void wait(uint64_t) override {}
  bool overlaps() const override { return false; }

 private:
  HandoffCopy copy_;
};

class HandoffDevice : public HandoffMover {
 public:
  // Consumer: whether the n destinations are memory of this side's GPU (auto
  // publishes a ring only then: an offload tier in host memory takes the pool).
  virtual bool on_device(void* const* dsts, size_t n) = 0;
  // Consumer: allocates `bytes` on this side's GPU and exports it; the base.
  virtual char* publish(uint64_t bytes, HandoffRingExport* out) = 0;
  // Consumer: frees the ring (after the producer let go of it). Never throws.
  virtual void free_ring() noexcept = 0;
  // Producer: maps the consumer's ring; nullptr (and *why) when this side's GPU
  // cannot reach it (the GPU is not visible here, no peer access).
  virtual char* map(const HandoffRingExport& ring, std::string* why) = 0;
  // Producer: lets go of the mapping, after any copy into it started here landed.
  virtual void unmap() noexcept = 0;
  // Either side: copies between device memory (and the mapped ring) on this
  // side's GPU with one batch; returns when the bytes landed.
  virtual void copy(void* const* dsts, const void* const* srcs, const size_t* sizes, size_t n) = 0;
  // The mover: the same batches, started (the default copies synchronously).
  uint64_t start(void* const* dsts, const void* const* srcs, const size_t* sizes, size_t n) override {
    copy(dsts, srcs, sizes, n);
    return 0;
  }
  void wait(uint64_t) override {}
  bool overlaps() const override { return false; }
  // Route auto: the mean block bytes under which this device's copies are
  // slower than the pool's (HandoffOptions::peer_min_mean_bytes's default).
  virtual uint64_t min_mean_bytes() const { return kHandoffPeerMinMeanBytes; }
  // Copy batches moved by SMs rather than copy engines (reports, tests).
  virtual uint64_t sm_batches() const { return 0; }
};

struct HandoffOptions {
  uint32_t slots = 4;                  // 1 .. kHandoffMaxSlots
  uint64_t slot_bytes = 64ull << 20;   // 1 .. 2^44; rounded up to kHandoffSlotAlign
  double timeout_s = 60;               // a wait's limit (kForever: none; negative or NaN refused)
  double poll_s = 0.25;                // how often a wait checks the peer (> 0, finite)
  HandoffRoute route = HandoffRoute::automatic;
  // route automatic: a send whose blocks average fewer bytes goes through the
  // pool even where the device ring is there (GPU to GPU by the copy engines,
  // small blocks move one DMA descriptor each, slower than through host
  // memory; see send()). kHandoffPeerMinMeanAuto: the HandoffDevice's own
  // figure (min_mean_bytes(): 0 where its SMs copy small blocks).
  uint64_t peer_min_mean_bytes = kHandoffPeerMinMeanAuto;
};

struct HandoffStats {
  uint64_t sent = 0, received = 0;          // batches (slots) since open, this process
  uint64_t pool_slots = 0, peer_slots = 0;  // of those, by route
  uint64_t last_pool_slots = 0, last_peer_slots = 0;  // the last send or recv call's, by route
  uint64_t sm_batches = 0;  // copy batches this side's HandoffDevice moved by SMs (not copy engines)
};

class Handoff {
 public:
  // Opens the ring `key` in `pool` (makes and writes the header, or waits for the
  // maker to have written it, at most timeout_s). Throws InvalidArgument (bad
  // options; the other side gave other slots/slot_bytes, both named),
  // HandoffTimeout (the maker did not finish the header), OutOfMemory.
  // device: the peer route's CUDA side (nullptr: the host slots only; route peer
  // then is NotSupported).
  Handoff(std::shared_ptr<NodePool> pool, std::string key, HandoffOptions options, HandoffCopy copy,
          std::unique_ptr<HandoffDevice> device = nullptr);
  // The same, the pool route's copies started by a mover (the copy engine's
  // async copy_many: cuda/ipc_ring.h's engine_handoff_mover).
  Handoff(std::shared_ptr<NodePool> pool, std::string key, HandoffOptions options,
          std::unique_ptr<HandoffMover> pool_mover, std::unique_ptr<HandoffDevice> device = nullptr);
  ~Handoff();  // close()
  Handoff(const Handoff&) = delete;
  Handoff& operator=(const Handoff&) = delete;

  // The bytes of the stream (plan_handoff's stream_bytes).
  uint64_t send(const void* const* srcs, const uint64_t* sizes, size_t n);
  uint64_t recv(void* const* dsts, const uint64_t* sizes, size_t n);
  // Producer: waits until the consumer drained every slot sent (at most
  // timeout_s in all; kForever: none), then unmaps the device ring.
  void drain(double timeout_s);
  uint64_t pending() const;  // slots sent and not yet drained

  void set_timeout(double timeout_s);  // kForever: none
  double timeout() const { return options_.timeout_s; }
  const HandoffOptions& options() const { return options_; }
  const std::string& key() const { return key_; }
  NodeBlock block() const { return block_; }
  bool created() const { return created_; }
  uint64_t sent() const { return sent_; }          // the producer's position (batches)
  uint64_t received() const { return received_; }  // the consumer's position
  HandoffStats stats() const {
    HandoffStats s = stats_;
    s.sm_batches = device_ ? device_->sm_batches() : 0;
    return s;
  }
  // Why this side's slots went through the pool where the device ring could
  // have been used ("" if none: e.g. the consumer had not published yet).
  const std::string& route_note() const { return refused_why_; }
  bool closed() const { return closed_; }
  // Lets go of the named block (freed when both sides did); withdraws and frees
  // a published device ring, unmaps a mapped one. Idempotent; never throws.
  void close() noexcept;

 private:
  struct CallGuard;
  uint32_t& word(uint64_t index) const;
  uint32_t load(uint64_t index) const;
  void store(uint64_t index, uint32_t value) const;
  void add(uint64_t index) const;
  uint64_t filled_word(uint32_t slot) const { return kHandoffHeaderWords + slot; }
  uint64_t drained_word(uint32_t slot) const { return kHandoffHeaderWords + options_.slots + slot; }
  uint64_t meta_word(uint32_t slot, uint32_t m) const {
    return kHandoffHeaderWords + 2ull * options_.slots + uint64_t{kHandoffMetaWords} * slot + m;
  }
  char* host_slot(uint32_t slot) const { return slot_base_ + uint64_t{slot} * options_.slot_bytes; }
  void open_block();
  void write_or_check_header();
  std::string other_side() const;
  void usable(const char* what) const;
  void join(bool producer);
  void check_broken() const;
  std::string peer_gone(bool producer_is_peer);
  void wait(uint64_t word_index, uint64_t value, bool producer_is_peer, const std::string& what, double timeout_s,
            double told_s);
  // peer route
  HandoffRoute producer_route(uint32_t slot);
  void producer_unmap() noexcept;
  void consumer_publish(void* const* dsts, size_t n);
  void consumer_withdraw() noexcept;
  void note_route(HandoffRoute r);
  void publish_slot(uint32_t slot, uint64_t stream_bytes, size_t items, uint32_t call, HandoffRoute route);
  void land(uint64_t stream_bytes, size_t items, uint32_t call);
  void land_drained();
  HandoffMover& mover(HandoffRoute r) { return r == HandoffRoute::peer ? *device_ : *pool_mover_; }

  std::shared_ptr<NodePool> pool_;
  std::string key_;
  HandoffOptions options_;
  std::unique_ptr<HandoffMover> pool_mover_;  // the pool route's copies
  std::unique_ptr<HandoffDevice> device_;
  NodeBlock block_;
  bool created_ = false;
  bool closed_ = true;
  uint64_t header_bytes_ = 0;
  char* slot_base_ = nullptr;
  uint64_t generation_ = 0;  // fork_generation() at open
  uint64_t sent_ = 0, received_ = 0;
  uint32_t calls_ = 0;
  bool joined_[2] = {false, false};  // producer, consumer
  std::atomic<bool> busy_{false};    // a call is in progress (one at a time)
  HandoffStats stats_;
  // peer route: the consumer's published ring; the producer's mapping
  char* ring_ = nullptr;            // consumer: its device ring (published)
  bool ring_decided_ = false;       // consumer: published or chose not to
  char* mapped_ = nullptr;          // producer: the consumer's ring mapped here
  uint32_t mapped_gen_ = 0;         // producer: its generation (0: none)
  uint32_t refused_gen_ = 0;        // producer: a generation it cannot reach
  std::string refused_why_;         // route_note()
  // The batch whose copy was started and not yet landed (send() overlaps batch
  // b's copy with batch b-1's landing; none between calls): the producer's
  // (flight_) and the consumer's (drain_flight_).
  struct Flight {
    bool live = false;
    uint64_t ticket = 0;
    uint32_t slot = 0;
    HandoffRoute route = HandoffRoute::pool;
  } flight_, drain_flight_;
};

}  // namespace ferry::node
