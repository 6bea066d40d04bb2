// options_test.cpp — the option table and its strict parser.
#include "core/options.h"

#include <gtest/gtest.h>

#include <optional>
#include <set>
#include <string>

#include "core/error.h"
#include "pool/pool.h"

namespace ferry {
namespace {

using Env = std::vector<std::pair<std::string, std::string>>;

std::string error_of(const Env& env) {
  try {
    Options::parse(env);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(Options, DefaultsParseAndEveryRowIsDocumented) {
  Options o = Options::parse({});
  EXPECT_EQ(o.size("FERRY_CHUNK_SIZE"), 64u << 20);
  EXPECT_EQ(o.text("FERRY_HUGE_PAGES"), "auto");
  EXPECT_FALSE(o.boolean("FERRY_ZERO_RECYCLED"));
  std::set<std::string> names;
  for (const auto& s : option_table()) {
    EXPECT_TRUE(std::string(s.name).rfind("FERRY_", 0) == 0) << s.name;
    EXPECT_GT(std::string(s.doc).size(), 10u) << s.name;
    EXPECT_TRUE(names.insert(s.name).second) << "duplicate " << s.name;
  }
}

TEST(Options, ValuesFromEnvironmentOverrideDefaults) {
  Options o = Options::parse({{"FERRY_CHUNK_SIZE", "128MiB"},
                              {"FERRY_ZERO_RECYCLED", "yes"},
                              {"FERRY_HUGE_PAGES", "thp"},
                              {"FERRY_TOUCH_THREADS", " 7 "},
                              {"PATH", "/bin"}});
  EXPECT_EQ(o.size("FERRY_CHUNK_SIZE"), 128u << 20);
  EXPECT_TRUE(o.boolean("FERRY_ZERO_RECYCLED"));
  EXPECT_EQ(o.text("FERRY_HUGE_PAGES"), "thp");
  EXPECT_EQ(o.integer("FERRY_TOUCH_THREADS"), 7);
}

TEST(Options, UnknownKeyFailsQuotingIt) {
  std::string m = error_of({{"FERRY_CHUNKSIZE", "64M"}});
  EXPECT_NE(m.find("FERRY_CHUNKSIZE='64M'"), std::string::npos) << m;
  EXPECT_NE(m.find("unknown option"), std::string::npos) << m;
}

TEST(Options, BadValuesFailQuotingTheValue) {
  struct Case { const char* name; const char* value; const char* expect; };
  const Case cases[] = {
      {"FERRY_CHUNK_SIZE", "lots", "'lots'"},
      {"FERRY_CHUNK_SIZE", "64XB", "unknown unit"},
      {"FERRY_CHUNK_SIZE", "99999999999999999999", "too large"},
      {"FERRY_CHUNK_SIZE", "20000000T", "too large"},
      {"FERRY_CHUNK_SIZE", "", "not a size"},
      {"FERRY_ZERO_RECYCLED", "maybe", "'maybe'"},
      {"FERRY_TOUCH_THREADS", "4x", "expected an integer"},
      {"FERRY_HUGE_PAGES", "always", "expected one of auto|hugetlb|thp|off"},
      {"FERRY_FAULT_INJECT", "mmap", "missing ':'"},
  };
  for (const auto& c : cases) {
    std::string m = error_of({{c.name, c.value}});
    EXPECT_NE(m.find(c.expect), std::string::npos) << c.name << "=" << c.value << ": " << m;
    EXPECT_NE(m.find(c.name), std::string::npos) << m;
  }
}

TEST(Options, SizeUnits) {
  EXPECT_EQ(parse_size("4096", "x"), 4096u);
  EXPECT_EQ(parse_size("4k", "x"), 4096u);
  EXPECT_EQ(parse_size("2 MiB", "x"), 2u << 20);
  EXPECT_EQ(parse_size("1G", "x"), 1u << 30);
  EXPECT_EQ(parse_size("3tb", "x"), 3ull << 40);
  EXPECT_EQ(parse_size("0", "x"), 0u);
  EXPECT_THROW(parse_size("-1", "x"), InvalidArgument);
  EXPECT_THROW(parse_size("1.5G", "x"), InvalidArgument);
}

TEST(Options, GetterOfUnknownNameIsAnError) {
  Options o = Options::parse({});
  EXPECT_THROW(o.size("FERRY_NOPE"), InvalidArgument);
  EXPECT_THROW(o.boolean("FERRY_CHUNK_SIZE"), InvalidArgument);  // wrong type
}

TEST(Errors, FormatBytes) {
  EXPECT_EQ(format_bytes(17), "17 B");
  EXPECT_EQ(format_bytes(4096), "4 KiB");
  EXPECT_EQ(format_bytes(3u << 29), "1.50 GiB");
}

TEST(Errors, OsErrorCarriesErrnoAndMapsEnomemToOutOfMemory) {
  OsError e("mmap(64 MiB)", ENOMEM);
  EXPECT_EQ(e.error_number(), ENOMEM);
  EXPECT_EQ(e.status(), FERRY_ERROR_OUT_OF_MEMORY);
  EXPECT_NE(std::string(e.what()).find("mmap(64 MiB) failed"), std::string::npos);
  EXPECT_EQ(OsError("madvise", EINVAL).status(), FERRY_ERROR_OS);
}

// Issue 21, item 8: FERRY_CHUNK_SIZE=0, 3 and 2**64-1 passed the option table
// (ferry.check_options()) and were refused only by Pool(). One check serves both.
TEST(Options, ChunkSizesThatThePoolRefusesTheTableRefusesToo) {
  for (const char* v : {"0", "3", "18446744073709551615", "1MiB", "3MiB", "256TiB"}) {
    const std::string e = error_of({{"FERRY_CHUNK_SIZE", v}});
    EXPECT_NE(e.find("FERRY_CHUNK_SIZE='"), std::string::npos) << v << ": " << e;
    EXPECT_NE(e.find("multiple of 2 MiB"), std::string::npos) << v << ": " << e;
  }
  for (const char* v : {"2MiB", "64MiB", "1GiB"}) {
    const Options o = Options::parse({{"FERRY_CHUNK_SIZE", v}});
    EXPECT_NO_THROW(PoolOptions::from_options(o).validate()) << v;
  }
}

// The garbage-value sweep of every FERRY_* option (issue 21): negative, huge,
// non-numeric, empty, a directory, a device. Each value is refused with an
// InvalidArgument naming the option, or accepted; an accepted value must also
// pass the pool's own check (the two never disagree) and never crash.
TEST(Options, EveryOptionRefusesGarbageOrTheConsumersAcceptIt) {
  const char* garbage[] = {"-1", "-9223372036854775809", "99999999999999999999999", "18446744073709551616",
                           "abc", "", " ", "/tmp", "/dev/zero", "1e3", "0x10", "12abc", "\xff\xfe"};
  int refused = 0;
  for (const OptionSpec& spec : option_table()) {
    for (const char* v : garbage) {
      std::optional<Options> o;
      try {
        o = Options::parse({{spec.name, v}});
      } catch (const InvalidArgument& e) {
        ++refused;
        EXPECT_NE(std::string(e.what()).find(spec.name), std::string::npos) << spec.name << "='" << v << "': " << e.what();
        continue;
      } catch (const std::exception& e) {
        ADD_FAILURE() << spec.name << "='" << v << "': not an InvalidArgument: " << e.what();
        continue;
      }
      if (spec.type == OptionType::size || spec.type == OptionType::integer || spec.type == OptionType::boolean)
        ADD_FAILURE() << spec.name << "='" << v << "' was accepted";
      try {
        PoolOptions::from_options(*o).validate();
      } catch (const Error& e) {
        ADD_FAILURE() << spec.name << "='" << v << "': accepted by the table, refused by the pool: " << e.what();
      }
    }
  }
  EXPECT_GT(refused, 0);
}

}  // namespace
}  // namespace ferry
