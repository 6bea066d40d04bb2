// json.cpp — recursive descent over the RFC 8259 grammar, one byte at a time.
#include "load/json.h"

#include <cstdio>
#include <unordered_set>

#include "core/error.h"

namespace ferry::load {
namespace {

class Parser {
 public:
  Parser(std::string_view text, size_t max_values) : s_(text), max_values_(max_values) {}

  JsonValue document() {
    skip_space();
    JsonValue v = value(0);
    skip_space();
    if (pos_ != s_.size()) fail("unexpected " + describe_here() + " after the value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw InvalidArgument("invalid JSON at byte " + std::to_string(pos_) + ": " + what);
  }

  std::string describe_here() const {
    if (pos_ >= s_.size()) return "end of text";
    unsigned char c = static_cast<unsigned char>(s_[pos_]);
    char buf[32];
    if (c >= 0x20 && c < 0x7f)
      std::snprintf(buf, sizeof buf, "'%c'", c);
    else
      std::snprintf(buf, sizeof buf, "byte 0x%02x", c);
    return buf;
  }

  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return at_end() ? '\0' : s_[pos_]; }  // '\0' at the end: no token starts with it

  void skip_space() {
    while (!at_end() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }

  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "', found " + describe_here());
    ++pos_;
  }

  JsonValue value(int depth) {
    if (depth >= kMaxJsonDepth) fail("nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    if (++values_ > max_values_) fail("more than " + std::to_string(max_values_) + " values");
    switch (peek()) {
      case '{': return object(depth);
      case '[': return array(depth);
      case '"': {
        JsonValue v;
        v.kind = JsonValue::Kind::string;
        v.text = string();
        return v;
      }
      case 't': return literal("true", JsonValue::Kind::boolean, true);
      case 'f': return literal("false", JsonValue::Kind::boolean, false);
      case 'n': return literal("null", JsonValue::Kind::null, false);
      default:
        if (peek() == '-' || (peek() >= '0' && peek() <= '9')) return number();
        fail("expected a value, found " + describe_here());
    }
  }

  JsonValue literal(std::string_view word, JsonValue::Kind kind, bool b) {
    if (s_.substr(pos_, word.size()) != word) fail("expected a value, found " + describe_here());
    pos_ += word.size();
    JsonValue v;
    v.kind = kind;
    v.boolean = b;
    return v;
  }

  JsonValue object(int depth) {
    JsonValue v;
    v.kind = JsonValue::Kind::object;
    expect('{');
    skip_space();
    if (peek() == '}') {
      ++pos_;
      return v;
    }
    std::unordered_set<std::string> keys;  // v.find() would make a large header quadratic
    for (;;) {
      skip_space();
      if (peek() != '"') fail("expected a key string, found " + describe_here());
      size_t key_at = pos_;
      std::string key = string();
      if (!keys.insert(key).second) {
        pos_ = key_at;
        fail("duplicate key " + quote_for_message(key));
      }
      skip_space();
      expect(':');
      skip_space();
      JsonValue member = value(depth + 1);
      v.members.push_back(JsonMember{std::move(key), std::move(member)});
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == '}') {
        ++pos_;
        return v;
      }
      fail("expected ',' or '}' in an object, found " + describe_here());
    }
  }

  JsonValue array(int depth) {
    JsonValue v;
    v.kind = JsonValue::Kind::array;
    expect('[');
    skip_space();
    if (peek() == ']') {
      ++pos_;
      return v;
    }
    for (;;) {
      skip_space();
      v.items.push_back(value(depth + 1));
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == ']') {
        ++pos_;
        return v;
      }
      fail("expected ',' or ']' in an array, found " + describe_here());
    }
  }

  JsonValue number() {
    size_t start = pos_;
    if (peek() == '-') ++pos_;
    if (peek() == '0') {
      ++pos_;
      if (peek() >= '0' && peek() <= '9') fail("leading zero in a number");
    } else if (peek() >= '1' && peek() <= '9') {
      while (peek() >= '0' && peek() <= '9') ++pos_;
    } else {
      fail("expected a digit, found " + describe_here());
    }
    if (peek() == '.') {
      ++pos_;
      if (!(peek() >= '0' && peek() <= '9')) fail("expected a digit after '.'");
      while (peek() >= '0' && peek() <= '9') ++pos_;
    }
    if ((peek() == 'e' || peek() == 'E')) {
      ++pos_;
      if ((peek() == '+' || peek() == '-')) ++pos_;
      if (!(peek() >= '0' && peek() <= '9')) fail("expected a digit in the exponent");
      while (peek() >= '0' && peek() <= '9') ++pos_;
    }
    JsonValue v;
    v.kind = JsonValue::Kind::number;
    v.text = std::string(s_.substr(start, pos_ - start));
    return v;
  }

