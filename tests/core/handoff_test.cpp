// handoff_test.cpp — the node handoff's protocol (node/handoff.h) between two
// real processes on the CPU: real NodePool memory, memcpy for the copies, and
// for the peer route a device ring that lives in an unnamed block of the pool
// (HostRing below: the same publish/map/withdraw words the CUDA ring uses, its
// "device" memory host memory). Random data from a printed seed, odd sizes,
// items larger than a slot, poisoned destinations with guard bytes; a consumer
// that dies or stalls gives a clear error, never a hang.
//
// The other process is this binary exec'd again (node_member.h's reason: no
// fork of a threaded process) running HandoffPeer.DISABLED_Run with its role in
// FERRYTEST_HANDOFF; it exits 0 when its side went as expected.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "node/handoff.h"
#include "node/node_pool.h"
#include "node_member.h"

namespace ferry::node {
namespace {

// The peer route's protocol without a GPU: the "device ring" is an unnamed
// block of the pool, exported by its offset (the handle's first 8 bytes).
class HostRing : public HandoffDevice {
 public:
  explicit HostRing(std::shared_ptr<NodePool> pool) : pool_(std::move(pool)) {}
  bool on_device(void* const*, size_t) override { return true; }
  char* publish(uint64_t bytes, HandoffRingExport* out) override {
    block_ = pool_->allocate(bytes);
    std::memcpy(out->handle, &block_.offset, 8);
    std::snprintf(out->bus_id, sizeof out->bus_id, "host");
    out->bytes = block_.bytes;
    return pool_->data() + block_.offset;
  }
  void free_ring() noexcept override {
    freed = true;
    try {
      pool_->release(block_.offset);
    } catch (...) {
    }
  }
  char* map(const HandoffRingExport& ring, std::string* why) override {
    if (refuse) {
      *why = "this test's ring refuses";
      return nullptr;
    }
    uint64_t offset;
    std::memcpy(&offset, ring.handle, 8);
    ++maps;
    return pool_->data() + offset;
  }
  void unmap() noexcept override { ++unmaps; }
  void copy(void* const* d, const void* const* s, const size_t* n, size_t k) override { host_copy_many(d, s, n, k); }
  // As the CUDA ring does: the protocol overlaps batches (publishes batch b-1
  // after b started), which these tests then exercise.
  bool overlaps() const override { return true; }

  bool refuse = false, freed = false;
  int maps = 0, unmaps = 0;

