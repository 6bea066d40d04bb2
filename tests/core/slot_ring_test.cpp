// slot_ring_test.cpp — the slot ring's states and order: oldest first, a slot
// in flight comes back with landing_pending, stop wakes every taker, and many
// threads never fill one slot at once.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/slot_ring.h"

namespace ferry {
namespace {

TEST(SlotRing, SlotsComeOldestFirstWithTheirStates) {
  SlotRing ring(3);
  for (size_t s = 0; s < 3; ++s) EXPECT_EQ(ring.state(s), SlotState::free);
  auto a = ring.take(), b = ring.take();
  EXPECT_EQ(a.slot, 0u);
  EXPECT_EQ(b.slot, 1u);
  EXPECT_FALSE(a.landing_pending);
  EXPECT_EQ(ring.state(0), SlotState::filling);
  ring.hand_off(0);  // in flight, last in line
  EXPECT_EQ(ring.state(0), SlotState::in_flight);
  ring.give_back(1);  // nothing handed off: free
  EXPECT_EQ(ring.take().slot, 2u);
  const auto again = ring.take();
  EXPECT_EQ(again.slot, 0u);
  EXPECT_TRUE(again.landing_pending);  // was in flight: the taker waits for it to land
  const auto one = ring.take();
  EXPECT_EQ(one.slot, 1u);
  EXPECT_FALSE(one.landing_pending);
}

TEST(SlotRing, MisuseIsRefusedAndChangesNothing) {
  EXPECT_THROW(SlotRing(0), InvalidArgument);
  SlotRing ring(2);
  EXPECT_THROW(ring.hand_off(0), InvalidArgument);  // not taken
  EXPECT_THROW(ring.give_back(7), InvalidArgument);  // no such slot
  const auto t = ring.take();
  ring.give_back(t.slot);
  EXPECT_THROW(ring.give_back(t.slot), InvalidArgument);  // twice
  EXPECT_EQ(ring.state(t.slot), SlotState::free);
  EXPECT_EQ(ring.take().slot, 1u);
}

TEST(SlotRing, StopWakesEveryBlockedTaker) {
  SlotRing ring(1);
  ring.take();
  std::atomic<int> stopped{0};
  std::vector<std::thread> ts;
  for (int i = 0; i < 4; ++i)
    ts.emplace_back([&] {
      if (ring.take().slot == SlotRing::kStopped) stopped++;
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(stopped.load(), 0);  // all blocked: the one slot is being filled
  ring.stop();
  for (auto& t : ts) t.join();
  EXPECT_EQ(stopped.load(), 4);
}

TEST(SlotRing, ThreadsNeverFillOneSlotAtOnce) {
  constexpr size_t kSlots = 3;
  SlotRing ring(kSlots);
  std::vector<std::atomic<int>> owners(kSlots);
  std::vector<std::atomic<int>> pending(kSlots);  // 1 while a hand_off has not landed
  std::atomic<int> bad{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 6; ++t)
    ts.emplace_back([&, t] {
      std::mt19937 r(t);
      for (int i = 0; i < 2000; ++i) {
        const auto k = ring.take();
        if (owners[k.slot].fetch_add(1) != 0) bad++;
        if (pending[k.slot].load() != (k.landing_pending ? 1 : 0)) bad++;
        pending[k.slot] = 0;  // "landed" (waited for) before writing
        owners[k.slot].fetch_sub(1);
        if (r() % 2) {
          pending[k.slot] = 1;
          ring.hand_off(k.slot);
        } else {
          ring.give_back(k.slot);
        }
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(bad.load(), 0);
}

}  // namespace
}  // namespace ferry
