// json_test.cpp — the strict JSON pull reader: what it accepts (values,
// escapes, UTF-8, whitespace) and, table-driven, every way it refuses, with the
// byte position in the message, whether the caller reads a value or skips it;
// duplicate keys found exactly, wherever they are; depth and value limits;
// counting ahead; random damage never crashes it.
#include "load/json.h"

#include <gtest/gtest.h>

#include <random>
#include <set>

#include "core/error.h"

namespace ferry::load {
namespace {

// The next value read by its kind, as a caller that keeps everything would,
// written back in a canonical form.
std::string read_value(JsonReader& json) {
  switch (json.peek()) {
    case JsonKind::object: {
      std::string out = "{";
      json.begin_object();
      for (std::string key; json.next_member(key);) out += key + ":" + read_value(json) + ";";
      return out + "}";
    }
    case JsonKind::array: {
      std::string out = "[";
      json.begin_array();
      while (json.next_item()) out += read_value(json) + ";";
      return out + "]";
    }
    case JsonKind::string: {
      std::string s;
      json.read_string(s);
      return "\"" + s + "\"";
    }
    case JsonKind::number: return std::string(json.read_number());
    case JsonKind::boolean: return json.read_bool() ? "true" : "false";
    case JsonKind::null: json.read_null(); return "null";
  }
  return "?";
}

std::string dump(std::string_view text) {
  JsonReader json(text);
  std::string v = read_value(json);
  json.finish();
  return v;
}

// The message for text read in full ("" when accepted), or only skipped.
std::string error_of(std::string_view text, bool skip = false, size_t max_values = kMaxJsonValues) {
  try {
    JsonReader json(text, "", max_values);
    if (skip)
      json.skip_value();
    else
      read_value(json);
    json.finish();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(Json, ReadsEveryKindOfValue) {
  const std::string text =
      " {\"a\": [1, 0, -2, 3.5, 1e3, 2E-2], \"b\": {\"c\": true, \"d\": false, \"e\": null},"
      " \"s\": \"x\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\ud83d\\ude00\u00e9\", \"\": [], \"o\": {}}\r\n\t ";
  JsonReader json(text);
  ASSERT_EQ(json.peek(), JsonKind::object);
  json.begin_object();
  std::string key, s;
  ASSERT_TRUE(json.next_member(key));
  EXPECT_EQ(key, "a");
  EXPECT_EQ(json.peek(), JsonKind::array);
  json.begin_array();
  std::vector<std::string> numbers;
  while (json.next_item()) {
    EXPECT_EQ(json.peek(), JsonKind::number);
    numbers.emplace_back(json.read_number());
  }
  EXPECT_EQ(numbers, (std::vector<std::string>{"1", "0", "-2", "3.5", "1e3", "2E-2"}));  // as written
  ASSERT_TRUE(json.next_member(key));
  EXPECT_EQ(key, "b");
  json.begin_object();
  ASSERT_TRUE(json.next_member(key));
  EXPECT_EQ(json.peek(), JsonKind::boolean);
  EXPECT_TRUE(json.read_bool());
  ASSERT_TRUE(json.next_member(key));
  EXPECT_FALSE(json.read_bool());
  ASSERT_TRUE(json.next_member(key));
  EXPECT_EQ(key, "e");
  EXPECT_EQ(json.peek(), JsonKind::null);
  json.read_null();
  EXPECT_FALSE(json.next_member(key));
  ASSERT_TRUE(json.next_member(key));
  EXPECT_EQ(json.peek(), JsonKind::string);
  json.read_string(s);
  EXPECT_EQ(s, "x\"\\/\b\f\n\r\t\u00e9\U0001F600\u00e9");
  ASSERT_TRUE(json.next_member(key));
  EXPECT_EQ(key, "");
  EXPECT_EQ(json.count_elements(), 0u);
  json.begin_array();
  EXPECT_FALSE(json.next_item());
  ASSERT_TRUE(json.next_member(key));
  json.skip_value();
  EXPECT_FALSE(json.next_member(key));
  json.finish();

  EXPECT_EQ(dump(text), "{a:[1;0;-2;3.5;1e3;2E-2;];b:{c:true;d:false;e:null;};s:\"x\"\\/\b\f\n\r\t\u00e9\U0001F600\u00e9\";"
                        ":[];o:{};}");
  for (const char* scalar : {"0", "-0.5e+7", "\"\"", "true", "false", "null", "[]", "{}"})
    EXPECT_EQ(error_of(scalar), "") << scalar;
}

TEST(Json, Uint64Limits) {
  EXPECT_EQ(json_uint64("0"), 0u);
  EXPECT_EQ(json_uint64("4096"), 4096u);
  EXPECT_EQ(json_uint64("18446744073709551615"), UINT64_MAX);
  EXPECT_FALSE(json_uint64("18446744073709551616"));
  EXPECT_FALSE(json_uint64("99999999999999999999999"));
  for (const char* not_one : {"-0", "-1", "1.0", "1e3", "1E3", ""}) EXPECT_FALSE(json_uint64(not_one)) << not_one;
}

struct Bad {
  const char* name;
  std::string text;
  const char* expect;  // substring of the message
};

TEST(Json, RefusesWithTheReasonAndPositionWhetherReadOrSkipped) {
  const Bad cases[] = {
      {"empty", "", "expected a value, found end of text"},
      {"only space", "   ", "found end of text"},
      {"trailing garbage", "{} x", "byte 3: unexpected 'x' after the value"},
      {"two values", "1 2", "after the value"},
      {"trailing comma array", "[1,]", "expected a value, found ']'"},
      {"trailing comma object", "{\"a\":1,}", "expected a key string"},
      {"leading comma", "[,1]", "byte 1: expected a value, found ','"},
      {"unquoted key", "{a:1}", "expected a key string, found 'a'"},
      {"missing colon", "{\"a\" 1}", "expected ':'"},
      {"missing value", "{\"a\":}", "byte 5: expected a value, found '}'"},
      {"missing comma", "[1 2]", "expected ',' or ']'"},
      {"unclosed object", "{\"a\":1", "expected ',' or '}'"},
      {"unclosed array", "[1", "expected ',' or ']'"},
      {"mismatched brackets", "[1}", "byte 2: expected ',' or ']' in an array, found '}'"},
      {"unterminated string", "\"abc", "unterminated string"},
      {"leading zero", "01", "leading zero"},
      {"negative leading zero", "[-012]", "byte 3: leading zero"},
      {"bare minus", "-", "expected a digit"},
      {"dot without digits", "1.", "digit after '.'"},
      {"exponent without digits", "1e", "digit in the exponent"},
      {"plus sign", "+1", "expected a value"},
      {"bad literal", "tru", "expected a value"},
      {"capital literal", "True", "expected a value"},
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
      {"bad UTF-8 in a key", std::string("{\"\xff\":1}"), "byte 2: invalid UTF-8 lead"},
      {"non-ASCII outside strings", std::string("\xc3\xa9"), "expected a value, found byte 0xc3"},
      {"duplicate key", "{\"a\":1,\"b\":2,\"a\":3}", "byte 13: duplicate key 'a'"},
      {"duplicate nested key", "{\"x\":{\"k\":1,\"k\":1}}", "byte 12: duplicate key 'k'"},
      {"duplicate in an array's object", "[{\"k\":1},{\"k\":1,\"j\":[],\"k\":{}}]", "byte 23: duplicate key 'k'"},
      {"duplicate spelt differently", "{\"\\u0061\":1,\"a\":2}", "byte 12: duplicate key 'a'"},
      {"first repeat reported", "{\"b\":1,\"a\":1,\"a\":1,\"b\":1}", "byte 13: duplicate key 'a'"},
      {"NUL byte", std::string("[1,\0]", 5), "expected a value, found byte 0x00"},
  };
  for (const Bad& c : cases) {
    const std::string msg = error_of(c.text);
    EXPECT_EQ(msg.rfind("invalid JSON at byte ", 0), 0u) << c.name << ": " << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.name << ": " << msg;
    EXPECT_EQ(error_of(c.text, true), msg) << c.name;  // a skipped value is checked the same
  }
}

TEST(Json, MessagesStartWithThePrefix) {
  try {
    JsonReader json("[1,", "f.json: ");
    json.skip_value();
    ADD_FAILURE() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "f.json: invalid JSON at byte 3: expected a value, found end of text");
  }
}

// Random keys from a small alphabet, some of them repeated: the reader
// refuses exactly the objects with a repeat, pointing where the first one is,
// in an object of its own or nested in an array or a skipped value.
TEST(Json, DuplicateKeysAreFoundExactly) {
  std::mt19937_64 rng(21);
  int refused = 0;
  for (int round = 0; round < 2000; ++round) {
    const size_t n = 1 + rng() % 40;
    std::string text = "[0,{", first;
    std::set<std::string> seen;
    size_t repeat_at = 0;  // where a key first appears again (0: nowhere)
    for (size_t i = 0; i < n; ++i) {
      std::string key;
      for (size_t len = rng() % 3; len > 0; --len) key += std::vector<std::string>{"a", "b", "\u00e9"}[rng() % 3];
      text += (i ? "," : "");
      if (!seen.insert(key).second && !repeat_at) {
        repeat_at = text.size();
        first = key;
      }
      std::string spelt;  // plainly or with \u escapes: the same key either way
      for (char c : key) spelt += (c == 'a' && rng() % 2) ? "\\u0061" : std::string(1, c);
      text += "\"" + spelt + "\":" + (rng() % 4 ? "1" : "{\"k\":[],\"l\":{}}");
    }
    text += "}]";
    const std::string expected =
        repeat_at ? "invalid JSON at byte " + std::to_string(repeat_at) + ": duplicate key " + quote_for_message(first)
                  : "";
    EXPECT_EQ(error_of(text), expected) << text;
    EXPECT_EQ(error_of(text, true), expected) << text;
    refused += !expected.empty();
  }
  EXPECT_GT(refused, 100);
  EXPECT_LT(refused, 1900);
}

TEST(Json, DepthAndValueLimits) {
  std::string ok(kMaxJsonDepth, '[');
  ok += std::string(kMaxJsonDepth, ']');
  EXPECT_EQ(error_of(ok), "");
  std::string deep(kMaxJsonDepth + 1, '[');
  deep += std::string(kMaxJsonDepth + 1, ']');
  EXPECT_EQ(error_of(deep), "invalid JSON at byte 64: nested deeper than 64 levels");
  EXPECT_EQ(error_of(deep, true), error_of(deep));
  // A scalar counts as a level too, as does an object.
  std::string deep_scalar = std::string(kMaxJsonDepth, '[') + "1" + std::string(kMaxJsonDepth, ']');
  EXPECT_NE(error_of(deep_scalar).find("nested deeper"), std::string::npos);
  std::string deep_objects;
  for (int i = 0; i <= kMaxJsonDepth; ++i) deep_objects += "{\"k\":";
  deep_objects += "1" + std::string(kMaxJsonDepth + 1, '}');
  EXPECT_NE(error_of(deep_objects, true).find("nested deeper"), std::string::npos);

  EXPECT_EQ(error_of("[0,0,0]", false, 4), "");
  EXPECT_EQ(error_of("[0,0,0,0]", false, 4), "invalid JSON at byte 7: more than 4 values");
  EXPECT_EQ(error_of("[0,0,0,0]", true, 4), "invalid JSON at byte 7: more than 4 values");
  EXPECT_EQ(error_of("{\"a\":0,\"b\":0,\"c\":0}", false, 4), "");  // keys are not values
}

TEST(Json, CountingLooksAheadWithoutConsumingOrSpendingTheBudget) {
  JsonReader json("{\"a\":[1,[2,3],{\"x\":4},\"s\"],\"b\":{\"p\":1,\"q\":[]},\"c\":[]}", "", 13);
  EXPECT_EQ(json.count_elements(), 3u);
  json.begin_object();
  std::string key;
  ASSERT_TRUE(json.next_member(key));
  EXPECT_EQ(json.count_elements(), 4u);
  EXPECT_EQ(json.count_elements(), 4u);
  EXPECT_EQ(read_value(json), "[1;[2;3;];{x:4;};\"s\";]");
  ASSERT_TRUE(json.next_member(key));
  EXPECT_EQ(json.count_elements(), 2u);
  json.skip_value();
  ASSERT_TRUE(json.next_member(key));
  EXPECT_EQ(json.count_elements(), 0u);
  json.skip_value();
  EXPECT_FALSE(json.next_member(key));
  json.finish();  // 13 values: counting spent none of them

  // What is counted is checked in full: a duplicate inside is refused there.
  JsonReader dup("[{\"k\":1,\"k\":2}]");
  EXPECT_THROW(dup.count_elements(), InvalidArgument);
}

TEST(Json, RandomDamageNeverCrashesAndSkippingAgreesWithReading) {
  const std::string good =
      "{\"__metadata__\":{\"format\":\"pt\"},\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],"
      "\"data_offsets\":[0,12],\"x\":[true,false,null,-1.5e-3,{}]},\"n\\u00e9\":{\"dtype\":\"F32\",\"shape\":[],"
      "\"data_offsets\":[12,16]}}";
  ASSERT_EQ(error_of(good), "");
  std::mt19937_64 rng(7);
  int accepted = 0;
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
    const std::string read = error_of(t);
    EXPECT_EQ(error_of(t, true), read) << t;
    accepted += read.empty();
  }
  EXPECT_GT(accepted, 0);
  for (size_t n = 0; n < good.size(); ++n) EXPECT_NE(error_of(good.substr(0, n)), "") << n;
}

TEST(Json, QuoteForMessage) {
  EXPECT_EQ(quote_for_message("ab"), "'ab'");
  EXPECT_EQ(quote_for_message(std::string("a\nb\x7f", 4)), "'a\\x0ab\\x7f'");
  EXPECT_EQ(quote_for_message(std::string(200, 'x'), 4), "'xxxx...'");
}

TEST(Json, KindNames) {
  EXPECT_STREQ(json_kind_name(JsonKind::null), "null");
  EXPECT_STREQ(json_kind_name(JsonKind::boolean), "a boolean");
  EXPECT_STREQ(json_kind_name(JsonKind::number), "a number");
  EXPECT_STREQ(json_kind_name(JsonKind::string), "a string");
  EXPECT_STREQ(json_kind_name(JsonKind::array), "an array");
  EXPECT_STREQ(json_kind_name(JsonKind::object), "an object");
}

}  // namespace
}  // namespace ferry::load
