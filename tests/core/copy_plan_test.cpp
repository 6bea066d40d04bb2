// copy_plan_test.cpp — chunking, pin-in-place planning, strategy choice and the
// machine profile's text form. Table-driven, no memory behind the numbers.
#include <gtest/gtest.h>

#include "copy/plan.h"
#include "copy/strategy.h"
#include "core/error.h"

namespace ferry {
namespace {

constexpr size_t MiB = 1u << 20;

size_t total(const std::vector<Piece>& v) {
  size_t n = 0;
  for (auto& p : v) n += p.bytes;
  return n;
}

TEST(SplitEven, CoversTheRangeExactlyInOrder) {
  struct Case { size_t n, chunk, pieces, last; };
  for (auto c : {Case{1, 8, 1, 1}, Case{8, 8, 1, 8}, Case{9, 8, 2, 1}, Case{0, 8, 0, 0},
                 Case{(1u << 30) + 7, 8 * MiB, 129, 7}}) {
    auto v = split_even(c.n, c.chunk);
    ASSERT_EQ(v.size(), c.pieces) << c.n;
    EXPECT_EQ(total(v), c.n);
    for (size_t i = 1; i < v.size(); ++i) EXPECT_EQ(v[i].offset, v[i - 1].offset + v[i - 1].bytes);
    if (!v.empty()) {
      EXPECT_EQ(v.back().bytes, c.last);
    }
  }
}

TEST(PinPlan, BodyIsBoundaryAlignedAndEverythingIsCovered) {
  struct Case { uintptr_t addr; size_t n; size_t head, body_pieces, tail; };
  const uintptr_t base = 0x7f0000000000;  // 2 MiB aligned
  const Case cases[] = {
      {base, 8 * MiB, 0, 1, 0},                  // aligned both ends
      {base + 4096, 8 * MiB, 2 * MiB - 4096, 1, 4096},
      {base + 1, 3 * MiB, 3 * MiB, 0, 0},        // no whole 2 MiB block inside: all head
      {base + 100, 100, 100, 0, 0},
      {base, 130 * MiB + 5, 0, 3, 5},            // 64 MiB pieces: 64+64+2, 5 bytes of tail
  };
  for (const auto& c : cases) {
    PinPlan p = plan_pin_in_place(c.addr, c.n, 64 * MiB);
    EXPECT_EQ(p.head.offset, 0u);
    EXPECT_EQ(p.head.bytes, c.head) << c.addr - base << "+" << c.n;
    ASSERT_EQ(p.body.size(), c.body_pieces) << c.addr - base << "+" << c.n;
    for (auto& piece : p.body) {
      EXPECT_EQ((c.addr + piece.offset) % (2 * MiB), 0u);
      EXPECT_EQ(piece.bytes % (2 * MiB), 0u);
      EXPECT_LE(piece.bytes, 64 * MiB);
    }
    size_t covered = p.head.bytes + total(p.body) + p.tail.bytes;
    if (!p.body.empty()) {
      EXPECT_EQ(p.tail.offset + p.tail.bytes, c.n);
    }
    EXPECT_EQ(covered, c.n);
    EXPECT_EQ(p.tail.bytes, c.tail);
  }
}

TEST(PinPlan, HybridSplitMovesTheRestToStaging) {
  PinPlan p = plan_pin_in_place(0x200000, 512 * MiB, 64 * MiB);
  ASSERT_EQ(p.body.size(), 8u);
  std::vector<Piece> staged;
  split_hybrid(p, 0.25, staged);
  EXPECT_EQ(p.body.size(), 2u);
  EXPECT_EQ(staged.size(), 6u);
  EXPECT_EQ(total(p.body) + total(staged), 512 * MiB);
  EXPECT_EQ(staged.front().offset, p.body.back().offset + p.body.back().bytes);
  PinPlan q = plan_pin_in_place(0x200000, 512 * MiB, 64 * MiB);
  std::vector<Piece> none;
  split_hybrid(q, 1.0, none);
  EXPECT_TRUE(none.empty());
  split_hybrid(q, 0.0, none);
  EXPECT_TRUE(q.body.empty());
  EXPECT_EQ(none.size(), 8u);
}

TEST(Strategy, Choice) {
  MachineProfile prof = MachineProfile::defaults();
  EXPECT_EQ(choose_strategy(Direction::h2d, 1, HostBacking::pinned, prof), Strategy::direct);
  // Built-in defaults: staging at every size (the eager path beats CUDA's own).
  EXPECT_EQ(choose_strategy(Direction::h2d, 1, HostBacking::small_pages, prof), Strategy::staged);
  EXPECT_EQ(choose_strategy(Direction::h2d, 4096, HostBacking::small_pages, prof), Strategy::staged);
  // A calibrated profile may send small copies to CUDA's path.
  prof.cuda_below_bytes[0] = 4u << 20;
  EXPECT_EQ(choose_strategy(Direction::h2d, 4096, HostBacking::small_pages, prof), Strategy::cuda);
  EXPECT_EQ(choose_strategy(Direction::d2h, 4096, HostBacking::small_pages, prof), Strategy::staged);
  prof.cuda_below_bytes[1] = 2u << 20;
  EXPECT_EQ(choose_strategy(Direction::h2d, 1u << 30, HostBacking::small_pages, prof), Strategy::staged);
  prof.hybrid_pinned_share[1] = 0.4;
  EXPECT_EQ(choose_strategy(Direction::d2h, 1u << 30, HostBacking::thp, prof), Strategy::hybrid);
  EXPECT_EQ(choose_strategy(Direction::h2d, 1u << 30, HostBacking::thp, prof), Strategy::staged);
  EXPECT_EQ(choose_strategy(Direction::d2h, 8u << 20, HostBacking::thp, prof), Strategy::staged);
  EXPECT_EQ(choose_strategy(Direction::d2h, 1u << 20, HostBacking::thp, prof), Strategy::cuda);
  // Overrides win, but pinned memory always goes direct.
  EXPECT_EQ(choose_strategy(Direction::h2d, 4096, HostBacking::thp, prof, Strategy::pin_in_place),
            Strategy::pin_in_place);
  EXPECT_EQ(choose_strategy(Direction::h2d, 4096, HostBacking::pinned, prof, Strategy::staged),
            Strategy::direct);
  EXPECT_EQ(choose_strategy(Direction::h2d, 1u << 30, HostBacking::thp, prof, Strategy::direct),
            Strategy::cuda);
  EXPECT_EQ(choose_strategy(Direction::h2d, 4096, HostBacking::pinned, prof, Strategy::sm), Strategy::sm);
  EXPECT_EQ(choose_strategy(Direction::h2d, 4096, HostBacking::small_pages, prof, Strategy::sm), Strategy::staged);
}

// Every rule of choose_route, the one place a copy's path is decided.
TEST(Strategy, Route) {
  const MachineProfile prof = MachineProfile::defaults();
  auto route = [&](Direction d, size_t n, HostBacking b, CallKind call, size_t batch_mean = 0,
                   Strategy requested = Strategy::automatic, bool d2d = false) {
    CopyFacts f;
    f.dir = d;
    f.bytes = n;
    f.backing = b;
    f.call = call;
    f.batch_pinned_mean_bytes = batch_mean;
    f.device_to_device = d2d;
    return choose_route(f, prof, requested);
  };
  const auto pageable = HostBacking::unknown, pinned = HostBacking::pinned;
  // Staged: eager while the caller may wait for staging, stream-ordered otherwise.
  EXPECT_EQ(route(Direction::h2d, 1u << 20, pageable, CallKind::copy).path, Path::eager);
  EXPECT_EQ(route(Direction::d2h, 1u << 30, pageable, CallKind::copy).path, Path::eager);
  EXPECT_EQ(route(Direction::h2d, prof.eager_async_below_bytes - 1, pageable, CallKind::copy_async).path, Path::eager);
  EXPECT_EQ(route(Direction::h2d, prof.eager_async_below_bytes, pageable, CallKind::copy_async).path, Path::streamed);
  EXPECT_EQ(route(Direction::d2h, 4096, pageable, CallKind::copy_async).path, Path::streamed);
  EXPECT_EQ(route(Direction::h2d, 1u << 30, pageable, CallKind::copy_many_async).path, Path::eager);
  EXPECT_EQ(route(Direction::d2h, 4096, pageable, CallKind::copy_many_async).path, Path::streamed);
  EXPECT_EQ(route(Direction::d2h, 4096, pageable, CallKind::copy_many).path, Path::eager);
  // Pinned and device<->device: one DMA; a batch of small such items: the SM kernel.
  EXPECT_EQ(route(Direction::h2d, 4096, pinned, CallKind::copy_async).path, Path::dma);
  EXPECT_EQ(route(Direction::h2d, 4096, pinned, CallKind::copy_many, 16u << 10).path, Path::sm_kernel);
  EXPECT_EQ(route(Direction::h2d, 4096, pinned, CallKind::copy_many, prof.batch_sm_below_bytes).path, Path::dma);
  EXPECT_EQ(route(Direction::h2d, 4096, pinned, CallKind::copy_many, 16u << 10, Strategy::direct).path, Path::dma);
  EXPECT_EQ(route(Direction::h2d, 4096, HostBacking::unknown, CallKind::copy_many, 16u << 10, Strategy::automatic,
                  true).path, Path::sm_kernel);
  EXPECT_EQ(route(Direction::h2d, 4096, HostBacking::unknown, CallKind::copy, 0, Strategy::sm, true).strategy,
            Strategy::direct);
  // Explicit strategies on pageable memory keep their paths.
  EXPECT_EQ(route(Direction::h2d, 4096, pageable, CallKind::copy_async, 0, Strategy::cuda).path, Path::cuda);
  EXPECT_EQ(route(Direction::h2d, 4096, pageable, CallKind::copy_async, 0, Strategy::pin_in_place).path,
            Path::pin_in_place);
  Route hybrid = route(Direction::d2h, 4096, pageable, CallKind::copy, 0, Strategy::hybrid);
  EXPECT_EQ(hybrid.path, Path::pin_in_place);
  EXPECT_EQ(hybrid.strategy, Strategy::hybrid);
  EXPECT_EQ(hybrid.dir, Direction::d2h);
  // A pinned share of 1 in the profile: auto picks pin-in-place from hybrid_below_bytes.
  MachineProfile pin = prof;
  pin.hybrid_pinned_share[0] = 1.0;
  EXPECT_EQ(choose_strategy(Direction::h2d, pin.hybrid_below_bytes, HostBacking::unknown, pin), Strategy::pin_in_place);
  EXPECT_EQ(choose_strategy(Direction::h2d, pin.hybrid_below_bytes - 1, HostBacking::unknown, pin), Strategy::staged);
}

TEST(Strategy, Names) {
  for (Strategy s : {Strategy::automatic, Strategy::direct, Strategy::staged, Strategy::pin_in_place,
                     Strategy::hybrid, Strategy::cuda, Strategy::sm})
    EXPECT_EQ(parse_strategy(strategy_name(s)), s);
  try {
    parse_strategy("fast");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'fast'"), std::string::npos);
  }
}

TEST(Profile, RoundTripsAndRejectsBadLines) {
  MachineProfile p;
  p.staging_chunk_bytes = 4 * MiB;
  p.hybrid_pinned_share[0] = 0.375;
  p.workers = 12;
  p.batch_sm_below_bytes = 64u << 10;
  p.cuda_below_bytes[1] = 96u << 10;
  p.eager_chunk_bytes = 1 * MiB;
  p.eager_slots = 24;
  p.eager_areas = 3;
  p.eager_async_below_bytes = 32 * MiB;
  MachineProfile q = parse_profile(format_profile(p));
  EXPECT_EQ(q.batch_sm_below_bytes, 64u << 10);
  EXPECT_EQ(q.cuda_below_bytes[0], 0u);
  EXPECT_EQ(q.cuda_below_bytes[1], 96u << 10);
  EXPECT_EQ(q.eager_chunk_bytes, 1 * MiB);
  EXPECT_EQ(q.eager_slots, 24);
  EXPECT_EQ(q.eager_areas, 3);
  EXPECT_EQ(q.eager_async_below_bytes, 32 * MiB);
  // The older key sets both directions.
  MachineProfile old = parse_profile("cuda_below_bytes = 4MiB");
  EXPECT_EQ(old.cuda_below_bytes[0], 4 * MiB);
  EXPECT_EQ(old.cuda_below_bytes[1], 4 * MiB);
  EXPECT_EQ(q.staging_chunk_bytes, 4 * MiB);
  EXPECT_DOUBLE_EQ(q.hybrid_pinned_share[0], 0.375);
  EXPECT_EQ(q.workers, 12);
  EXPECT_EQ(parse_profile("# only a comment\n\n").staging_slots, MachineProfile{}.staging_slots);
  EXPECT_EQ(parse_profile("staging_chunk_bytes = 16MiB").staging_chunk_bytes, 16 * MiB);
  EXPECT_EQ(parse_profile("batch_sm_launch_bytes = 0").batch_sm_launch_bytes, 0u);  // one launch per call
  EXPECT_EQ(parse_profile("batch_sm_launch_bytes = 1MiB").batch_sm_launch_bytes, 1 * MiB);
  EXPECT_EQ(parse_profile(format_profile(MachineProfile{})).batch_sm_launch_bytes,
            MachineProfile{}.batch_sm_launch_bytes);
  for (const char* bad : {"nonsense", "colour = red", "hybrid_pinned_share_h2d = 1.5",
                          "staging_slots = 0", "pin_piece_bytes = 3MiB", "workers = many", "eager_slots = 0",
                          "eager_chunk_bytes = 1000", "eager_areas = 0", "batch_sm_launch_bytes = 100",
                          "batch_sm_launch_bytes = 2GiB"}) {
    EXPECT_THROW(parse_profile(bad), InvalidArgument) << bad;
  }
  try {
    parse_profile("staging_slots = 4\ncolour = red\n");
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ferry
