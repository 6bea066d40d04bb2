// channel_test.cpp — the channel's C API on any machine: NULL and bad
// arguments, the GDRCopy probe and its FERRY_ERROR_NOT_SUPPORTED path,
// FERRY_ERROR_NO_DEVICE without a driver or device, and (where a GPU is
// present) ping, stats and the argument checks of a live channel. Also the
// pure layout logic that the host and the kernel share (channel_layout.h):
// tags, request packing, payload placement, and the byte/vector split of copies.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/channel/channel_layout.h"
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
  EXPECT_EQ(ferry_channel_create_v2(nullptr, 0, nullptr), FERRY_ERROR_INVALID_ARGUMENT);
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
  ferry_channel_stats_t stats{};
  stats.struct_size = sizeof stats;
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
    EXPECT_EQ(ferry_channel_create_v2(&o, 0, &ch), FERRY_ERROR_INVALID_ARGUMENT) << c.quoted;
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
  EXPECT_EQ(ferry_channel_create_v2(&o, 0, &ch), FERRY_ERROR_NOT_SUPPORTED) << last();
  EXPECT_EQ(ch, nullptr);
  EXPECT_NE(last().find("GDRCopy is not available"), std::string::npos) << last();
  EXPECT_NE(last().find(reason), std::string::npos) << last();
}

TEST(ChannelCApi, CreateWithoutADeviceIsNoDevice) {
  if (have_device()) GTEST_SKIP() << "a CUDA device is present";
  ferry_channel_t ch = nullptr;
  EXPECT_EQ(ferry_channel_create_v2(nullptr, 0, &ch), FERRY_ERROR_NO_DEVICE) << last();
  EXPECT_EQ(ch, nullptr);
  EXPECT_NE(last().find("CUDA"), std::string::npos) << last();
}

