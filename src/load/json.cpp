// json.cpp — a pull reader over the RFC 8259 grammar, one byte at a time.
#include "load/json.h"

#include <algorithm>
#include <cstdio>
#include <functional>

#include "core/error.h"

namespace ferry::load {
namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }

void append_utf8(std::string& out, unsigned cp) {
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

}  // namespace

JsonReader::JsonReader(std::string_view text, std::string message_prefix, size_t max_values)
    : s_(text), prefix_(std::move(message_prefix)), max_values_(max_values) {}

void JsonReader::fail_at(size_t at, const std::string& what) const {
  throw InvalidArgument(prefix_ + "invalid JSON at byte " + std::to_string(at) + ": " + what);
}

std::string JsonReader::describe_here() const {
  if (pos_ >= s_.size()) return "end of text";
  unsigned char c = static_cast<unsigned char>(s_[pos_]);
  char buf[32];
  if (c >= 0x20 && c < 0x7f)
    std::snprintf(buf, sizeof buf, "'%c'", c);
  else
    std::snprintf(buf, sizeof buf, "byte 0x%02x", c);
  return buf;
}

void JsonReader::skip_space() {
  while (here() == ' ' || here() == '\t' || here() == '\n' || here() == '\r') ++pos_;
}

void JsonReader::expect(char c) {
  if (here() != c) fail(std::string("expected '") + c + "', found " + describe_here());
  ++pos_;
}

JsonKind JsonReader::peek() {
  skip_space();
  const std::string_view rest = s_.substr(pos_);
  switch (here()) {
    case '{': return JsonKind::object;
    case '[': return JsonKind::array;
    case '"': return JsonKind::string;
    case 't':
      if (rest.starts_with("true")) return JsonKind::boolean;
      break;
    case 'f':
      if (rest.starts_with("false")) return JsonKind::boolean;
      break;
    case 'n':
      if (rest.starts_with("null")) return JsonKind::null;
      break;
    default:
      if (here() == '-' || is_digit(here())) return JsonKind::number;
  }
  fail("expected a value, found " + describe_here());
}

