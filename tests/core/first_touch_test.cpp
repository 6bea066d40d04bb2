// first_touch_test.cpp — FirstTouch on real mappings: every page of the range
// becomes resident (mincore) with any thread count and odd sizes, the memory
// reads as zero, the touched prefix grows from the base (wait_touched), stop()
// and the injected touch fault.
#include "pool/first_touch.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "core/fault.h"

namespace ferry {
namespace {

constexpr size_t KiB = size_t{1} << 10, MiB = size_t{1} << 20;

// A fresh private mapping of small pages (no THP: every 4 KiB page is one
// fault, which makes the touch slow enough to watch), 2 MiB aligned.
class Mapping {
 public:
  explicit Mapping(size_t bytes) : bytes_(bytes) {
    const size_t span = bytes + 2 * MiB;
    void* p = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return;
    raw_ = static_cast<char*>(p);
    raw_bytes_ = span;
    base_ = (reinterpret_cast<uintptr_t>(p) + 2 * MiB - 1) & ~(2 * MiB - 1);
    madvise(reinterpret_cast<void*>(base_), bytes, MADV_NOHUGEPAGE);
  }
  ~Mapping() {
    if (raw_) munmap(raw_, raw_bytes_);
  }
  uintptr_t base() const { return base_; }
  size_t bytes() const { return bytes_; }
  // Bytes of [base, base + n) resident, in 4 KiB pages.
  size_t resident(size_t n) const {
    std::vector<unsigned char> v((n + 4095) / 4096);
    if (mincore(reinterpret_cast<void*>(base_), n, v.data()) != 0) return SIZE_MAX;
    size_t pages = 0;
    for (unsigned char c : v) pages += c & 1;
    return pages * 4096;
  }
  // Length of the resident prefix.
  size_t resident_prefix() const {
    std::vector<unsigned char> v((bytes_ + 4095) / 4096);
    if (mincore(reinterpret_cast<void*>(base_), bytes_, v.data()) != 0) return SIZE_MAX;
    size_t pages = 0;
    while (pages < v.size() && (v[pages] & 1)) ++pages;
    return pages * 4096;
  }

 private:
  size_t bytes_;
  char* raw_ = nullptr;
  size_t raw_bytes_ = 0;
  uintptr_t base_ = 0;
};

class FirstTouchTest : public ::testing::Test {
 protected:
  void TearDown() override { set_fault_injection(""); }
};

TEST_F(FirstTouchTest, TouchesEveryPageWithAnyThreadCountAndSize) {
  for (const int threads : {1, 3, 16}) {
    for (const size_t bytes : {4 * KiB, 2 * MiB, 3 * MiB + 4 * KiB, 37 * MiB}) {
      Mapping m(bytes);
      ASSERT_NE(m.base(), 0u);
      ASSERT_EQ(m.resident(bytes), 0u);
      FirstTouch touch(m.base(), bytes, threads);
      EXPECT_EQ(touch.join(), 0);
      EXPECT_EQ(m.resident(bytes), (bytes + 4095) / 4096 * 4096) << threads << " threads, " << bytes << " bytes";
      EXPECT_GT(touch.elapsed_ns(), 0u);
      const auto* b = reinterpret_cast<const unsigned char*>(m.base());
      for (size_t i = 0; i < bytes; i += 4093) ASSERT_EQ(b[i], 0) << "touched memory does not read as zero";
      EXPECT_EQ(touch.join(), 0) << "a second join() must be harmless";
    }
  }
}

TEST_F(FirstTouchTest, ThePrefixGrowsFromTheBase) {
  // One thread, 256 MiB of small pages: at each wait_touched(n), at least n
  // bytes from the base are resident, while the whole is not yet.
  const size_t bytes = 256 * MiB;
  Mapping m(bytes);
  FirstTouch touch(m.base(), bytes, 1);
  for (const size_t n : {size_t{0}, 2 * MiB, 7 * MiB, 64 * MiB}) {
    ASSERT_TRUE(touch.wait_touched(n, nullptr));
    EXPECT_GE(m.resident_prefix(), n);
  }
  ASSERT_TRUE(touch.wait_touched(bytes, nullptr));
  EXPECT_EQ(m.resident_prefix(), bytes);
  EXPECT_EQ(touch.join(), 0);
}

TEST_F(FirstTouchTest, ManyThreadsStillFillTheFrontInOrder) {
  const size_t bytes = 64 * MiB;
  Mapping m(bytes);
  FirstTouch touch(m.base(), bytes, 8);
  ASSERT_TRUE(touch.wait_touched(40 * MiB, nullptr));
  EXPECT_GE(m.resident_prefix(), 40 * MiB);
  EXPECT_EQ(touch.join(), 0);
  EXPECT_EQ(m.resident_prefix(), bytes);
}

TEST_F(FirstTouchTest, StopLeavesTheRestUntouched) {
  const size_t bytes = 512 * MiB;
  Mapping m(bytes);
  FirstTouch touch(m.base(), bytes, 1);
  touch.stop();
  EXPECT_FALSE(touch.wait_touched(bytes, nullptr));
  EXPECT_EQ(touch.join(), ECANCELED);
  EXPECT_LT(m.resident(bytes), bytes);
}

TEST_F(FirstTouchTest, CancelEndsTheWait) {
  const size_t bytes = 512 * MiB;
  Mapping m(bytes);
  FirstTouch touch(m.base(), bytes, 1);
  std::atomic<bool> cancel{true};
  EXPECT_FALSE(touch.wait_touched(bytes, &cancel));
  touch.stop();
  EXPECT_EQ(touch.join(), ECANCELED);
}

TEST_F(FirstTouchTest, TheInjectedFaultTouchesNothing) {
  Mapping m(8 * MiB);
  set_fault_injection("touch:0");
  FirstTouch touch(m.base(), 8 * MiB, 4);
  EXPECT_FALSE(touch.wait_touched(2 * MiB, nullptr)) << "nobody touches: the wait must not block";
  EXPECT_EQ(touch.join(), ENOMEM);
  EXPECT_EQ(m.resident(8 * MiB), 0u);
  set_fault_injection("");
  FirstTouch again(m.base(), 8 * MiB, 4);
  EXPECT_EQ(again.join(), 0);
  EXPECT_EQ(m.resident(8 * MiB), 8 * MiB);
}

TEST_F(FirstTouchTest, DestroyedWithoutJoinStopsAndJoins) {
  Mapping m(128 * MiB);
  { FirstTouch touch(m.base(), 128 * MiB, 2); }  // no join(): the destructor stops and joins
  EXPECT_LT(m.resident(128 * MiB), 128 * MiB) << "the destructor touched everything instead of stopping";
}

}  // namespace
}  // namespace ferry
