// fault_test.cpp — fault-injection rules: parsing and counting.
#include "core/fault.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace ferry {
namespace {

TEST(Fault, ParsesRules) {
  auto rules = parse_fault_spec("mmap:2,register:0+, madvise:5 ,");
  ASSERT_EQ(rules.size(), 3u);
  EXPECT_EQ(rules[0].point, FaultPoint::mmap);
  EXPECT_EQ(rules[0].after, 2);
  EXPECT_FALSE(rules[0].persistent);
  EXPECT_EQ(rules[1].point, FaultPoint::register_host);
  EXPECT_EQ(rules[1].after, 0);
  EXPECT_TRUE(rules[1].persistent);
  EXPECT_EQ(rules[2].point, FaultPoint::madvise);
  EXPECT_EQ(rules[2].after, 5);
}

TEST(Fault, RejectsBadRulesQuotingThem) {
  for (const char* bad : {"mmap", "nope:1", "mmap:x", "mmap:-1", "mmap:"}) {
    try {
      parse_fault_spec(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

TEST(Fault, OneShotFailsExactlyTheNextCallAfterN) {
  set_fault_injection("madvise:2");
  EXPECT_FALSE(fault_injected(FaultPoint::madvise));
  EXPECT_FALSE(fault_injected(FaultPoint::madvise));
  EXPECT_FALSE(fault_injected(FaultPoint::mmap));  // other calls are not counted against it
  EXPECT_TRUE(fault_injected(FaultPoint::madvise));
  EXPECT_FALSE(fault_injected(FaultPoint::madvise));
  set_fault_injection("");
}

TEST(Fault, PersistentKeepsFailing) {
  set_fault_injection("touch:1+");
  EXPECT_FALSE(fault_injected(FaultPoint::touch));
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(fault_injected(FaultPoint::touch));
  set_fault_injection("");
  EXPECT_FALSE(fault_injected(FaultPoint::touch));
}

TEST(Fault, BadSpecLeavesRulesUnchanged) {
  set_fault_injection("mmap:0");
  EXPECT_THROW(set_fault_injection("mmap:zz"), InvalidArgument);
  EXPECT_TRUE(fault_injected(FaultPoint::mmap));
  set_fault_injection("");
}

}  // namespace
}  // namespace ferry
