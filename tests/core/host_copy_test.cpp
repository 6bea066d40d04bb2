// host_copy_test.cpp — both store kinds copy exactly the bytes asked for, at
// every size and misalignment of either end, and nothing around them.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "copy/host_copy.h"

namespace ferry {
namespace {

TEST(HostCopy, ExactBytesAtOddSizesAndOffsets) {
  std::mt19937_64 rng(7);
  const size_t sizes[] = {0, 1, 31, 32, 33, 127, 128, 129, 4095, 16 << 10, (16 << 10) + 1, (64 << 10) + 77,
                          (1 << 20) + 3};
  for (auto fn : {copy_to_staging, copy_from_staging}) {
    for (size_t n : sizes) {
      for (size_t src_off : {0, 1, 17, 32}) {
        for (size_t dst_off : {0, 3, 31, 64}) {
          std::vector<unsigned char> src(n + 64), dst(n + 128, 0xA5);
          for (auto& b : src) b = static_cast<unsigned char>(rng());
          fn(dst.data() + dst_off, src.data() + src_off, n);
          ASSERT_EQ(std::memcmp(dst.data() + dst_off, src.data() + src_off, n), 0) << n << " " << src_off << " " << dst_off;
          for (size_t i = 0; i < dst_off; ++i) ASSERT_EQ(dst[i], 0xA5) << "wrote before the destination";
          for (size_t i = dst_off + n; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xA5) << "wrote past the destination";
        }
      }
    }
  }
}

}  // namespace
}  // namespace ferry
