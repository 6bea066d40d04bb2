// node_file_test.cpp — the node load's protocol (node/node_file.h): ranks in
// separate processes (this binary exec'd again, NodeFileRank.DISABLED_Run)
// read their parts of a random file of odd size into one named block; each
// checks every piece, byte for byte, as it comes in; and the failures: a rank
// that never comes (a timeout that says how many arrived), ranks that
// disagree or repeat, a maker that never sets the block up, files that are
// not regular.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "exec_peer.h"
#include "node/node_file.h"
#include "node/node_pool.h"
#include "node_member.h"

namespace ferry::node {
namespace {

using testing::ExecPeer;

constexpr const char* kPeerEnv = "FERRYTEST_NODE_FILE";

uint64_t test_seed() {
  static const uint64_t seed = [] {
    const char* replay = std::getenv("FERRYTEST_SEED");  // replays a printed seed
    const uint64_t s = replay ? std::strtoull(replay, nullptr, 10) : std::random_device{}() & 0xFFFF;
    std::printf("node_file_test seed %llu\n", static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

std::shared_ptr<NodePool> open_pool(const std::string& name, uint64_t capacity, const char* label) {
  NodePoolOptions o;
  o.capacity = capacity;
  o.label = label;
  o.huge_pages = HugePolicy::off;
  return NodePool::open(name, o);
}

// A file of `size` random bytes from `seed`, removed with the object.
struct RandomFile {
  std::string path;
  RandomFile(uint64_t size, uint64_t seed) : path(temp_root() + "/" + unique_name("nodefile")) {
    std::vector<char> bytes(size);
    fill(bytes.data(), size, seed);
    std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(size));
  }
  ~RandomFile() { ::unlink(path.c_str()); }
};

std::string peer_args(const std::string& role, const std::string& pool, uint64_t capacity, const std::string& path,
                      uint64_t seed, uint32_t rank, uint32_t ranks, double timeout_s) {
  std::ostringstream s;
  s << role << " " << pool << " " << capacity << " " << path << " " << seed << " " << rank << " " << ranks << " "
    << timeout_s;
  return s.str();
}

// One rank's whole load: every piece checked as it comes in, then finish.
// "" when all went as expected, else what did not.
std::string load_as_rank(const std::shared_ptr<NodePool>& pool, const std::string& path, uint64_t seed,
                         uint32_t rank, uint32_t ranks, double timeout_s) {
  NodeFileRead f(path, path);
  std::vector<char> want(f.size());
  fill(want.data(), want.size(), seed);
  f.join(pool, "load:" + path, rank, ranks, timeout_s, 3);
  const std::vector<uint64_t> parts = node_file_parts(f.size(), ranks);
  if (f.stats().part_begin != parts[rank] || f.stats().part_end != parts[rank + 1]) return "wrong part";
  for (uint32_t p = 0; p < f.piece_count(); ++p) {
    f.wait_piece(p);
    const uint64_t lo = p * f.piece_bytes(), hi = std::min(f.size(), lo + f.piece_bytes());
    if (std::memcmp(f.data() + lo, want.data() + lo, hi - lo) != 0) return "piece " + std::to_string(p) + " differs";
  }
  f.finish();
  if (f.stats().read_seconds < 0 || f.stats().wait_seconds < 0) return "stats not filled in";
  if (std::memcmp(f.data(), want.data(), want.size()) != 0) return "the block differs from the file";
  return "";
}

}  // namespace

// The other ranks. Roles: "rank" loads and checks everything; "refused-ranks"
// and "refused-rank" expect join's InvalidArgument for disagreeing ranks or a
// rank taken.
TEST(NodeFileRank, DISABLED_Run) {
  const char* env = std::getenv(kPeerEnv);
  if (!env) GTEST_SKIP() << "run by the node file tests only";
  std::istringstream in(env);
  std::string role, name, path;
  uint64_t capacity, seed;
  uint32_t rank, ranks;
  double timeout_s;
  in >> role >> name >> capacity >> path >> seed >> rank >> ranks >> timeout_s;
  auto pool = open_pool(name, capacity, role.c_str());
  if (role == "rank") {
    ASSERT_EQ(load_as_rank(pool, path, seed, rank, ranks, timeout_s), "");
    return;
  }
  NodeFileRead f(path, path);
  try {
    f.join(pool, "load:" + path, rank, ranks, timeout_s, 2);
    FAIL() << role << ": join was not refused";
  } catch (const InvalidArgument& e) {
    const std::string want = role == "refused-ranks" ? "every rank must pass the same ranks" : "is taken by another";
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

class NodeFileRanks : public ::testing::TestWithParam<uint32_t> {};

TEST_P(NodeFileRanks, EveryRankSeesTheWholeFileBitExact) {
  const uint32_t ranks = GetParam();
  const uint64_t seed = test_seed() * 31 + ranks;
  std::mt19937_64 g(seed);
  const uint64_t size = 1 + g() % (9 << 20);  // odd sizes, small parts included
  RandomFile file(size, seed);
  const std::string name = unique_name("nf");
  const uint64_t capacity = 16 << 20;
  auto pool = open_pool(name, capacity, "rank 0");
  {  // poison: the file's block reuses this memory (pools do not clear what they recycle)
    const NodeBlock b = pool->allocate(capacity);
    std::memset(pool->data() + b.offset, 0xEE, b.bytes);
    pool->release(b.offset);
  }
  std::vector<std::unique_ptr<ExecPeer>> peers;
  for (uint32_t r = 1; r < ranks; ++r)
    peers.push_back(std::make_unique<ExecPeer>("NodeFileRank.DISABLED_Run", kPeerEnv,
                                               peer_args("rank", name, capacity, file.path, seed, r, ranks, 30)));
  EXPECT_EQ(load_as_rank(pool, file.path, seed, 0, ranks, 30), "") << "seed " << seed << " size " << size;
  for (auto& p : peers) EXPECT_EQ(p->finish(), 0) << "seed " << seed << " size " << size;
}

INSTANTIATE_TEST_SUITE_P(Ranks, NodeFileRanks, ::testing::Values(1u, 2u, 3u, 5u));

TEST(NodeFile, PiecesOfALargeFileComeInOrderWhoeverReadThem) {
  const uint64_t seed = test_seed() * 17;
  const uint64_t size = 2 * kNodeFileMinPiece + 12345;  // three pieces, the last one short
  RandomFile file(size, seed);
  const std::string name = unique_name("nf");
  const uint64_t capacity = size + (8 << 20);
  auto pool = open_pool(name, capacity, "rank 0");
  ExecPeer peer("NodeFileRank.DISABLED_Run", kPeerEnv, peer_args("rank", name, capacity, file.path, seed, 1, 2, 60));
  EXPECT_EQ(load_as_rank(pool, file.path, seed, 0, 2, 60), "") << "seed " << seed;
  EXPECT_EQ(peer.finish(), 0);
}

TEST(NodeFile, ARankThatNeverComesTimesOutSayingHowManyArrived) {
  RandomFile file(3 << 20, test_seed());
  auto pool = open_pool(unique_name("nf"), 8 << 20, "rank 0");
  NodeFileRead f(file.path, file.path);
  f.join(pool, "load:x", 0, 2, 0.5, 2);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    f.finish();
    FAIL() << "finish() returned with one of two ranks";
  } catch (const NodeLoadTimeout& e) {
    EXPECT_NE(std::string(e.what()).find("1 of 2 ranks had read their part after 0.5 s"), std::string::npos)
        << e.what();
  }
  EXPECT_LT(seconds_since(t0), 10.0);
}

TEST(NodeFile, RanksThatDisagreeOrRepeatAreRefused) {
  RandomFile file(1 << 20, test_seed());
  const std::string name = unique_name("nf");
  auto pool = open_pool(name, 8 << 20, "rank 0");
  NodeFileRead f(file.path, file.path);
  f.join(pool, "load:" + file.path, 0, 2, 30, 2);
  ExecPeer disagree("NodeFileRank.DISABLED_Run", kPeerEnv,
                    peer_args("refused-ranks", name, 8 << 20, file.path, 0, 1, 3, 30));
  EXPECT_EQ(disagree.finish(), 0);
  ExecPeer repeat("NodeFileRank.DISABLED_Run", kPeerEnv,
                  peer_args("refused-rank", name, 8 << 20, file.path, 0, 0, 2, 30));
  EXPECT_EQ(repeat.finish(), 0);
}

TEST(NodeFile, AMakerThatNeverSetsTheBlockUpTimesOut) {
  RandomFile file(1 << 20, test_seed());
  auto pool = open_pool(unique_name("nf"), 8 << 20, "rank 0");
  bool created = false;
  pool->allocate_named("load:y", kNodeFileHeaderBytes + (1 << 20), &created);  // made, RANKS never written
  ASSERT_TRUE(created);
  NodeFileRead f(file.path, file.path);
  EXPECT_THROW(
      {
        try {
          f.join(pool, "load:y", 0, 2, 0.3, 2);
        } catch (const NodeLoadTimeout& e) {
          EXPECT_NE(std::string(e.what()).find("did not set it up within 0.3 s"), std::string::npos) << e.what();
          throw;
        }
      },
      NodeLoadTimeout);
}

TEST(NodeFile, OnlyARegularFileIsOpened) {
  const std::string dir = temp_root() + "/" + unique_name("nfdir");
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& path : {dir, fifo, std::string("/dev/zero")}) {
    try {
      NodeFileRead f(path, path);
      ADD_FAILURE() << path << " was opened";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(path + ": not a regular file"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(NodeFileRead(dir + "/absent", "absent"), OsError);
  ::unlink(fifo.c_str());
  ::rmdir(dir.c_str());
}

TEST(NodeFile, PartsCoverTheFileAlignedAndPiecesFitTheirWords) {
  std::mt19937_64 g(test_seed());
  for (int i = 0; i < 2000; ++i) {
    const uint64_t size = g() % 3 == 0 ? g() % (64 << 20) : g() % ((uint64_t{1} << 41) - (uint64_t{1} << 30));
    const uint32_t ranks = 1 + g() % kNodeFileMaxRanks;
    const std::vector<uint64_t> b = node_file_parts(size, ranks);
    ASSERT_EQ(b.size(), ranks + 1u);
    ASSERT_EQ(b.front(), 0u);
    ASSERT_EQ(b.back(), size);
    const uint64_t align = size >= uint64_t{ranks} * (8 << 20) ? (2 << 20) : 4096;
    for (uint32_t r = 0; r < ranks; ++r) {
      ASSERT_LE(b[r], b[r + 1]) << size << " " << ranks;
      ASSERT_EQ(b[r] % align, 0u) << size << " " << ranks;
      // within one alignment of the exact share
      const long double exact = static_cast<long double>(size) * r / ranks;
      ASSERT_LE(exact - static_cast<long double>(b[r]), static_cast<long double>(align)) << size << " " << ranks;
    }
    const uint64_t step = node_file_piece_bytes(size);
    ASSERT_GE(step, kNodeFileMinPiece);
    ASSERT_EQ(step % (2 << 20), 0u);
    ASSERT_LE((size + step - 1) / step, kNodeFileMaxPieces);
    ASSERT_LT(step, uint64_t{1} << 32);  // below 2 TiB - 1 GiB a piece's bytes fit its 32-bit word
  }
}

}  // namespace ferry::node
