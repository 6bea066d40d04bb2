// load_test.cpp — the loader's C API on any machine: defaults from the
// FERRY_LOAD_* options, NULL and bad arguments named, bad options refused
// before any device is touched, no device -> FERRY_ERROR_NO_DEVICE. (Loads
// through the C API on a device: tests/gpu/load_test.cpp.)
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
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
  EXPECT_EQ(o.retired_mapped_share, 0.0);
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
      {[](ferry_loader_options_t& o) { o.slot_bytes = 4096, o.staging_bytes = size_t{1} << 40; },
       "more than 1048576 slots"},
      {[](ferry_loader_options_t& o) { o.retired_mapped_share = 0.5; }, "the mapped share was removed in API 1.3"},
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

// ferry.h's growth rule: a caller built against an older header, whose
// options end before `progress`, gets the defaults for what it lacks; an
// unset struct_size is refused.
TEST(CApiLoader, OptionsFollowTheStructSizeRule) {
  struct OldOptions {  // the struct without progress and reserved
    size_t struct_size, staging_bytes, slot_bytes;
    int threads;
    ferry_direct_io_t direct_io;
    double retired_mapped_share;
  };
  static_assert(sizeof(OldOptions) == offsetof(ferry_loader_options_t, progress));
  unsigned char raw[sizeof(OldOptions) + 64];
  std::memset(raw, 0xAB, sizeof raw);  // poison past the old struct
  auto* old = reinterpret_cast<OldOptions*>(raw);
  old->struct_size = sizeof(OldOptions);
  ASSERT_EQ(ferry_loader_options_defaults(reinterpret_cast<ferry_loader_options_t*>(old)), FERRY_SUCCESS) << last();
  EXPECT_EQ(old->struct_size, sizeof(OldOptions));
  EXPECT_EQ(old->slot_bytes, size_t{16} << 20);
  for (size_t i = sizeof(OldOptions); i < sizeof raw; ++i) ASSERT_EQ(raw[i], 0xAB) << "wrote past the caller's struct";
  // Its options are read; the poisoned progress/reserved are not (else: InvalidArgument for them).
  old->slot_bytes = 5000;
  ferry_loader_t l = nullptr;
  EXPECT_EQ(ferry_loader_create(reinterpret_cast<ferry_loader_options_t*>(old), 0, &l), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("slot_bytes=5000"), std::string::npos) << last();
  ferry_loader_options_t o{};
  EXPECT_EQ(ferry_loader_options_defaults(&o), FERRY_ERROR_INVALID_ARGUMENT);  // struct_size 0
  EXPECT_NE(last().find("struct_size=0"), std::string::npos) << last();
  ASSERT_EQ(ferry_loader_options_init(&o), FERRY_SUCCESS);
  o.reserved = 1;
  EXPECT_EQ(ferry_loader_create(&o, 0, &l), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("reserved=1"), std::string::npos) << last();
  o.reserved = 0;
  o.progress = 2;
  EXPECT_EQ(ferry_loader_create(&o, 0, &l), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("progress=2"), std::string::npos) << last();
}

TEST(CApiLoader, NoDeviceFailsCleanly) {
  if (have_device()) GTEST_SKIP() << "a CUDA device is present (tests/gpu/load_test.cpp loads)";
  ferry_loader_t l = reinterpret_cast<ferry_loader_t>(0x1);
  EXPECT_EQ(ferry_loader_create(nullptr, 0, &l), FERRY_ERROR_NO_DEVICE);
  EXPECT_EQ(l, nullptr);
}

}  // namespace