  unsigned hex4() {
    if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
    unsigned u = 0;
    for (int i = 0; i < 4; ++i) {
      char c = s_[pos_++];
      u <<= 4;
      if (c >= '0' && c <= '9') u |= static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f') u |= static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') u |= static_cast<unsigned>(c - 'A' + 10);
      else {
        --pos_;
        fail("bad hex digit in a \\u escape");
      }
    }
    return u;
  }

  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  void escape(std::string& out) {
    ++pos_;  // the backslash
    if (at_end()) fail("truncated escape");
    char c = s_[pos_++];
    switch (c) {
      case '"': out += '"'; return;
      case '\\': out += '\\'; return;
      case '/': out += '/'; return;
      case 'b': out += '\b'; return;
      case 'f': out += '\f'; return;
      case 'n': out += '\n'; return;
      case 'r': out += '\r'; return;
      case 't': out += '\t'; return;
      case 'u': break;
      default:
        --pos_;
        fail("unknown escape \\" + describe_here());
    }
    unsigned cp = hex4();
    if (cp >= 0xDC00 && cp <= 0xDFFF) fail("lone low surrogate in a \\u escape");
    if (cp >= 0xD800 && cp <= 0xDBFF) {
      if (s_.substr(pos_, 2) != "\\u") fail("high surrogate not followed by a low surrogate");
      pos_ += 2;
      unsigned lo = hex4();
      if (lo < 0xDC00 || lo > 0xDFFF) fail("high surrogate not followed by a low surrogate");
      cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
    }
    append_utf8(out, cp);
  }

  // One UTF-8 sequence starting at pos_ (a byte >= 0x80), copied to out.
  void utf8(std::string& out) {
    unsigned char c = static_cast<unsigned char>(s_[pos_]);
    int extra;
    unsigned cp;
    if (c >= 0xC2 && c <= 0xDF) extra = 1, cp = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF) extra = 2, cp = c & 0x0F;
    else if (c >= 0xF0 && c <= 0xF4) extra = 3, cp = c & 0x07;
    else fail("invalid UTF-8 lead " + describe_here());
    if (pos_ + static_cast<size_t>(extra) >= s_.size()) fail("truncated UTF-8 sequence");
    for (int i = 1; i <= extra; ++i) {
      unsigned char d = static_cast<unsigned char>(s_[pos_ + i]);
      if ((d & 0xC0) != 0x80) {
        pos_ += i;
        fail("invalid UTF-8 continuation " + describe_here());
      }
      cp = (cp << 6) | (d & 0x3F);
    }
    static const unsigned kMin[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[extra]) fail("overlong UTF-8 sequence");
    if (cp >= 0xD800 && cp <= 0xDFFF) fail("UTF-8 encoded surrogate");
    if (cp > 0x10FFFF) fail("UTF-8 code point past U+10FFFF");
    out.append(s_.substr(pos_, static_cast<size_t>(extra) + 1));
    pos_ += static_cast<size_t>(extra) + 1;
  }

  std::string string() {
    expect('"');
    std::string out;
    for (;;) {
      if (at_end()) fail("unterminated string");
      unsigned char c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (c == '\\') {
        escape(out);
      } else if (c < 0x20) {
        fail("control character " + describe_here() + " in a string");
      } else if (c < 0x80) {
        out += static_cast<char>(c);
        ++pos_;
      } else {
        utf8(out);
      }
    }
  }

  std::string_view s_;
  size_t pos_ = 0;
  size_t max_values_;
  size_t values_ = 0;
};

}  // namespace

const JsonValue* JsonValue::find(std::string_view key) const {
  for (const auto& [k, v] : members)
    if (k == key) return &v;
  return nullptr;
}

std::optional<uint64_t> JsonValue::as_uint64() const {
  if (kind != Kind::number || text.empty()) return std::nullopt;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;  // sign, fraction or exponent
    uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

const char* json_kind_name(JsonValue::Kind kind) noexcept {
  switch (kind) {
    case JsonValue::Kind::null: return "null";
    case JsonValue::Kind::boolean: return "a boolean";
    case JsonValue::Kind::number: return "a number";
    case JsonValue::Kind::string: return "a string";
    case JsonValue::Kind::array: return "an array";
    case JsonValue::Kind::object: return "an object";
  }
  return "?";
}

JsonValue parse_json(std::string_view text, size_t max_values) { return Parser(text, max_values).document(); }

std::string quote_for_message(std::string_view s, size_t limit) {
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < limit; ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (s.size() > limit) out += "...";
  return out + "'";
}

}  // namespace ferry::load
