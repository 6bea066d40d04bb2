// channel_test.cpp — the channel's C API on any machine: NULL and bad
// arguments, the GDRCopy probe and its FERRY_ERROR_NOT_SUPPORTED path,
// FERRY_ERROR_NO_DEVICE without a driver or device, and (where a GPU is
// present) ping, stats and the argument checks of a live channel.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ferry/ferry.h"

namespace {

std::string last() { return ferry_last_error(); }

bool have_device() {
  int n = 0;
  return ferry_device_count(&n) == FERRY_SUCCESS && n > 0;
}

bool gdrcopy_available() {
  int available = -1;
  EXPECT_EQ(ferry_gdrcopy_available(&available, nullptr), FERRY_SUCCESS);
  return available == 1;
}

TEST(ChannelCApi, OptionsInitGivesTheDocumentedDefaults) {
  ferry_channel_options_t o;
  ASSERT_EQ(ferry_channel_options_init(&o), FERRY_SUCCESS);
  EXPECT_EQ(o.idle_us, 200u);
  EXPECT_EQ(o.slots, 8u);
  EXPECT_EQ(o.timeout_ms, 5000u);
  EXPECT_EQ(o.spin_us, 20u);
  EXPECT_EQ(o.use_gdrcopy, 0);
  EXPECT_EQ(FERRY_CHANNEL_MAX_PAYLOAD, 65536);
}

TEST(ChannelCApi, NullArgumentsAreNamed) {
  EXPECT_EQ(ferry_channel_options_init(nullptr), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ferry_channel_create(0, nullptr, nullptr), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("out must not be NULL"), std::string::npos) << last();
  char byte = 0;
  EXPECT_EQ(ferry_channel_write(nullptr, &byte, &byte, 1), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("channel must not be NULL"), std::string::npos) << last();
  EXPECT_EQ(ferry_channel_read(nullptr, &byte, &byte, 1), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ferry_channel_fill(nullptr, &byte, 0, 1), FERRY_ERROR_INVALID_ARGUMENT);
  uint32_t flag = 0;
  EXPECT_EQ(ferry_channel_signal(nullptr, &flag, 1), FERRY_ERROR_INVALID_ARGUMENT);
  int reached = 0;
  EXPECT_EQ(ferry_channel_wait(nullptr, &flag, 1, 10, &reached), FERRY_ERROR_INVALID_ARGUMENT);
  double us = 0;
  EXPECT_EQ(ferry_channel_ping(nullptr, &us), FERRY_ERROR_INVALID_ARGUMENT);
  ferry_channel_stats_t stats;
  EXPECT_EQ(ferry_channel_get_stats(nullptr, &stats), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ferry_channel_destroy(nullptr), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ferry_gdrcopy_available(nullptr, nullptr), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("available must not be NULL"), std::string::npos) << last();
}

TEST(ChannelCApi, BadOptionsAreQuoted) {
  struct Case {
    void (*change)(ferry_channel_options_t&);
    const char* quoted;
  };
  const Case cases[] = {
      {[](ferry_channel_options_t& o) { o.slots = 0; }, "slots=0"},
      {[](ferry_channel_options_t& o) { o.slots = 65; }, "slots=65"},
      {[](ferry_channel_options_t& o) { o.idle_us = 0; }, "idle_us=0"},
      {[](ferry_channel_options_t& o) { o.timeout_ms = 0; }, "timeout_ms=0"},
      {[](ferry_channel_options_t& o) { o.spin_us = 1000000; }, "spin_us=1000000"},
      {[](ferry_channel_options_t& o) { o.use_gdrcopy = 2; }, "use_gdrcopy=2"},
  };
  for (const Case& c : cases) {
    ferry_channel_options_t o;
    ASSERT_EQ(ferry_channel_options_init(&o), FERRY_SUCCESS);
    c.change(o);
    ferry_channel_t ch = reinterpret_cast<ferry_channel_t>(&o);  // must be reset to NULL
    EXPECT_EQ(ferry_channel_create(0, &o, &ch), FERRY_ERROR_INVALID_ARGUMENT) << c.quoted;
    EXPECT_EQ(ch, nullptr);
    EXPECT_NE(last().find(c.quoted), std::string::npos) << last();
  }
}

TEST(ChannelCApi, GdrcopyProbeAlwaysGivesAReason) {
  int available = -1;
  const char* reason = nullptr;
  ASSERT_EQ(ferry_gdrcopy_available(&available, &reason), FERRY_SUCCESS);
  ASSERT_TRUE(available == 0 || available == 1);
  ASSERT_NE(reason, nullptr);
  const std::string r = reason;
  EXPECT_FALSE(r.empty());
  if (!available) {
    EXPECT_TRUE(r.find("/dev/gdrdrv") != std::string::npos ||
                r.find("libgdrapi.so.2") != std::string::npos ||
                r.find("gdr_open") != std::string::npos)
        << r;
  }
}

TEST(ChannelCApi, UseGdrcopyWithoutGdrcopyIsNotSupportedWithTheReason) {
  if (gdrcopy_available()) GTEST_SKIP() << "GDRCopy is available on this machine";
  const char* reason = nullptr;
  int available = 0;
  ASSERT_EQ(ferry_gdrcopy_available(&available, &reason), FERRY_SUCCESS);
  ferry_channel_options_t o;
  ASSERT_EQ(ferry_channel_options_init(&o), FERRY_SUCCESS);
  o.use_gdrcopy = 1;
  ferry_channel_t ch = nullptr;
  EXPECT_EQ(ferry_channel_create(0, &o, &ch), FERRY_ERROR_NOT_SUPPORTED) << last();
  EXPECT_EQ(ch, nullptr);
  EXPECT_NE(last().find("GDRCopy is not available"), std::string::npos) << last();
  EXPECT_NE(last().find(reason), std::string::npos) << last();
}

TEST(ChannelCApi, CreateWithoutADeviceIsNoDevice) {
  if (have_device()) GTEST_SKIP() << "a CUDA device is present";
  ferry_channel_t ch = nullptr;
  EXPECT_EQ(ferry_channel_create(0, nullptr, &ch), FERRY_ERROR_NO_DEVICE) << last();
  EXPECT_EQ(ch, nullptr);
  EXPECT_NE(last().find("CUDA"), std::string::npos) << last();
}

TEST(ChannelCApi, LiveChannelPingsAndChecksItsArguments) {
  if (!have_device()) GTEST_SKIP() << "needs a CUDA device";
  ferry_channel_t ch = nullptr;
  ASSERT_EQ(ferry_channel_create(-1, nullptr, &ch), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("device -1 does not exist"), std::string::npos) << last();
  ASSERT_EQ(ferry_channel_create(0, nullptr, &ch), FERRY_SUCCESS) << last();
  double us = 0;
  ASSERT_EQ(ferry_channel_ping(ch, &us), FERRY_SUCCESS) << last();
  EXPECT_GT(us, 0.0);
  ferry_channel_stats_t s;
  ASSERT_EQ(ferry_channel_get_stats(ch, &s), FERRY_SUCCESS);
  EXPECT_EQ(s.requests, 1u);
  EXPECT_EQ(s.launches, 1u);

  std::vector<char> host(FERRY_CHANNEL_MAX_PAYLOAD + 1);
  EXPECT_EQ(ferry_channel_write(ch, host.data(), host.data(), host.size()),
            FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("use ferry's copy engine (ferry.copy) for transfers above 64 KiB"),
            std::string::npos)
      << last();
  EXPECT_EQ(ferry_channel_read(ch, host.data(), host.data(), 0), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("at least 1"), std::string::npos) << last();
  EXPECT_EQ(ferry_channel_write(ch, host.data(), host.data(), 16), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("not CUDA device memory"), std::string::npos) << last();
  EXPECT_EQ(ferry_channel_fill(ch, nullptr, 0, 16), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("dev_dst must not be NULL"), std::string::npos) << last();
  ASSERT_EQ(ferry_channel_get_stats(ch, &s), FERRY_SUCCESS);
  EXPECT_EQ(s.requests, 1u) << "refused requests must not reach the kernel";
  EXPECT_EQ(ferry_channel_destroy(ch), FERRY_SUCCESS) << last();
}

}  // namespace
