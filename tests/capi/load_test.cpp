// load_test.cpp — the loader's C API on any machine: defaults from the
// FERRY_LOAD_* options, NULL and bad arguments named, bad options refused
// before any device is touched, no device -> FERRY_ERROR_NO_DEVICE. (Loads
// through the C API on a device: tests/gpu/load_test.cpp.)
#include <gtest/gtest.h>

#include <string>

#include "ferry/ferry.h"

namespace {

std::string last() { return ferry_last_error(); }

bool have_device() {
  int n = 0;
  return ferry_device_count(&n) == FERRY_SUCCESS && n > 0;
}

TEST(CApiLoader, DefaultsComeFromTheOptions) {
  ferry_loader_options_t o;
  ASSERT_EQ(ferry_loader_options_init(&o), FERRY_SUCCESS) << last();
  EXPECT_EQ(o.staging_bytes, size_t{512} << 20);
  EXPECT_EQ(o.slot_bytes, size_t{16} << 20);
  EXPECT_EQ(o.threads, 0);
  EXPECT_EQ(o.direct_io, FERRY_DIRECT_IO_AUTO);
  EXPECT_EQ(o.mapped_share, 0.0);
  EXPECT_EQ(o.progress, -1);
  EXPECT_EQ(ferry_loader_options_init(nullptr), FERRY_ERROR_INVALID_ARGUMENT);
}

TEST(CApiLoader, BadArgumentsAreNamed) {
  EXPECT_EQ(ferry_loader_create(nullptr, 0, nullptr), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("out must not be NULL"), std::string::npos) << last();
  EXPECT_EQ(ferry_loader_destroy(nullptr), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ferry_loader_load(nullptr, nullptr, 0, nullptr, 0, nullptr, nullptr), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("loader must not be NULL"), std::string::npos) << last();

  struct {
    void (*edit)(ferry_loader_options_t&);
    const char* expect;
  } cases[] = {
      {[](ferry_loader_options_t& o) { o.slot_bytes = 5000; }, "slot_bytes=5000"},
      {[](ferry_loader_options_t& o) { o.slot_bytes = 0; }, "slot_bytes=0"},
      {[](ferry_loader_options_t& o) { o.staging_bytes = o.slot_bytes; }, "fewer than 2 slots"},
      {[](ferry_loader_options_t& o) { o.mapped_share = 1.5; }, "mapped_share=1.5"},
      {[](ferry_loader_options_t& o) { o.threads = -1; }, "threads=-1"},
      {[](ferry_loader_options_t& o) { o.direct_io = static_cast<ferry_direct_io_t>(7); }, "direct_io=7"},
  };
  for (const auto& c : cases) {
    ferry_loader_options_t o;
    ASSERT_EQ(ferry_loader_options_init(&o), FERRY_SUCCESS);
    c.edit(o);
    ferry_loader_t l = reinterpret_cast<ferry_loader_t>(0x1);
    EXPECT_EQ(ferry_loader_create(&o, 0, &l), FERRY_ERROR_INVALID_ARGUMENT) << c.expect;
    EXPECT_EQ(l, nullptr);
    EXPECT_NE(last().find(c.expect), std::string::npos) << last();
  }
}

TEST(CApiLoader, NoDeviceFailsCleanly) {
  if (have_device()) GTEST_SKIP() << "a CUDA device is present (tests/gpu/load_test.cpp loads)";
  ferry_loader_t l = reinterpret_cast<ferry_loader_t>(0x1);
  EXPECT_EQ(ferry_loader_create(nullptr, 0, &l), FERRY_ERROR_NO_DEVICE);
  EXPECT_EQ(l, nullptr);
}

}  // namespace
