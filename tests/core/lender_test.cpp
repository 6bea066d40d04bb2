// lender_test.cpp — core/lender.h: made on demand up to the bound, the
// preferred free object first, the longest-free one next, waiting last.
#include "core/lender.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>

namespace ferry {
namespace {

struct Thing {
  int id = 0;
  bool busy = false;  // preferred: not busy
};

TEST(Lender, MakesUpToTheBoundThenPrefersThenFallsBackThenWaits) {
  Lender<Thing> lender(2);
  int made = 0;
  auto make = [&] {
    auto t = std::make_unique<Thing>();
    t->id = ++made;
    return t;
  };
  auto idle = [](const Thing& t) { return !t.busy; };
  Thing& a = lender.acquire(make, idle);
  Thing& b = lender.acquire(make, idle);
  EXPECT_EQ(made, 2);
  lender.release(a, [](Thing& t) { t.busy = true; });
  lender.release(b, [](Thing& t) { t.busy = false; });
  EXPECT_EQ(&lender.acquire(make, idle), &b);  // the preferred one, though returned last
  EXPECT_EQ(&lender.acquire(make, idle), &a);  // none preferred, none to make: the longest-free
  EXPECT_EQ(made, 2);
  std::atomic<bool> got{false};
  std::thread waiter([&] {
    lender.acquire(make, idle);
    got = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(got);
  lender.release(a);
  waiter.join();
  EXPECT_TRUE(got);
  EXPECT_EQ(lender.all_unlocked().size(), 2u);
}

TEST(Lender, AFailedMakeGivesItsPlaceBack) {
  Lender<Thing> lender(1);
  EXPECT_THROW(lender.acquire([]() -> std::unique_ptr<Thing> { throw std::runtime_error("no"); }),
               std::runtime_error);
  Thing& t = lender.acquire([] { return std::make_unique<Thing>(); });
  lender.release(t);
  EXPECT_EQ(lender.all_unlocked().size(), 1u);
}

}  // namespace
}  // namespace ferry
