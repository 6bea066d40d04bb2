// json.h — a small strict JSON reader for the files a checkpoint loader meets:
// safetensors headers and shard indexes (model.safetensors.index.json).
//
// Strict RFC 8259: UTF-8 only (overlong forms, surrogates and code points past
// U+10FFFF are refused), no trailing commas, no comments, no leading zeros, no
// control characters in strings, nothing but whitespace after the value, and
// no duplicate key in any object (the RFC allows them; a checkpoint whose
// header names a tensor twice is damaged). Nesting is limited (kMaxJsonDepth)
// so that hostile input cannot exhaust the stack, and so is the number of
// values (kMaxJsonValues: a value costs about 100 bytes, so a 100 MB header of
// "0,0,0,..." would otherwise take 5 GB).
//
// Numbers keep their text; as_uint64() accepts only unsigned integers that fit
// 64 bits (no fraction, no exponent, no sign), which is all a safetensors
// header holds.
//
// Errors: parse_json throws InvalidArgument "invalid JSON at byte N: ...";
// callers add the file's name.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::load {

constexpr int kMaxJsonDepth = 64;
constexpr size_t kMaxJsonValues = 10'000'000;  // ~1M tensors' entries

struct JsonMember;  // a key and its value (below: JsonValue must be complete first)

struct JsonValue {
  enum class Kind { null, boolean, number, string, array, object };
  Kind kind = Kind::null;
  bool boolean = false;
  std::string text;                                        // string: decoded; number: as written
  std::vector<JsonValue> items;                            // array
  std::vector<JsonMember> members;                         // object, in file order, keys unique

  // The member named key, or nullptr (object only).
  const JsonValue* find(std::string_view key) const;
  // The number as an unsigned 64-bit integer, or nothing when it is not one.
  std::optional<uint64_t> as_uint64() const;
};

struct JsonMember {
  std::string key;
  JsonValue value;
};

const char* json_kind_name(JsonValue::Kind kind) noexcept;

// max_values: the value budget (tests use a small one).
JsonValue parse_json(std::string_view text, size_t max_values = kMaxJsonValues);

// A string quoted for messages: "name" with control characters escaped and at
// most `limit` bytes of it shown.
std::string quote_for_message(std::string_view s, size_t limit = 120);

}  // namespace ferry::load
