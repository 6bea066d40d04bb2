// node_test.cpp — the node pool through the C API: open, blocks, named blocks,
// signal words, bad input, an older struct_size; pinning with no device.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ferry/ferry.h"

namespace {

std::string name_of(const char* what) { return "capi" + std::to_string(getpid()) + what; }

TEST(CapiNodePool, BlocksNamedBlocksAndWordsWork) {
  ferry_node_pool_options_t o;
  ASSERT_EQ(ferry_node_pool_options_init(&o), FERRY_SUCCESS);
  EXPECT_EQ(o.granule, size_t{64} << 10);
  o.capacity = size_t{4} << 20;
  o.label = "capi test";
  ferry_node_pool_t pool = nullptr;
  ASSERT_EQ(ferry_node_pool_open(name_of("a").c_str(), &o, &pool), FERRY_SUCCESS) << ferry_last_error();
  void* data = nullptr;
  size_t capacity = 0;
  ASSERT_EQ(ferry_node_pool_data(pool, &data, &capacity), FERRY_SUCCESS);
  EXPECT_EQ(capacity, size_t{4} << 20);
  uint64_t h = 0;
  size_t n = 0;
  ASSERT_EQ(ferry_node_pool_alloc(pool, 70001, &h, &n), FERRY_SUCCESS);
  EXPECT_EQ(n, size_t{128} << 10);
  std::mt19937 r(5);
  std::vector<unsigned char> bytes(70001);
  for (auto& b : bytes) b = static_cast<unsigned char>(r());
  std::memcpy(static_cast<char*>(data) + h, bytes.data(), bytes.size());
  size_t found = 0;
  ASSERT_EQ(ferry_node_pool_find(pool, h, &found), FERRY_SUCCESS);
  EXPECT_EQ(found, n);
  EXPECT_EQ(std::memcmp(static_cast<char*>(data) + h, bytes.data(), bytes.size()), 0);

  uint64_t named = 0;
  int created = -1;
  ASSERT_EQ(ferry_node_pool_alloc_named(pool, "weights", 100, &named, nullptr, &created), FERRY_SUCCESS);
  EXPECT_EQ(created, 1);
  uint64_t again = 1;
  ASSERT_EQ(ferry_node_pool_alloc_named(pool, "weights", 100, &again, nullptr, &created), FERRY_SUCCESS);
  EXPECT_EQ(created, 0);
  EXPECT_EQ(again, named);
  uint32_t before = 9;
  ASSERT_EQ(ferry_node_pool_add(pool, named + 4, 3, &before), FERRY_SUCCESS);
  EXPECT_EQ(before, 0u);
  int reached = -1;
  ASSERT_EQ(ferry_node_pool_wait(pool, named + 4, 3, 1.0, &reached), FERRY_SUCCESS);
  EXPECT_EQ(reached, 1);
  ASSERT_EQ(ferry_node_pool_wait(pool, named + 4, 4, 0.01, &reached), FERRY_SUCCESS);
  EXPECT_EQ(reached, 0);

  EXPECT_EQ(ferry_node_pool_release(pool, h), FERRY_SUCCESS);
  EXPECT_EQ(ferry_node_pool_release(pool, h), FERRY_ERROR_INVALID_ARGUMENT);  // twice
  EXPECT_NE(std::string(ferry_last_error()).find("no live block"), std::string::npos) << ferry_last_error();
  EXPECT_EQ(ferry_node_pool_take(pool, named), FERRY_ERROR_INVALID_ARGUMENT);  // named
  EXPECT_EQ(ferry_node_pool_destroy(pool), FERRY_SUCCESS);
  EXPECT_EQ(ferry_node_pool_destroy(pool), FERRY_ERROR_INVALID_ARGUMENT);  // destroyed
}

TEST(CapiNodePool, BadInputIsAFerryError) {
  ferry_node_pool_t pool = nullptr;
  EXPECT_EQ(ferry_node_pool_options_defaults(nullptr), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ferry_node_pool_open(nullptr, nullptr, &pool), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ferry_node_pool_open("bad name", nullptr, &pool), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ferry_node_pool_open(name_of("nocap").c_str(), nullptr, &pool), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("capacity"), std::string::npos);
  ferry_node_pool_options_t o;
  ferry_node_pool_options_init(&o);
  o.capacity = 1 << 20;
  ASSERT_EQ(ferry_node_pool_open(name_of("b").c_str(), &o, &pool), FERRY_SUCCESS);
  uint64_t h;
  EXPECT_EQ(ferry_node_pool_alloc(pool, 0, &h, nullptr), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ferry_node_pool_alloc(pool, 2 << 20, &h, nullptr), FERRY_ERROR_OUT_OF_MEMORY);
  EXPECT_NE(std::string(ferry_last_error()).find("Held: pid"), std::string::npos) << ferry_last_error();
  EXPECT_EQ(ferry_node_pool_alloc(pool, 10, nullptr, nullptr), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ferry_node_pool_add(pool, 2, 1, nullptr), FERRY_ERROR_INVALID_ARGUMENT);  // unaligned
  EXPECT_EQ(ferry_node_pool_find(reinterpret_cast<ferry_node_pool_t>(&o), 0, nullptr),
            FERRY_ERROR_INVALID_ARGUMENT);
  int count = 0;
  if (ferry_device_count(&count) != FERRY_SUCCESS || count == 0) {
    EXPECT_EQ(ferry_node_pool_alloc(pool, 10, &h, nullptr), FERRY_SUCCESS);
    EXPECT_EQ(ferry_node_pool_register(pool, 0, h, 10), FERRY_ERROR_CUDA);  // no device: the pin fails, said
    EXPECT_NE(std::string(ferry_last_error()).find("node pool"), std::string::npos) << ferry_last_error();
  }
  EXPECT_EQ(ferry_node_pool_destroy(pool), FERRY_SUCCESS);
}

TEST(CapiNodePool, AnOlderStructSizeKeepsTheDefaultsBeyondIt) {
  ferry_node_pool_options_t o;
  ferry_node_pool_options_init(&o);
  o.capacity = 1 << 20;
  o.granule = 4096;
  o.struct_size = offsetof(ferry_node_pool_options_t, label);  // a caller that knew no label or timeout
  ferry_node_pool_t pool = nullptr;
  ASSERT_EQ(ferry_node_pool_open(name_of("old").c_str(), &o, &pool), FERRY_SUCCESS) << ferry_last_error();
  uint64_t h;
  size_t n;
  ASSERT_EQ(ferry_node_pool_alloc(pool, 1, &h, &n), FERRY_SUCCESS);
  EXPECT_EQ(n, 4096u);
  EXPECT_EQ(ferry_node_pool_destroy(pool), FERRY_SUCCESS);
}

}  // namespace
