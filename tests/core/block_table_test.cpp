// block_table_test.cpp — a paged KV layout expanded into copy items
// (copy/block_table.h): the addresses of every (layer, block) pair against a
// direct computation on random tables, and each refusal with its message.
#include "copy/block_table.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"

namespace ferry {
namespace {

TEST(BlockTable, EveryLayerAndBlockInLayerMajorOrder) {
  std::mt19937_64 rng(std::random_device{}());
  for (int round = 0; round < 50; ++round) {
    const size_t n = 1 + rng() % 300, layers = 1 + rng() % 40, bytes = 1 + rng() % 70000;
    std::vector<int64_t> d(n), s(n);
    for (auto& x : d) x = static_cast<int64_t>(rng() % 5000);
    for (auto& x : s) x = static_cast<int64_t>(rng() % 5000);
    BlockTable t;
    t.dst = {0x7f0000000000ull + rng() % 4096, bytes + rng() % 64, bytes * 6000 + rng() % 4096};
    t.src = {0x10000000ull + rng() % 4096, bytes * (1 + rng() % 2), bytes * 12000};
    t.block_bytes = bytes;
    t.layers = layers;
    t.dst_ids = d;
    t.src_ids = s;
    check_block_table(t);
    ASSERT_EQ(block_table_items(t), n * layers);
    size_t k = 0;
    for_each_block(t, [&](uintptr_t dst, uintptr_t src, size_t b) {
      const size_t l = k / n, i = k % n;
      ASSERT_EQ(dst, t.dst.base + l * t.dst.layer_stride + static_cast<uintptr_t>(d[i]) * t.dst.block_stride) << k;
      ASSERT_EQ(src, t.src.base + l * t.src.layer_stride + static_cast<uintptr_t>(s[i]) * t.src.block_stride) << k;
      ASSERT_EQ(b, bytes);
      ++k;
    });
    ASSERT_EQ(k, n * layers);
  }
}

void refused(const BlockTable& t, const std::string& why) {
  try {
    check_block_table(t);
    ADD_FAILURE() << "accepted; expected: " << why;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
}

TEST(BlockTable, BadTablesAreRefusedNamingTheCulprit) {
  std::vector<int64_t> ids{0, 3, 7}, two{1, 2}, negative{0, -4, 2}, none;
  BlockTable t;
  t.dst = {0x100000, 4096, 0};
  t.src = {0x900000, 4096, 0};
  t.block_bytes = 4096;
  t.dst_ids = ids;
  t.src_ids = ids;
  check_block_table(t);  // the good one
  BlockTable bad = t;
  bad.src_ids = two;
  refused(bad, "dst_ids has 3 block ids and src_ids 2");
  bad = t, bad.dst_ids = none, bad.src_ids = none;
  refused(bad, "no block ids");
  bad = t, bad.src_ids = negative;
  refused(bad, "src_ids[1]=-4");
  bad = t, bad.block_bytes = 0;
  refused(bad, "block_bytes must be > 0");
  bad = t, bad.layers = 0;
  refused(bad, "layers must be >= 1");
  bad = t, bad.dst.block_stride = 4095;
  refused(bad, "dst_block_stride=4095 is below block_bytes=4096");
  bad = t, bad.src.base = 0;
  refused(bad, "src_base must not be 0");
  bad = t, bad.dst.base = UINTPTR_MAX - 8192;
  refused(bad, "past the end of the address space");
  bad = t, bad.layers = 3, bad.src.layer_stride = SIZE_MAX / 2;
  refused(bad, "src blocks: block 7 of layer 2");
}

}  // namespace
}  // namespace ferry
