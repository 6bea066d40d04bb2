// json_test.cpp — the strict JSON reader: what it accepts (values, escapes,
// UTF-8, whitespace) and, table-driven, every way it refuses, with the byte
// position in the message; random damage never crashes it.
#include "load/json.h"

#include <gtest/gtest.h>

#include <random>

#include "core/error.h"

namespace ferry::load {
namespace {

std::string error_of(std::string_view text) {
  try {
    parse_json(text);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(Json, ParsesEveryKindOfValue) {
  JsonValue v = parse_json(
      " {\"a\": [1, 0, -2, 3.5, 1e3, 2E-2], \"b\": {\"c\": true, \"d\": false, \"e\": null},"
      " \"s\": \"x\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\ud83d\\ude00\u00e9\"}\r\n\t ");
  ASSERT_EQ(v.kind, JsonValue::Kind::object);
  ASSERT_EQ(v.members.size(), 3u);
  const JsonValue* a = v.find("a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->items.size(), 6u);
  EXPECT_EQ(a->items[0].as_uint64(), 1u);
  EXPECT_EQ(a->items[1].as_uint64(), 0u);
  EXPECT_FALSE(a->items[2].as_uint64());  // negative
  EXPECT_FALSE(a->items[3].as_uint64());  // fraction
  EXPECT_FALSE(a->items[4].as_uint64());  // exponent
  EXPECT_EQ(a->items[5].text, "2E-2");
  const JsonValue* b = v.find("b");
  EXPECT_TRUE(b->find("c")->boolean);
  EXPECT_EQ(b->find("d")->kind, JsonValue::Kind::boolean);
  EXPECT_FALSE(b->find("d")->boolean);
  EXPECT_EQ(b->find("e")->kind, JsonValue::Kind::null);
  EXPECT_EQ(v.find("s")->text, "x\"\\/\b\f\n\r\t\u00e9\U0001F600\u00e9");
  EXPECT_EQ(v.find("missing"), nullptr);
  EXPECT_EQ(v.members[0].key, "a");  // file order kept
  EXPECT_EQ(v.members[2].key, "s");
}

TEST(Json, Uint64Limits) {
  EXPECT_EQ(parse_json("18446744073709551615").as_uint64(), UINT64_MAX);
  EXPECT_FALSE(parse_json("18446744073709551616").as_uint64());
  EXPECT_FALSE(parse_json("-0").as_uint64());
  EXPECT_EQ(parse_json("[]").kind, JsonValue::Kind::array);
  EXPECT_EQ(parse_json("{}").kind, JsonValue::Kind::object);
}

struct Bad {
  const char* name;
  std::string text;
  const char* expect;  // substring of the message
};

TEST(Json, RefusesWithTheReasonAndPosition) {
  const Bad cases[] = {
      {"empty", "", "expected a value, found end of text"},
      {"only space", "   ", "found end of text"},
      {"trailing garbage", "{} x", "byte 3: unexpected 'x' after the value"},
      {"two values", "1 2", "after the value"},
      {"trailing comma array", "[1,]", "expected a value, found ']'"},
      {"trailing comma object", "{\"a\":1,}", "expected a key string"},
      {"unquoted key", "{a:1}", "expected a key string, found 'a'"},
      {"missing colon", "{\"a\" 1}", "expected ':'"},
      {"missing comma", "[1 2]", "expected ',' or ']'"},
      {"unclosed object", "{\"a\":1", "expected ',' or '}'"},
      {"unclosed array", "[1", "expected ',' or ']'"},
      {"unterminated string", "\"abc", "unterminated string"},
      {"leading zero", "01", "leading zero"},
      {"bare minus", "-", "expected a digit"},
      {"dot without digits", "1.", "digit after '.'"},
      {"exponent without digits", "1e", "digit in the exponent"},
      {"plus sign", "+1", "expected a value"},
      {"bad literal", "tru", "expected a value"},
      {"NaN", "NaN", "expected a value"},
      {"comment", "// x\n1", "expected a value"},
      {"single quotes", "'a'", "expected a value"},
      {"control char", std::string("\"a\x01\""), "control character byte 0x01"},
      {"raw newline", "\"a\nb\"", "control character"},
      {"bad escape", "\"\\x\"", "unknown escape"},
      {"bad hex in unicode escape", "\"\\u12zz\"", "bad hex digit"},
      {"truncated unicode escape", "\"\\u1", "truncated \\u escape"},
      {"lone low surrogate", "\"\\udc00\"", "lone low surrogate"},
      {"lone high surrogate", "\"\\ud800x\"", "high surrogate not followed"},
      {"high then non-low", "\"\\ud800\\u0041\"", "high surrogate not followed"},
      {"bad UTF-8 lead", std::string("\"\xff\""), "invalid UTF-8 lead"},
      {"overlong UTF-8", std::string("\"\xc0\xaf\""), "invalid UTF-8 lead"},
      {"overlong 3-byte", std::string("\"\xe0\x80\xaf\""), "overlong"},
      {"UTF-8 surrogate", std::string("\"\xed\xa0\x80\""), "encoded surrogate"},
      {"past U+10FFFF", std::string("\"\xf4\x90\x80\x80\""), "past U+10FFFF"},
      {"bad continuation", std::string("\"\xc3\x28\""), "invalid UTF-8 continuation"},
      {"truncated UTF-8", std::string("\"\xe2\x82"), "truncated UTF-8"},
      {"non-ASCII outside strings", std::string("\xc3\xa9"), "expected a value, found byte 0xc3"},
      {"duplicate key", "{\"a\":1,\"b\":2,\"a\":3}", "byte 13: duplicate key 'a'"},
      {"duplicate nested key", "{\"x\":{\"k\":1,\"k\":1}}", "duplicate key 'k'"},
      {"NUL byte", std::string("[1,\0]", 5), "expected a value, found byte 0x00"},
  };
  for (const Bad& c : cases) {
    std::string msg = error_of(c.text);
    EXPECT_NE(msg.find("invalid JSON at byte "), std::string::npos) << c.name << ": " << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.name << ": " << msg;
  }
}

TEST(Json, DepthAndSizeLimits) {
  std::string ok(kMaxJsonDepth, '[');
  ok += std::string(kMaxJsonDepth, ']');
  EXPECT_NO_THROW(parse_json(ok));
  std::string deep(kMaxJsonDepth + 1, '[');
  deep += std::string(kMaxJsonDepth + 1, ']');
  EXPECT_NE(error_of(deep).find("nested deeper than 64 levels"), std::string::npos);
  EXPECT_NO_THROW(parse_json("[0,0,0]", 4));
  try {
    parse_json("[0,0,0,0]", 4);
    ADD_FAILURE() << "no error past the value budget";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("more than 4 values"), std::string::npos) << e.what();
  }
}

TEST(Json, RandomDamageNeverCrashes) {
  const std::string good =
      "{\"__metadata__\":{\"format\":\"pt\"},\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],"
      "\"data_offsets\":[0,12]},\"n\\u00e9\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[12,16]}}";
  ASSERT_NO_THROW(parse_json(good));
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20000; ++i) {
    std::string t = good;
    int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      size_t at = rng() % t.size();
      switch (rng() % 3) {
        case 0: t[at] = static_cast<char>(rng()); break;
        case 1: t.erase(at, 1 + rng() % 8); break;
        default: t.insert(at, 1, "{}[],:\"\\0-eE."[rng() % 13]);
      }
      if (t.empty()) t = "x";
    }
    try {
      parse_json(t);
    } catch (const InvalidArgument&) {
    }
  }
  for (size_t n = 0; n < good.size(); ++n) EXPECT_THROW(parse_json(good.substr(0, n)), InvalidArgument) << n;
}

TEST(Json, QuoteForMessage) {
  EXPECT_EQ(quote_for_message("ab"), "'ab'");
  EXPECT_EQ(quote_for_message(std::string("a\nb\x7f", 4)), "'a\\x0ab\\x7f'");
  EXPECT_EQ(quote_for_message(std::string(200, 'x'), 4), "'xxxx...'");
}

}  // namespace
}  // namespace ferry::load
