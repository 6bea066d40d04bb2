// json.h — a small strict JSON reader for the files a checkpoint loader meets:
// safetensors headers and shard indexes (model.safetensors.index.json).
//
// Strict RFC 8259: UTF-8 only (overlong forms, surrogates and code points past
// U+10FFFF are refused), no trailing commas, no comments, no leading zeros, no
// control characters in strings, nothing but whitespace after the value, and
// no duplicate key in any object, skipped ones included (the RFC allows them;
// a checkpoint whose header names a tensor twice is damaged). Nesting is
// limited (kMaxJsonDepth) so that hostile input cannot exhaust the stack, and
// so is the number of values (kMaxJsonValues), which bounds what a caller
// keeps of them.
//
// A pull reader: the caller asks for the value it expects next and keeps what
// it needs, so no tree is built (one was ~88 bytes a value: a 20 MB header of
// "0,0,0,..." took 1.4 GB). What the reader holds is bounded by the text: 16
// bytes per key of each open object (its hash and where it is: duplicates are
// found by sorting them when the object ends, so a key costs no node and no
// copy, and crafted hash collisions cost time, not a wrong answer), one frame
// per open container, and the string being decoded.
//
//   JsonReader json(text, "m.safetensors: header: ");
//   json.begin_object();
//   for (std::string key; json.next_member(key);)
//     if (key == "n") n = json_uint64(json.read_number()); else json.skip_value();
//   json.finish();
//
// Errors: InvalidArgument "<prefix>invalid JSON at byte N: ..."; duplicate
// keys are found when their object ends, and N is where a key first appears
// again.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::load {

constexpr int kMaxJsonDepth = 64;
constexpr size_t kMaxJsonValues = 10'000'000;  // ~1M tensors' entries

enum class JsonKind { null, boolean, number, string, array, object };

const char* json_kind_name(JsonKind kind) noexcept;  // "a string", "an array", ...

class JsonReader {
 public:
  // message_prefix starts every error message (callers name the file there);
  // max_values: the value budget (tests use a small one).
  explicit JsonReader(std::string_view text, std::string message_prefix = "", size_t max_values = kMaxJsonValues);

  // The kind of the next value, from its first byte (true, false and null in
  // full). Refuses text that starts no value.
  JsonKind peek();

  // An object: begin_object(), then while next_member(key) read or skip the
  // member's value. next_member is false at the closing '}', where the
  // object's keys are checked for duplicates.
  void begin_object();
  bool next_member(std::string& key);
  // An array: begin_array(), then while next_item() read or skip the item.
  void begin_array();
  bool next_item();

  void read_string(std::string& out);  // decoded
  std::string_view read_number();      // as written (a view into the text)
  bool read_bool();
  void read_null();
  // The next value, checked as thoroughly as if it were read.
  void skip_value();

  // The items of the array, or the members of the object, that comes next:
  // checked in full but not consumed (read it next). A caller that keeps them
  // all reserves room for that many: a vector that doubles holds up to twice
  // its contents, and three times while it copies.
  size_t count_elements();

  // Nothing but whitespace follows the value.
  void finish();

 private:
  struct Container {
    bool object;
    bool empty = true;     // no member or item read yet
    size_t first_key = 0;  // object: its keys start at keys_[first_key]
  };
  struct KeyMark {
    uint64_t hash;  // of the decoded key
    size_t at;      // the key's opening quote
  };

  [[noreturn]] void fail_at(size_t at, const std::string& what) const;
  [[noreturn]] void fail(const std::string& what) const { fail_at(pos_, what); }
  std::string describe_here() const;
  char here() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }  // no token starts with '\0'
  void skip_space();
  void expect(char c);
  void start_value();  // depth and budget
  bool next_element(char close, const char* in);
  void end_object();
  void check_unique_keys(size_t first);
  void decode_at(size_t at, std::string& out);
  void decode_string(std::string* out);  // out null: checked only
  void escape(std::string* out);
  void utf8(std::string* out);
  unsigned hex4();

  std::string_view s_;
  std::string prefix_;
  size_t pos_ = 0;
  size_t max_values_;
  size_t values_ = 0;
  std::vector<Container> open_;  // at most kMaxJsonDepth
  std::deque<KeyMark> keys_;     // the keys of every open object, innermost last (a deque:
                                 // a vector would hold up to three times as many while it copies)
  std::string scratch_;          // keys of the values skip_value() and count_elements() read
};

// A number's text as an unsigned 64-bit integer, or nothing when it is not
// one (a sign, a fraction, an exponent, or 2^64 and more): all a safetensors
// header holds.
std::optional<uint64_t> json_uint64(std::string_view number) noexcept;

// A string quoted for messages: 'name' with control characters escaped and at
// most `limit` bytes of it shown.
std::string quote_for_message(std::string_view s, size_t limit = 120);

}  // namespace ferry::load