TEST(ChannelCApi, LiveChannelPingsAndChecksItsArguments) {
  if (!have_device()) GTEST_SKIP() << "needs a CUDA device";
  ferry_channel_t ch = nullptr;
  ASSERT_EQ(ferry_channel_create_v2(nullptr, -1, &ch), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("device -1 does not exist"), std::string::npos) << last();
  ASSERT_EQ(ferry_channel_create_v2(nullptr, 0, &ch), FERRY_SUCCESS) << last();
  double us = 0;
  ASSERT_EQ(ferry_channel_ping(ch, &us), FERRY_SUCCESS) << last();
  EXPECT_GT(us, 0.0);
  ferry_channel_stats_t s{};
  s.struct_size = sizeof s;
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

namespace layout = ferry::cuda::channel_layout;

TEST(ChannelLayout, WordsCarryTheTicketsLow32BitsAsTagAndTheirData) {
  const uint64_t tickets[] = {0, 1, 7, 0xFFFFFFFFull, 0x100000000ull, 0x1234567890ull, ~0ull};
  for (uint64_t t : tickets) {
    for (uint32_t data : {0u, 1u, 0x80000000u, 0xFFFFFFFFu}) {
      const uint64_t w = layout::make_word(t, data);
      EXPECT_EQ(layout::word_tag(w), layout::ticket_tag(t)) << t;
      EXPECT_EQ(layout::word_tag(w), static_cast<uint32_t>(t)) << t;
      EXPECT_EQ(layout::word_data(w), data) << t;
    }
  }
}

TEST(ChannelLayout, AStaleWordNeverMatchesTheNextTicketOfItsSlot) {
  // A slot's words carry the tag of ticket t - slots when ticket t is expected
  // (initially: ticket s - slots, as Channel's constructor writes them).
  for (uint64_t slots = 1; slots <= 64; ++slots) {
    for (uint64_t t : {uint64_t{0}, slots - 1, slots, uint64_t{0xFFFFFFFF}, uint64_t{0x100000000},
                       uint64_t{0x100000000} + slots - 1}) {
      const uint64_t stale = layout::make_word(t - slots, layout::kResultOk);
      EXPECT_NE(layout::word_tag(stale), layout::ticket_tag(t)) << "slots " << slots << " t " << t;
    }
  }
}

TEST(ChannelLayout, PackRequestPlacesTheHeaderAndInlineWriteBytes) {
  std::mt19937_64 rng(7);
  unsigned char src[layout::kInlineBytes + 1];
  for (auto& b : src) b = static_cast<unsigned char>(rng() | 1);  // never 0: padding is
  const uint64_t addresses[] = {0x7f0012345671ull, 0xFFFFFFFF00000010ull, 0x10ull};
  for (uint64_t address : addresses) {
    for (uint32_t n = 1; n <= layout::kInlineBytes + 1; ++n) {
      const layout::RequestData d =
          layout::pack_request(layout::kOpWrite, address, n, 0xAB, 0x1234, src);
      EXPECT_EQ(d.word[layout::kWordOp], layout::kOpWrite);
      EXPECT_EQ(d.word[layout::kWordBytes], n);
      EXPECT_EQ(layout::request_address(d.word), address);
      EXPECT_EQ(d.word[layout::kWordValue], 0xABu);
      EXPECT_EQ(d.word[layout::kWordTimeoutUs], 0x1234u);
      const bool in_words = n <= layout::kInlineBytes;
      EXPECT_EQ(layout::has_inline_payload(layout::kOpWrite, n), in_words) << n;
      const unsigned char* inline_bytes = layout::inline_payload(d.word);
      for (uint32_t i = 0; i < layout::kInlineBytes; ++i) {
        const unsigned char expected = in_words && i < n ? src[i] : 0;
        ASSERT_EQ(inline_bytes[i], expected) << "write of " << n << " bytes, byte " << i;
      }
    }
  }
  // Byte order through the words: byte i of the write is byte i % 4 (little
  // endian) of inline word i / 4, as the kernel reads it back.
  const unsigned char four[4] = {0x11, 0x22, 0x33, 0x44};
  const layout::RequestData d = layout::pack_request(layout::kOpWrite, 0x1000, 4, 0, 0, four);
  EXPECT_EQ(d.word[layout::kHeaderWords], 0x44332211u);
}

TEST(ChannelLayout, OnlyWritesTravelInline) {
  const unsigned char byte = 0x5A;
  for (layout::Op op : {layout::kOpNop, layout::kOpRead, layout::kOpFill, layout::kOpSignal,
                        layout::kOpWait}) {
    EXPECT_FALSE(layout::has_inline_payload(op, 1)) << op;
    const layout::RequestData d = layout::pack_request(op, 0x1000, 1, 3, 4, &byte);
    for (uint32_t w = layout::kHeaderWords; w < layout::kRequestWords; ++w)
      EXPECT_EQ(d.word[w], 0u) << "op " << op << " word " << w;
  }
  // A ping has no address and no source.
  const layout::RequestData ping = layout::pack_request(layout::kOpNop, 0, 0, 0, 0, nullptr);
  EXPECT_EQ(ping.word[layout::kWordOp], layout::kOpNop);
  EXPECT_EQ(layout::request_address(ping.word), 0u);
}

TEST(ChannelLayout, PayloadSitsCoalignedWithTheDeviceAddress) {
  static_assert(offsetof(layout::Slot, payload) % 16 == 0);
  static_assert(sizeof(layout::Slot::payload) >= layout::kMaxPayload + 15);
  for (uint64_t a = 0x7f0000001000ull; a < 0x7f0000001040ull; ++a) {
    EXPECT_EQ(layout::payload_offset(a), a % 16);
    // Payload area (16-byte aligned) + offset and the device address share
    // their position in a 16-byte line: 16-byte accesses line up on both sides.
    EXPECT_EQ((offsetof(layout::Slot, payload) + layout::payload_offset(a)) % 16, a % 16);
  }
}

TEST(ChannelLayout, SplitEdgesCoversEveryByteOnceWithAlignedVectors) {
  std::vector<uint32_t> sizes;
  for (uint32_t n = 1; n <= 300; ++n) sizes.push_back(n);
  for (uint32_t n : {4095u, 4096u, 4097u, 65535u, 65536u}) sizes.push_back(n);
  for (uint64_t dst = 0x7f0000002000ull; dst < 0x7f0000002000ull + 32; ++dst) {
    for (uint32_t n : sizes) {
      const layout::Edges e = layout::split_edges(dst, n);
      ASSERT_LE(e.head, n);
      ASSERT_LT(e.head, 16u);
      ASSERT_EQ(e.tail, e.head + 16 * e.vectors);
      ASSERT_LE(e.tail, n);
      ASSERT_LT(n - e.tail, 16u);
      if (e.head < n) {
        ASSERT_EQ((dst + e.head) % 16, 0u) << "dst%16 " << dst % 16 << " n " << n;
      }
      // The kernel: thread i < head stores byte i, thread i < n - tail stores
      // byte tail + i, vector v covers bytes head + 16 v .. +15.
      std::vector<int> covered(n, 0);
      for (uint32_t i = 0; i < e.head; ++i) ++covered[i];
      for (uint32_t v = 0; v < e.vectors; ++v)
        for (uint32_t i = 0; i < 16; ++i) ++covered[e.head + 16 * v + i];
      for (uint32_t i = 0; i < n - e.tail; ++i) ++covered[e.tail + i];
      for (uint32_t i = 0; i < n; ++i)
        ASSERT_EQ(covered[i], 1) << "byte " << i << " of " << n << " at dst%16 " << dst % 16;
    }
  }
}

}  // namespace
