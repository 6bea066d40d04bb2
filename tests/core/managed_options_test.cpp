// managed_options_test.cpp — the PyTorch allocators' names, option strings
// (defaults, every key, every refusal with the value quoted) and the
// oversubscription guard's decisions and message, all without CUDA.
#include "managed/managed_options.h"

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

namespace ferry {
namespace {

constexpr size_t GiB = size_t{1} << 30;

std::string refusal(ManagedKind kind, const std::string& text) {
  try {
    parse_managed_options(kind, text);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(accepted)";
}

bool has(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST(ManagedNames, KnownNamesAndAClearRefusal) {
  EXPECT_EQ(parse_managed_kind("device"), ManagedKind::device);
  EXPECT_EQ(parse_managed_kind("managed"), ManagedKind::managed);
  EXPECT_EQ(parse_managed_kind("managed_pool"), ManagedKind::managed_pool);
  for (ManagedKind k : {ManagedKind::device, ManagedKind::managed, ManagedKind::managed_pool})
    EXPECT_EQ(parse_managed_kind(managed_kind_name(k)), k);
  try {
    parse_managed_kind("Managed");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(has(e.what(), "'Managed'")) << e.what();
    EXPECT_TRUE(has(e.what(), "device, managed or managed_pool")) << e.what();
  }
  EXPECT_THROW(parse_managed_kind(""), InvalidArgument);
}

TEST(ManagedOptionsParse, Defaults) {
  ManagedOptions m = parse_managed_options(ManagedKind::managed, "");
  EXPECT_EQ(m.prefetch, PrefetchMode::none);
  EXPECT_FALSE(m.any_advice());
  EXPECT_FALSE(m.oversubscribe);
  ManagedOptions p = parse_managed_options(ManagedKind::managed_pool, "  ");
  EXPECT_EQ(p.prefetch, PrefetchMode::alloc);
  EXPECT_EQ(p.chunk_bytes, 64u << 20);
  EXPECT_TRUE(p.stream_wait);
  EXPECT_EQ(p.text(ManagedKind::managed_pool),
            "prefetch=alloc,advise=none,oversubscribe=0,chunk_bytes=67108864,stream_wait=1");
  EXPECT_EQ(m.text(ManagedKind::managed), "prefetch=0,advise=none,oversubscribe=0");
  EXPECT_EQ(parse_managed_options(ManagedKind::device, "").text(ManagedKind::device), "");
}

TEST(ManagedOptionsParse, EveryKey) {
  ManagedOptions m = parse_managed_options(
      ManagedKind::managed, " prefetch = yes , advise=preferred_location+read_mostly,oversubscribe=1,");
  EXPECT_EQ(m.prefetch, PrefetchMode::alloc);
  EXPECT_TRUE(m.preferred_location);
  EXPECT_FALSE(m.accessed_by);
  EXPECT_TRUE(m.read_mostly);
  EXPECT_TRUE(m.oversubscribe);
  EXPECT_EQ(m.text(ManagedKind::managed),
            "prefetch=1,advise=preferred_location+read_mostly,oversubscribe=1");
  ManagedOptions p = parse_managed_options(
      ManagedKind::managed_pool, "prefetch=chunk,advise=accessed_by,chunk_bytes=256M,stream_wait=0");
  EXPECT_EQ(p.prefetch, PrefetchMode::chunk);
  EXPECT_TRUE(p.accessed_by);
  EXPECT_EQ(p.chunk_bytes, 256u << 20);
  EXPECT_FALSE(p.stream_wait);
  EXPECT_EQ(parse_managed_options(ManagedKind::managed_pool, "prefetch=0").prefetch, PrefetchMode::none);
  EXPECT_EQ(parse_managed_options(ManagedKind::managed_pool, "prefetch=none").prefetch, PrefetchMode::none);
  EXPECT_EQ(parse_managed_options(ManagedKind::managed_pool, "prefetch=1").prefetch, PrefetchMode::alloc);
  EXPECT_FALSE(parse_managed_options(ManagedKind::managed, "advise=none").any_advice());
  // The canonical text parses back to the same options.
  const std::string t = p.text(ManagedKind::managed_pool);
  EXPECT_EQ(parse_managed_options(ManagedKind::managed_pool, t).text(ManagedKind::managed_pool), t);
}

TEST(ManagedOptionsParse, RefusalsQuoteTheValueAndSayWhatIsAccepted) {
  std::string e = refusal(ManagedKind::managed, "prefetch=maybe");
  EXPECT_TRUE(has(e, "'maybe'")) << e;
  EXPECT_TRUE(has(e, "0 or 1")) << e;
  e = refusal(ManagedKind::managed, "prefetch=chunk");  // only the pool has chunks
  EXPECT_TRUE(has(e, "'chunk'")) << e;
  e = refusal(ManagedKind::managed_pool, "prefetch=sometimes");
  EXPECT_TRUE(has(e, "alloc or chunk")) << e;
  e = refusal(ManagedKind::managed, "advise=preferred_location+nearby");
  EXPECT_TRUE(has(e, "'nearby'")) << e;
  EXPECT_TRUE(has(e, "read_mostly")) << e;
  e = refusal(ManagedKind::managed, "chunk_bytes=64M");  // a pool option
  EXPECT_TRUE(has(e, "unknown option 'chunk_bytes'")) << e;
  EXPECT_TRUE(has(e, "prefetch, advise, oversubscribe")) << e;
  e = refusal(ManagedKind::device, "prefetch=1");
  EXPECT_TRUE(has(e, "takes no options")) << e;
  e = refusal(ManagedKind::managed_pool, "chunk_bytes=3M");
  EXPECT_TRUE(has(e, "multiple of 2 MiB")) << e;
  e = refusal(ManagedKind::managed_pool, "chunk_bytes=lots");
  EXPECT_TRUE(has(e, "'lots'")) << e;
  e = refusal(ManagedKind::managed_pool, "chunk_bytes=0");
  EXPECT_TRUE(has(e, "positive")) << e;
  e = refusal(ManagedKind::managed, "oversubscribe");
  EXPECT_TRUE(has(e, "not key=value")) << e;
  e = refusal(ManagedKind::managed, "prefetch=1,prefetch=0");
  EXPECT_TRUE(has(e, "twice")) << e;
  e = refusal(ManagedKind::managed_pool, "stream_wait=2");
  EXPECT_TRUE(has(e, "'2'")) << e;
  e = refusal(ManagedKind::managed, "Prefetch=1");  // keys are exact
  EXPECT_TRUE(has(e, "'Prefetch'")) << e;
}

TEST(ManagedBudget, RefusesMoreThanFreeWithTheNumbers) {
  EXPECT_NO_THROW(check_managed_budget(GiB, 2 * GiB, 80 * GiB, 0, false, "x"));
  EXPECT_NO_THROW(check_managed_budget(2 * GiB, 2 * GiB, 80 * GiB, 0, false, "x"));
  try {
    check_managed_budget(3 * GiB, 2 * GiB, 80 * GiB, 0, false, "ferry managed allocator on device 0");
    FAIL() << "3 GiB accepted with 2 GiB free";
  } catch (const OutOfMemory& e) {
    const std::string m = e.what();
    EXPECT_TRUE(has(m, "ferry managed allocator on device 0")) << m;
    EXPECT_TRUE(has(m, "3 GiB")) << m;
    EXPECT_TRUE(has(m, std::to_string(3 * GiB) + " B")) << m;
    EXPECT_TRUE(has(m, "only 2 GiB")) << m;
    EXPECT_TRUE(has(m, "free")) << m;
    EXPECT_TRUE(has(m, "oversubscribe=1")) << m;
  }
}

TEST(ManagedBudget, CountsWhatFerryHoldsEvenWhereNotResident) {
  // Free memory says yes, but ferry already holds 70 GiB of (untouched)
  // managed memory on an 80 GiB device: 20 more would oversubscribe it.
  try {
    check_managed_budget(20 * GiB, 75 * GiB, 80 * GiB, 70 * GiB, false, "pool");
    FAIL();
  } catch (const OutOfMemory& e) {
    EXPECT_TRUE(has(e.what(), "already holds 70 GiB")) << e.what();
  }
  EXPECT_NO_THROW(check_managed_budget(10 * GiB, 75 * GiB, 80 * GiB, 70 * GiB, false, "pool"));
}

TEST(ManagedBudget, OversubscribeLetsEverythingThrough) {
  EXPECT_NO_THROW(check_managed_budget(500 * GiB, GiB, 80 * GiB, 79 * GiB, true, "x"));
}

}  // namespace
}  // namespace ferry