// Every value passes here first.
void JsonReader::start_value() {
  skip_space();
  if (open_.size() >= static_cast<size_t>(kMaxJsonDepth))
    fail("nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  if (++values_ > max_values_) fail("more than " + std::to_string(max_values_) + " values");
}

void JsonReader::begin_object() {
  start_value();
  expect('{');
  open_.push_back({.object = true, .first_key = keys_.size()});
}

void JsonReader::begin_array() {
  start_value();
  expect('[');
  open_.push_back({.object = false});
}

// Before each member or item of the innermost container: true when one
// follows, false when `close` ends the container (consumed).
bool JsonReader::next_element(char close, const char* in) {
  skip_space();
  Container& c = open_.back();
  if (here() == close) {
    ++pos_;
    return false;
  }
  if (c.empty) {
    c.empty = false;
    return true;
  }
  if (here() != ',') fail(std::string("expected ',' or '") + close + "' in " + in + ", found " + describe_here());
  ++pos_;
  return true;
}

bool JsonReader::next_member(std::string& key) {
  if (!next_element('}', "an object")) {
    end_object();
    return false;
  }
  skip_space();
  if (here() != '"') fail("expected a key string, found " + describe_here());
  const size_t at = pos_;
  key.clear();
  decode_string(&key);
  keys_.push_back({std::hash<std::string_view>{}(key), at});
  skip_space();
  expect(':');
  return true;
}

bool JsonReader::next_item() {
  if (next_element(']', "an array")) return true;
  open_.pop_back();
  return false;
}

void JsonReader::end_object() {
  const size_t first = open_.back().first_key;
  check_unique_keys(first);
  keys_.resize(first);
  open_.pop_back();
}

// Sorted by (hash, key, position), equal keys lie side by side, each one's
// first appearance first. Keys are decoded again only where hashes are equal:
// an exact check, whatever collisions the text was crafted to have.
void JsonReader::check_unique_keys(size_t first) {
  const auto begin = keys_.begin() + static_cast<std::ptrdiff_t>(first), end = keys_.end();
  if (end - begin < 2) return;
  std::string a, b;
  std::sort(begin, end, [&](const KeyMark& x, const KeyMark& y) {
    if (x.hash != y.hash) return x.hash < y.hash;
    decode_at(x.at, a);
    decode_at(y.at, b);
    if (int c = a.compare(b)) return c < 0;
    return x.at < y.at;
  });
  size_t repeat = SIZE_MAX;  // the first place where a key appears again
  for (auto it = begin; it + 1 != end; ++it) {
    if (it[0].hash != it[1].hash || it[1].at > repeat) continue;
    decode_at(it[0].at, a);
    decode_at(it[1].at, b);
    if (a == b) repeat = it[1].at;
  }
  if (repeat == SIZE_MAX) return;
  decode_at(repeat, a);
  fail_at(repeat, "duplicate key " + quote_for_message(a));
}

// The string at `at`, read before (so known to be valid) and decoded again.
void JsonReader::decode_at(size_t at, std::string& out) {
  const size_t pos = pos_;
  pos_ = at;
  out.clear();
  decode_string(&out);
  pos_ = pos;
}

void JsonReader::read_string(std::string& out) {
  start_value();
  out.clear();
  decode_string(&out);
}

std::string_view JsonReader::read_number() {
  start_value();
  const size_t start = pos_;
  if (here() == '-') ++pos_;
  if (here() == '0') {
    ++pos_;
    if (is_digit(here())) fail("leading zero in a number");
  } else if (is_digit(here())) {
    while (is_digit(here())) ++pos_;
  } else {
    fail("expected a digit, found " + describe_here());
  }
  if (here() == '.') {
    ++pos_;
    if (!is_digit(here())) fail("expected a digit after '.'");
    while (is_digit(here())) ++pos_;
  }
  if (here() == 'e' || here() == 'E') {
    ++pos_;
    if (here() == '+' || here() == '-') ++pos_;
    if (!is_digit(here())) fail("expected a digit in the exponent");
    while (is_digit(here())) ++pos_;
  }
  return s_.substr(start, pos_ - start);
}

bool JsonReader::read_bool() {
  start_value();
  for (bool b : {true, false}) {
    const std::string_view word = b ? "true" : "false";
    if (s_.substr(pos_).starts_with(word)) {
      pos_ += word.size();
      return b;
    }
  }
  fail("expected true or false, found " + describe_here());
}

void JsonReader::read_null() {
  start_value();
  if (!s_.substr(pos_).starts_with("null")) fail("expected null, found " + describe_here());
  pos_ += 4;
}

void JsonReader::skip_value() {
  const size_t depth = open_.size();
  do {
    switch (peek()) {
      case JsonKind::object: begin_object(); break;
      case JsonKind::array: begin_array(); break;
      case JsonKind::string:
        start_value();
        decode_string(nullptr);
        break;
      case JsonKind::number: read_number(); break;
      case JsonKind::boolean: read_bool(); break;
      case JsonKind::null: read_null(); break;
    }
    // Close what ends here, up to the next member or item still to read.
    while (open_.size() > depth && !(open_.back().object ? next_member(scratch_) : next_item())) {
    }
  } while (open_.size() > depth);
}

size_t JsonReader::count_elements() {
  const size_t pos = pos_, values = values_;
  size_t n = 0;
  if (peek() == JsonKind::object) {
    begin_object();
    for (; next_member(scratch_); ++n) skip_value();
  } else {
    begin_array();
    for (; next_item(); ++n) skip_value();
  }
  pos_ = pos;
  values_ = values;
  return n;
}

void JsonReader::finish() {
  skip_space();
  if (pos_ != s_.size()) fail("unexpected " + describe_here() + " after the value");
}

unsigned JsonReader::hex4() {
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

void JsonReader::escape(std::string* out) {
  ++pos_;  // the backslash
  if (pos_ >= s_.size()) fail("truncated escape");
  char c = s_[pos_++];
  char plain;
  switch (c) {
    case '"': plain = '"'; break;
    case '\\': plain = '\\'; break;
    case '/': plain = '/'; break;
    case 'b': plain = '\b'; break;
    case 'f': plain = '\f'; break;
    case 'n': plain = '\n'; break;
    case 'r': plain = '\r'; break;
    case 't': plain = '\t'; break;
    case 'u': plain = 0; break;
    default:
      --pos_;
      fail("unknown escape \\" + describe_here());
  }
  if (c != 'u') {
    if (out) *out += plain;
    return;
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
  if (out) append_utf8(*out, cp);
}

// One UTF-8 sequence starting at pos_ (a byte >= 0x80), copied to out.
void JsonReader::utf8(std::string* out) {
  unsigned char c = static_cast<unsigned char>(s_[pos_]);
  int extra;
  unsigned cp;
  if (c >= 0xC2 && c <= 0xDF) extra = 1, cp = c & 0x1F;
  else if (c >= 0xE0 && c <= 0xEF) extra = 2, cp = c & 0x0F;
  else if (c >= 0xF0 && c <= 0xF4) extra = 3, cp = c & 0x07;
  else fail("invalid UTF-8 lead " + describe_here());
  if (pos_ + static_cast<size_t>(extra) >= s_.size()) fail("truncated UTF-8 sequence");
  for (int i = 1; i <= extra; ++i) {
    unsigned char d = static_cast<unsigned char>(s_[pos_ + static_cast<size_t>(i)]);
    if ((d & 0xC0) != 0x80) {
      pos_ += static_cast<size_t>(i);
      fail("invalid UTF-8 continuation " + describe_here());
    }
    cp = (cp << 6) | (d & 0x3F);
  }
  static const unsigned kMin[4] = {0, 0x80, 0x800, 0x10000};
  if (cp < kMin[extra]) fail("overlong UTF-8 sequence");
  if (cp >= 0xD800 && cp <= 0xDFFF) fail("UTF-8 encoded surrogate");
  if (cp > 0x10FFFF) fail("UTF-8 code point past U+10FFFF");
  if (out) out->append(s_.substr(pos_, static_cast<size_t>(extra) + 1));
  pos_ += static_cast<size_t>(extra) + 1;
}

void JsonReader::decode_string(std::string* out) {
  expect('"');
  for (;;) {
    if (pos_ >= s_.size()) fail("unterminated string");
    unsigned char c = static_cast<unsigned char>(s_[pos_]);
    if (c == '"') {
      ++pos_;
      return;
    }
    if (c == '\\') {
      escape(out);
    } else if (c < 0x20) {
      fail("control character " + describe_here() + " in a string");
    } else if (c < 0x80) {
      // A run of plain ASCII at once: most of a header's text.
      const size_t start = pos_;
      while (pos_ < s_.size() && static_cast<unsigned char>(s_[pos_]) >= 0x20 &&
             static_cast<unsigned char>(s_[pos_]) < 0x80 && s_[pos_] != '"' && s_[pos_] != '\\')
        ++pos_;
      if (out) out->append(s_.substr(start, pos_ - start));
    } else {
      utf8(out);
    }
  }
}

std::optional<uint64_t> json_uint64(std::string_view number) noexcept {
  if (number.empty()) return std::nullopt;
  uint64_t v = 0;
  for (char c : number) {
    if (!is_digit(c)) return std::nullopt;  // sign, fraction or exponent
    uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

const char* json_kind_name(JsonKind kind) noexcept {
  switch (kind) {
    case JsonKind::null: return "null";
    case JsonKind::boolean: return "a boolean";
    case JsonKind::number: return "a number";
    case JsonKind::string: return "a string";
    case JsonKind::array: return "an array";
    case JsonKind::object: return "an object";
  }
  return "?";
}

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