 private:
  std::shared_ptr<NodePool> pool_;
  NodeBlock block_;
};

uint64_t test_seed() {
  static const uint64_t seed = [] {
    // FERRYTEST_SEED replays a printed seed.
    const char* replay = std::getenv("FERRYTEST_SEED");
    const uint64_t s = replay ? std::strtoull(replay, nullptr, 10) : std::random_device{}() & 0xFFFF;
    std::printf("handoff_test seed %llu\n", static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

// Round r's item sizes: odd sizes, zeros, and now and then one larger than a slot.
std::vector<uint64_t> round_sizes(uint64_t seed, int r) {
  std::mt19937_64 g(seed * 1000 + r);
  std::vector<uint64_t> sizes(1 + g() % 39);
  for (auto& n : sizes) n = g() % 9000;
  if (r % 7 == 3) sizes[g() % sizes.size()] = 50'001;
  return sizes;
}
uint64_t item_seed(uint64_t seed, int r, size_t i) { return seed * 7919 + r * 131 + i; }

std::shared_ptr<NodePool> open_pool(const std::string& name, const char* label) {
  NodePoolOptions o;
  o.capacity = 8 << 20;
  o.label = label;
  return NodePool::open(name, o);
}

HandoffOptions options(uint32_t slots, uint64_t slot_bytes, double timeout = 30, HandoffRoute route = HandoffRoute::automatic) {
  HandoffOptions o;
  o.slots = slots;
  o.slot_bytes = slot_bytes;
  o.timeout_s = timeout;
  o.poll_s = 0.05;
  o.route = route;
  o.peer_min_mean_bytes = 0;  // these tests follow the protocol; the policy has its own test
  return o;
}

void send_round(Handoff& h, uint64_t seed, int r) {
  const auto sizes = round_sizes(seed, r);
  std::vector<std::vector<char>> items(sizes.size());
  std::vector<const void*> srcs;
  for (size_t i = 0; i < sizes.size(); ++i) {
    items[i].resize(sizes[i] + 1);
    fill(items[i].data(), sizes[i], item_seed(seed, r, i));
    srcs.push_back(items[i].data());
  }
  h.send(srcs.data(), sizes.data(), sizes.size());
}

// Receives round r into poisoned buffers; "" or what is wrong.
std::string recv_round(Handoff& h, uint64_t seed, int r) {
  const auto sizes = round_sizes(seed, r);
  std::vector<std::vector<char>> out(sizes.size());
  std::vector<void*> dsts;
  for (size_t i = 0; i < sizes.size(); ++i) {
    out[i].assign(sizes[i] + 3, static_cast<char>(0xEE));  // 3 guard bytes
    dsts.push_back(out[i].data());
  }
  const uint64_t got = h.recv(dsts.data(), sizes.data(), sizes.size());
  if (got != plan_handoff(sizes, h.options().slot_bytes).stream_bytes) return "round " + std::to_string(r) + ": bytes";
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (!holds(out[i].data(), sizes[i], item_seed(seed, r, i)))
      return "round " + std::to_string(r) + " item " + std::to_string(i) + " (" + std::to_string(sizes[i]) +
             " bytes) differs";
    for (int g = 0; g < 3; ++g)
      if (out[i][sizes[i] + g] != static_cast<char>(0xEE))
        return "round " + std::to_string(r) + " item " + std::to_string(i) + ": bytes past it written";
  }
  return "";
}

// The other process: this binary, running HandoffPeer.DISABLED_Run with `args`
// (exec_peer.h; finish() gives its exit code, -1 when killed after its timeout).
class Peer : public ferry::testing::ExecPeer {
 public:
  explicit Peer(const std::string& args) : ExecPeer("HandoffPeer.DISABLED_Run", "FERRYTEST_HANDOFF", args) {}
};

// producer-policy's peer_min_mean_bytes: round_sizes' means fall on both sides of it.
constexpr uint64_t kPolicyMeanBytes = 4500;

std::string args_of(const std::string& role, const std::string& name, uint32_t slots, uint64_t slot_bytes, int rounds,
                    uint64_t seed) {
  return role + " " + name + " " + std::to_string(slots) + " " + std::to_string(slot_bytes) + " " +
         std::to_string(rounds) + " " + std::to_string(seed);
}

// A signal word the tests and their peers share: the block "go" of the pool.
void signal_go(NodePool& pool) {
  const NodeBlock b = pool.allocate_named("go", 4096);
  pool.add(b.offset, 1);
}
bool wait_go(NodePool& pool, double timeout_s) {
  const NodeBlock b = pool.allocate_named("go", 4096);
  return pool.wait_at_least(b.offset, 1, timeout_s);
}

}  // namespace

// The other process's side. Roles:
//   producer         sends `rounds` rounds, drains, closes
//   producer-peer    the same with a HostRing device: 3 rounds, then waits for "go", then the rest
//   producer-ring    the same with a HostRing device, no wait
//   producer-policy  producer-ring with peer_min_mean_bytes = kPolicyMeanBytes
//   consumer-exit    receives `rounds` rounds, then _exit(0) without closing anything
//   consumer-stall   receives `rounds` rounds, then sleeps
TEST(HandoffPeer, DISABLED_Run) {
  const char* env = std::getenv("FERRYTEST_HANDOFF");
  if (!env) GTEST_SKIP() << "run by the handoff tests only";
  std::istringstream in(env);
  std::string role, name;
  uint32_t slots;
  uint64_t slot_bytes, seed;
  int rounds;
  in >> role >> name >> slots >> slot_bytes >> rounds >> seed;
  auto pool = open_pool(name, role.c_str());
  if (role == "producer" || role == "producer-peer" || role == "producer-ring" || role == "producer-policy") {
    const bool peer = role != "producer";
    const bool hold = role == "producer-peer";
    auto ring = peer ? std::make_unique<HostRing>(pool) : nullptr;
    HostRing* r = ring.get();
    HandoffOptions o = options(slots, slot_bytes);
    if (role == "producer-policy") o.peer_min_mean_bytes = kPolicyMeanBytes;
    Handoff h(pool, "kv", o, host_copy_many, std::move(ring));
    for (int i = 0; i < rounds; ++i) {
      if (hold && i == 3) {
        ASSERT_TRUE(wait_go(*pool, 60));
      }
      send_round(h, seed, i);
    }
    h.drain(30);
    ASSERT_EQ(h.pending(), 0u);
    if (peer && !hold) {
      EXPECT_EQ(r->maps, 1);
      EXPECT_GT(h.stats().peer_slots, 0u);
    }
    if (hold) {
      EXPECT_EQ(h.stats().pool_slots, 3u);  // before the consumer published its ring
      EXPECT_EQ(h.stats().peer_slots, static_cast<uint64_t>(rounds - 3));
      EXPECT_EQ(r->maps, 1);  // mapped once
      EXPECT_EQ(r->unmaps, 1);  // by drain
    }
    h.close();
    return;
  }
  Handoff h(pool, "kv", options(slots, slot_bytes), host_copy_many);
  for (int i = 0; i < rounds; ++i) ASSERT_EQ(recv_round(h, seed, i), "");
  if (role == "consumer-exit") ::_exit(0);
  std::this_thread::sleep_for(std::chrono::seconds(600));
}

class HandoffProcesses : public ::testing::TestWithParam<uint32_t> {};

TEST_P(HandoffProcesses, BlocksCrossBitExactOverManyRounds) {
  const std::string name = unique_name("ho");
  const uint64_t seed = test_seed();
  const uint32_t slots = GetParam();
  const int rounds = 80;
  auto pool = open_pool(name, "consumer (test)");
  Handoff h(pool, "kv", options(slots, 10'000), host_copy_many);
  ASSERT_EQ(h.options().slot_bytes, 12288u);  // rounded up to 4 KiB
  Peer producer(args_of("producer", name, slots, 10'000, rounds, seed));
  for (int r = 0; r < rounds; ++r) ASSERT_EQ(recv_round(h, seed, r), "") << "seed " << seed;
  EXPECT_EQ(producer.finish(), 0);
  EXPECT_EQ(h.pending(), 0u);
  EXPECT_EQ(h.stats().pool_slots, h.stats().received);
  EXPECT_EQ(h.stats().peer_slots, 0u);
}
INSTANTIATE_TEST_SUITE_P(Slots, HandoffProcesses, ::testing::Values(1u, 3u));

TEST(Handoff, AMixedRunReadsEachSlotFromWhereItWentPoolFirstThenTheDeviceRing) {
  const std::string name = unique_name("ho-mixed");
  const uint64_t seed = test_seed();
  const int rounds = 40;
  auto pool = open_pool(name, "consumer (test)");
  auto ring = std::make_unique<HostRing>(pool);
  HostRing* r = ring.get();
  Handoff h(pool, "kv", options(4, 512 << 10), host_copy_many, std::move(ring));  // a round fits one slot
  Peer producer(args_of("producer-peer", name, 4, 512 << 10, rounds, seed));
  // the producer fills three slots before this consumer joins: they go through the pool
  const auto t0 = std::chrono::steady_clock::now();
  while (h.pending() < 3 && seconds_since(t0) < 60) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(h.pending(), 3u);
  ASSERT_EQ(recv_round(h, seed, 0), "");  // publishes the ring, reads slot 0 from the pool
  signal_go(*pool);
  for (int i = 1; i < rounds; ++i) ASSERT_EQ(recv_round(h, seed, i), "") << "seed " << seed;
  EXPECT_EQ(h.stats().pool_slots, 3u);
  EXPECT_EQ(h.stats().peer_slots, static_cast<uint64_t>(rounds - 3));
  EXPECT_EQ(h.stats().last_peer_slots, 1u);
  EXPECT_EQ(producer.finish(), 0);
  h.close();
  EXPECT_TRUE(r->freed);  // the producer unmapped (drain) and left: the ring was freed
}

// route auto: a send whose blocks average below peer_min_mean_bytes goes through
// the pool although the ring is published, a larger one through the ring; each
// slot is read from where it went. (Rounds sent before the first recv published
// the ring took the pool whatever their sizes: the first `slots` are not judged.)
TEST(Handoff, UnderAutoSmallBlocksTakeThePoolAndLargeOnesTheRing) {
  const std::string name = unique_name("ho-policy");
  const uint64_t seed = test_seed();
  const uint32_t slots = 2;
  const int rounds = 40;
  auto pool = open_pool(name, "consumer (test)");
  Handoff h(pool, "kv", options(slots, 512 << 10), host_copy_many, std::make_unique<HostRing>(pool));
  Peer producer(args_of("producer-policy", name, slots, 512 << 10, rounds, seed));  // a round fits one slot
  int small = 0, large = 0;
  for (int r = 0; r < rounds; ++r) {
    ASSERT_EQ(recv_round(h, seed, r), "") << "seed " << seed;
    const auto sizes = round_sizes(seed, r);
    uint64_t total = 0;
    for (uint64_t n : sizes) total += n;
    if (r < static_cast<int>(slots)) continue;
    const bool below = total / sizes.size() < kPolicyMeanBytes;
    (below ? small : large) += 1;
    EXPECT_EQ(h.stats().last_peer_slots, below ? 0u : 1u) << "round " << r << ", mean " << total / sizes.size()
                                                          << ", seed " << seed;
    EXPECT_EQ(h.stats().last_pool_slots, below ? 1u : 0u) << "round " << r << ", seed " << seed;
  }
  EXPECT_EQ(producer.finish(), 0);
  EXPECT_GT(small, 0) << "seed " << seed;  // both sides of the threshold were seen
  EXPECT_GT(large, 0) << "seed " << seed;
}

// The device ring with 1 and 2 slots: a send lands its batch in flight before a
// wait that needs it (one slot), and rounds larger than the ring.
class HandoffRingSlots : public ::testing::TestWithParam<uint32_t> {};

TEST_P(HandoffRingSlots, ThroughTheRingBitExactWhateverTheSlots) {
  const std::string name = unique_name("ho-ring");
  const uint64_t seed = test_seed();
  const uint32_t slots = GetParam();
  const int rounds = 60;
  auto pool = open_pool(name, "consumer (test)");
  auto ring = std::make_unique<HostRing>(pool);
  Handoff h(pool, "kv", options(slots, 10'000), host_copy_many, std::move(ring));
  Peer producer(args_of("producer-ring", name, slots, 10'000, rounds, seed));
  for (int r = 0; r < rounds; ++r) ASSERT_EQ(recv_round(h, seed, r), "") << "seed " << seed;
  EXPECT_EQ(producer.finish(), 0);
  EXPECT_GT(h.stats().peer_slots, h.stats().pool_slots);  // at most the slots sent before the first recv took the pool
  EXPECT_LE(h.stats().pool_slots, slots);
  EXPECT_EQ(h.pending(), 0u);
}
INSTANTIATE_TEST_SUITE_P(Slots, HandoffRingSlots, ::testing::Values(1u, 2u, 5u));

TEST(Handoff, AConsumerThatDiesGivesTheProducerPeerGoneNotAHang) {
  const std::string name = unique_name("ho-dies");
  auto pool = open_pool(name, "producer (test)");
  Handoff h(pool, "kv", options(2, 8192, 60), host_copy_many);
  Peer consumer(args_of("consumer-exit", name, 2, 8192, 3, 5));
  const auto t0 = std::chrono::steady_clock::now();
  try {
    for (int r = 0; r < 1000; ++r) send_round(h, 5, r);
    FAIL() << "the sends did not notice the consumer leaving";
  } catch (const HandoffPeerGone& e) {
    EXPECT_NE(std::string(e.what()).find("the consumer (pid " + std::to_string(consumer.pid()) + ") left the pool"),
              std::string::npos) << e.what();
    EXPECT_EQ(e.status(), FERRY_ERROR_PEER_GONE);
  }
  EXPECT_LT(seconds_since(t0), 30);  // noticed by watching, well before timeout 60
  EXPECT_EQ(consumer.finish(), 0);
  try {  // broken for good: a later send says so at once
    send_round(h, 5, 0);
    FAIL() << "a broken handoff sent";
  } catch (const HandoffError& e) {
    EXPECT_NE(std::string(e.what()).find("is broken: the producer gave up"), std::string::npos) << e.what();
    EXPECT_EQ(e.status(), FERRY_ERROR_BROKEN);
  }
}

TEST(Handoff, ALiveConsumerThatStallsTimesOutNamingWhoHoldsWhat) {
  const std::string name = unique_name("ho-stall");
  auto pool = open_pool(name, "producer (test)");
  Handoff h(pool, "kv", options(1, 4096, 60), host_copy_many);
  Peer consumer(args_of("consumer-stall", name, 1, 4096, 1, 9));
  send_round(h, 9, 0);  // waits for the consumer to start
  h.set_timeout(1.0);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    for (int r = 1; r < 100; ++r) send_round(h, 9, r);
    FAIL() << "no timeout";
  } catch (const HandoffTimeout& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("the consumer did not drain slot 0"), std::string::npos) << m;
    EXPECT_NE(m.find("within 1 s (it is still in the pool: "), std::string::npos) << m;
    EXPECT_NE(m.find("consumer-stall"), std::string::npos) << m;  // its label, from the holders
    EXPECT_EQ(e.status(), FERRY_ERROR_TIMEOUT);
  }
  const double took = seconds_since(t0);
  EXPECT_GT(took, 0.9);
  EXPECT_LT(took, 20);
}

TEST(Handoff, RecvWithOtherSizesThanSendIsRefusedAndConsumesNothing) {
  auto pool = open_pool(unique_name("ho-sizes"), "one");
  Handoff h(pool, "k", options(2, 4096, 5), host_copy_many);
  std::vector<char> src(3000), out(3000, 0);
  fill(src.data(), src.size(), 1);
  const void* s = src.data();
  void* d = out.data();
  uint64_t n = 3000, wrong = 2999;
  EXPECT_EQ(h.send(&s, &n, 1), 3000u);
  try {
    h.recv(&d, &wrong, 1);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("recv of 1 items (2999 bytes in the stream) but the producer's send had 1 "
                                         "items (3000 bytes)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(h.recv(&d, &n, 1), 3000u);  // the slot is still there
  EXPECT_EQ(src, out);
  EXPECT_EQ(h.pending(), 0u);
}

TEST(Handoff, BothSidesMustGiveTheSameSlotsAndSlotBytesAndTheMessageNamesBoth) {
  auto pool = open_pool(unique_name("ho-mismatch"), "one");
  Handoff h(pool, "req-7", options(3, 64 << 10), host_copy_many);
  for (auto [slots, bytes] : {std::pair<uint32_t, uint64_t>{4, 64 << 10}, {3, 128 << 10}}) {
    try {
      Handoff other(pool, "req-7", options(slots, bytes), host_copy_many);
      FAIL() << "opened";
    } catch (const InvalidArgument& e) {
      const std::string want = "Handoff 'req-7': the other side opened it with slots=3, slot_bytes=65536 (64 KiB); "
                               "this side asked slots=" + std::to_string(slots) + ", slot_bytes=" +
                               std::to_string(bytes) + " (" + std::to_string(bytes >> 10) + " KiB): give both";
      EXPECT_EQ(std::string(e.what()).substr(0, want.size()), want) << e.what();
    }
  }
  const NodeBlock other = pool->allocate_named("plain", 4096);
  try {
    Handoff h2(pool, "plain", options(2, 4096), host_copy_many);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("a block of 65536 bytes (64 KiB; its header is not a handoff's"),
              std::string::npos) << e.what();
  }
  pool->release(other.offset);
}

TEST(Handoff, BadOptionsAreRefusedQuoted) {
  auto pool = open_pool(unique_name("ho-bad"), "one");
  auto refused = [&](HandoffOptions o, const char* what) {
    try {
      Handoff h(pool, "k", o, host_copy_many);
      ADD_FAILURE() << what << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refused(options(0, 4096), "slots=0");
  refused(options(kHandoffMaxSlots + 1, 4096), "slots=4097");
  refused(options(2, 0), "slot_bytes=0");
  refused(options(2, 4096, -1), "timeout=-1");
  refused(options(2, 4096, std::nan("")), "timeout=nan");
  HandoffOptions o = options(2, 4096);
  o.poll_s = 0;
  refused(o, "poll=0");
  o.poll_s = INFINITY;
  refused(o, "poll=inf");
  EXPECT_THROW(Handoff(pool, "k", options(2, 4096, 1, HandoffRoute::peer), host_copy_many), NotSupported);
  EXPECT_THROW(parse_handoff_route("fast"), InvalidArgument);
  EXPECT_EQ(parse_handoff_route("peer"), HandoffRoute::peer);
}

TEST(Handoff, ARingThatTheProducerCannotReachSendsThroughThePool) {
  auto pool = open_pool(unique_name("ho-refuse"), "one");
  auto ring = std::make_unique<HostRing>(pool);
  ring->refuse = true;
  Handoff h(pool, "k", options(2, 4096), host_copy_many, std::move(ring));
  std::vector<char> src(6000), out(6000 + 3, static_cast<char>(0xEE));
  fill(src.data(), 6000, 3);
  const void* s = src.data();
  void* d = out.data();
  uint64_t n = 6000;
  // one object on both sides: the recv publishes first (a 2-slot item), then the send cannot map it
  EXPECT_EQ(h.send(&s, &n, 1), 6000u);  // before any publish: the pool
  EXPECT_EQ(h.recv(&d, &n, 1), 6000u);  // publishes
  EXPECT_EQ(h.send(&s, &n, 1), 6000u);  // the ring is refused: the pool
  EXPECT_EQ(h.recv(&d, &n, 1), 6000u);
  EXPECT_TRUE(holds(out.data(), 6000, 3));
  EXPECT_EQ(out[6000], static_cast<char>(0xEE));
  EXPECT_EQ(h.stats().peer_slots, 0u);
  EXPECT_EQ(h.stats().last_pool_slots, 2u);
}

TEST(HandoffPlan, CoversEveryByteOnceWithinSlots) {
  std::mt19937_64 g(test_seed());
  for (int t = 0; t < 300; ++t) {
    const uint64_t slot = (1 + g() % 19) * 4096;
    std::vector<uint64_t> sizes(1 + g() % 50);
    for (auto& n : sizes) n = g() % 5 == 0 ? 0 : g() % (3 * slot);
    const HandoffPlan p = plan_handoff(sizes, slot);
    std::vector<uint64_t> covered(sizes.size(), 0);
    std::vector<uint8_t> seen(p.stream_bytes + 1, 0);
    uint64_t last_item_end = 0;
    for (size_t c = 0; c < p.chunk_count(); ++c) {
      for (size_t i = p.chunks[c]; i < p.chunks[c + 1]; ++i) {
        const HandoffPiece& x = p.pieces[i];
        ASSERT_GT(x.bytes, 0u);
        ASSERT_LE(x.slot_offset + x.bytes, slot);
        ASSERT_EQ(x.item_offset, covered[x.item]);  // in order within an item
        covered[x.item] += x.bytes;
        const uint64_t at = c * slot + x.slot_offset;
        if (x.item_offset == 0) {
          ASSERT_EQ(at % kHandoffAlign, 0u);  // items start at 256-byte boundaries
        }
        for (uint64_t b = at; b < at + x.bytes; ++b) ASSERT_EQ(seen[b]++, 0) << "byte " << b << " twice";
        last_item_end = at + x.bytes;
      }
    }
    EXPECT_EQ(covered, sizes);
    EXPECT_EQ(last_item_end, p.stream_bytes);
  }
  EXPECT_EQ(plan_handoff(std::vector<uint64_t>{0, 0}, 4096).chunk_count(), 0u);
  const HandoffPlan one = plan_handoff(std::vector<uint64_t>{10, 0, 4096}, 4096);  // 10 B, then 4 KiB at 256
  ASSERT_EQ(one.chunk_count(), 2u);
  EXPECT_EQ(one.stream_bytes, 256u + 4096u);
  EXPECT_EQ(one.pieces[1].slot_offset, 256u);
  EXPECT_EQ(one.pieces[1].bytes, 4096u - 256u);
  EXPECT_EQ(one.pieces[2].slot_offset, 0u);
  EXPECT_EQ(one.pieces[2].item_offset, 4096u - 256u);
}

}  // namespace ferry::node
