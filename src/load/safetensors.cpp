// safetensors.cpp — header and shard-index checks, in the order a reader
// meets them: the length field, the JSON, each tensor's fields, then how the
// tensors tile the data section.
#include "load/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "load/json.h"
#include "os/file.h"
#include "os/memory.h"

namespace ferry::load {
namespace {

struct DtypeInfo {
  const char* name;
  unsigned bits;
};

constexpr DtypeInfo kDtypes[] = {
    {"BOOL", 8},        {"F4", 4},          {"F6_E2M3", 6},     {"F6_E3M2", 6}, {"U8", 8},   {"I8", 8},
    {"F8_E5M2", 8},     {"F8_E4M3", 8},     {"F8_E8M0", 8},     {"F8_E4M3FNUZ", 8},          {"F8_E5M2FNUZ", 8},
    {"I16", 16},        {"U16", 16},        {"F16", 16},        {"BF16", 16},   {"I32", 32}, {"U32", 32},
    {"F32", 32},        {"C64", 64},        {"F64", 64},        {"I64", 64},    {"U64", 64},
};
static_assert(std::size(kDtypes) == static_cast<size_t>(Dtype::count_));

std::string known_dtypes() {
  std::string s;
  for (const auto& d : kDtypes) s += (s.empty() ? "" : ", ") + std::string(d.name);
  return s;
}

std::string shape_text(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string offsets_text(uint64_t b, uint64_t e) {
  return "[" + std::to_string(b) + ", " + std::to_string(e) + "]";
}

// Messages: "FILE: tensor 'NAME': WHAT".
class Reporter {
 public:
  explicit Reporter(std::string_view file) : file_(file) {}
  [[noreturn]] void fail(const std::string& what) const { throw InvalidArgument(std::string(file_) + ": " + what); }
  [[noreturn]] void tensor(const std::string& name, const std::string& what) const {
    fail("tensor " + quote_for_message(name) + ": " + what);
  }

 private:
  std::string_view file_;
};

// A number as written, cut short: a 99 MB number made a 99 MB message.
std::string number_for_message(const std::string& text) {
  constexpr size_t kShown = 40;
  if (text.size() <= kShown) return text;
  return text.substr(0, kShown) + "... (" + std::to_string(text.size()) + " characters)";
}

uint64_t unsigned_field(const Reporter& r, const std::string& name, const char* field, const JsonValue& v) {
  auto n = v.as_uint64();
  if (!n)
    r.tensor(name, std::string(field) + ": expected unsigned integers below 2^64, found " +
                       (v.kind == JsonValue::Kind::number ? number_for_message(v.text) : json_kind_name(v.kind)));
  return *n;
}

const JsonValue& required(const Reporter& r, const std::string& name, const JsonValue& entry, const char* field,
                          JsonValue::Kind kind) {
  const JsonValue* v = entry.find(field);
  if (!v) r.tensor(name, std::string("missing \"") + field + "\"");
  if (v->kind != kind)
    r.tensor(name, std::string("\"") + field + "\": expected " + json_kind_name(kind) + ", found " +
                       json_kind_name(v->kind));
  return *v;
}

// One tensor entry; its own fields only (how it sits among the others: tile()).
TensorEntry parse_entry(const Reporter& r, const std::string& name, const JsonValue& entry,
                        const SafetensorsHeader& h) {
  if (entry.kind != JsonValue::Kind::object)
    r.tensor(name, std::string("expected an object, found ") + json_kind_name(entry.kind));
  TensorEntry t;
  t.name = name;
  const JsonValue& dtype = required(r, name, entry, "dtype", JsonValue::Kind::string);
  auto d = parse_dtype(dtype.text);
  if (!d) r.tensor(name, "unknown dtype " + quote_for_message(dtype.text) + " (known: " + known_dtypes() + ")");
  t.dtype = *d;
  for (const JsonValue& dim : required(r, name, entry, "shape", JsonValue::Kind::array).items)
    t.shape.push_back(unsigned_field(r, name, "shape", dim));
  const JsonValue& offsets = required(r, name, entry, "data_offsets", JsonValue::Kind::array);
  if (offsets.items.size() != 2)
    r.tensor(name, "\"data_offsets\": expected [begin, end], found " + std::to_string(offsets.items.size()) +
                       " values");
  t.begin = unsigned_field(r, name, "data_offsets", offsets.items[0]);
  t.end = unsigned_field(r, name, "data_offsets", offsets.items[1]);
  if (t.end < t.begin) r.tensor(name, "data_offsets " + offsets_text(t.begin, t.end) + ": end before begin");

  uint64_t elements = 1;
  for (uint64_t dim : t.shape) {
    if (dim != 0 && elements > UINT64_MAX / dim)
      r.tensor(name, "shape " + shape_text(t.shape) + ": element count overflows 64 bits");
    elements *= dim;
  }
  const uint64_t bits_per = dtype_bits(t.dtype);
  if (elements > UINT64_MAX / bits_per)
    r.tensor(name, "shape " + shape_text(t.shape) + ": size in bits overflows 64 bits");
  const uint64_t bits = elements * bits_per;
  if (bits % 8 != 0)
    r.tensor(name, "shape " + shape_text(t.shape) + " of " + dtype_name(t.dtype) + " is " + std::to_string(bits) +
                       " bits, not a whole number of bytes");
  if (t.end - t.begin != bits / 8)
    r.tensor(name, "shape " + shape_text(t.shape) + " of " + dtype_name(t.dtype) + " is " +
                       std::to_string(bits / 8) + " bytes but data_offsets " + offsets_text(t.begin, t.end) +
                       " hold " + std::to_string(t.end - t.begin));
  const uint64_t data_bytes = h.file_bytes - h.data_offset;
  if (t.end > data_bytes)
    r.tensor(name, "data_offsets " + offsets_text(t.begin, t.end) + " run past the end of the file (the data " +
                       "section holds " + std::to_string(data_bytes) + " bytes)");
  return t;
}

void parse_metadata(const Reporter& r, const JsonValue& v, SafetensorsHeader& h) {
  if (v.kind != JsonValue::Kind::object)
    r.fail(std::string("\"__metadata__\": expected an object of strings, found ") + json_kind_name(v.kind));
  h.has_metadata = true;
  for (const auto& [key, value] : v.members) {
    if (value.kind != JsonValue::Kind::string)
      r.fail("\"__metadata__\" " + quote_for_message(key) + ": expected a string, found " +
             json_kind_name(value.kind));
    h.metadata.emplace_back(key, value.text);
  }
}

// Sorted by offsets, the tensors must cover the data section exactly.
void tile(const Reporter& r, SafetensorsHeader& h) {
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorEntry& a, const TensorEntry& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    if (a.end != b.end) return a.end < b.end;
    return a.name < b.name;
  });
  uint64_t expected = 0;
  const TensorEntry* previous = nullptr;
  for (const TensorEntry& t : h.tensors) {
    if (t.begin < expected)
      r.tensor(t.name, "data_offsets " + offsets_text(t.begin, t.end) + " overlap tensor " +
                           quote_for_message(previous->name) + " " + offsets_text(previous->begin, previous->end));
    if (t.begin > expected)
      r.tensor(t.name, "data_offsets " + offsets_text(t.begin, t.end) + " leave a gap of " +
                           std::to_string(t.begin - expected) + " bytes after " +
                           (previous ? "tensor " + quote_for_message(previous->name) : "the header"));
    expected = t.end;
    previous = &t;
  }
  const uint64_t data_bytes = h.file_bytes - h.data_offset;
  if (expected != data_bytes)
    r.fail("the data section holds " + std::to_string(data_bytes) + " bytes but the tensors end at " +
           std::to_string(expected) +
           (previous ? " (last: tensor " + quote_for_message(previous->name) + ")" : " (no tensors)") +
           ": the file has " + std::to_string(data_bytes - expected) + " bytes no tensor describes");
}

}  // namespace

const char* dtype_name(Dtype d) noexcept {
  size_t i = static_cast<size_t>(d);
  return i < std::size(kDtypes) ? kDtypes[i].name : "?";
}

unsigned dtype_bits(Dtype d) noexcept {
  size_t i = static_cast<size_t>(d);
  return i < std::size(kDtypes) ? kDtypes[i].bits : 0;
}

std::optional<Dtype> parse_dtype(std::string_view name) noexcept {
  for (size_t i = 0; i < std::size(kDtypes); ++i)
    if (name == kDtypes[i].name) return static_cast<Dtype>(i);
  return std::nullopt;
}

const TensorEntry* SafetensorsHeader::find(std::string_view name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

uint64_t safetensors_header_length(std::span<const uint8_t> first_bytes, uint64_t file_bytes,
                                   std::string_view file_name) {
  Reporter r(file_name);
  if (file_bytes < 8 || first_bytes.size() < 8)
    r.fail("truncated: " + std::to_string(file_bytes) +
           " bytes; a safetensors file starts with an 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | first_bytes[static_cast<size_t>(i)];
  if (n > kMaxHeaderBytes)
    r.fail("header length " + std::to_string(n) + " is larger than safetensors' limit of " +
           std::to_string(kMaxHeaderBytes) + " bytes");
  if (n > file_bytes - 8)
    r.fail("header length " + std::to_string(n) + " runs past the end of the file (" + std::to_string(file_bytes) +
           " bytes)");
  return n;
}

SafetensorsHeader parse_safetensors_header(std::span<const uint8_t> bytes, uint64_t file_bytes,
                                           std::string_view file_name) {
  Reporter r(file_name);
  SafetensorsHeader h;
  h.file_bytes = file_bytes;
  h.header_bytes = safetensors_header_length(bytes, file_bytes, file_name);
  h.data_offset = 8 + h.header_bytes;
  if (bytes.size() < h.data_offset)
    r.fail("truncated: " + std::to_string(bytes.size()) + " bytes read of a " + std::to_string(h.data_offset) +
           "-byte header");
  std::string_view text(reinterpret_cast<const char*>(bytes.data()) + 8, h.header_bytes);
  JsonValue root;
  try {
    root = parse_json(text);
  } catch (const InvalidArgument& e) {
    r.fail(std::string("header: ") + e.what());
  }
  if (root.kind != JsonValue::Kind::object)
    r.fail(std::string("header: expected a JSON object, found ") + json_kind_name(root.kind));
  h.tensors.reserve(root.members.size());
  for (const auto& [key, value] : root.members) {
    if (key == "__metadata__")
      parse_metadata(r, value, h);
    else
      h.tensors.push_back(parse_entry(r, key, value, h));
  }
  tile(r, h);
  return h;
}

int parse_safetensors_header(const uint8_t* data, size_t size, SafetensorsHeader* out,
                             std::string* error) noexcept {
  try {
    SafetensorsHeader h = parse_safetensors_header(std::span<const uint8_t>(data, size), size, "<input>");
    if (out) *out = std::move(h);
    return 0;
  } catch (const std::exception& e) {
    if (error) {
      try {
        *error = e.what();
      } catch (...) {
      }
    }
    return FERRY_ERROR_INVALID_ARGUMENT;
  }
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
  int fd = -1;
  if (int err = os::open_for_reading(path.c_str(), false, &fd)) throw OsError("open '" + path + "'", err);
  std::unique_ptr<int, void (*)(int*)> closer(&fd, [](int* f) { os::close_fd(*f); });
  uint64_t file_bytes = 0;
  if (int err = os::regular_file_size(fd, &file_bytes)) {
    if (err == EISDIR || err == EINVAL) throw InvalidArgument(path + ": not a regular file");
    throw OsError("fstat '" + path + "'", err);
  }
  uint8_t first[8] = {};
  size_t got = 0;
  if (int err = os::read_at(fd, first, sizeof first, 0, &got)) throw OsError("read '" + path + "'", err);
  const uint64_t n = safetensors_header_length(std::span<const uint8_t>(first, got), file_bytes, path);
  std::vector<uint8_t> bytes(8 + n);
  if (int err = os::read_at(fd, bytes.data(), bytes.size(), 0, &got)) throw OsError("read '" + path + "'", err);
  bytes.resize(got);  // shorter only if the file shrank since fstat: parse() says so
  return parse_safetensors_header(bytes, file_bytes, path);
}

ShardIndex parse_shard_index(std::string_view json_text, std::string_view index_name) {
  Reporter r(index_name);
  JsonValue root;
  try {
    root = parse_json(json_text);
  } catch (const InvalidArgument& e) {
    r.fail(e.what());
  }
  if (root.kind != JsonValue::Kind::object) r.fail(std::string("expected a JSON object, found ") + json_kind_name(root.kind));
  const JsonValue* map = root.find("weight_map");
  if (!map) r.fail("no \"weight_map\": not a safetensors shard index");
  if (map->kind != JsonValue::Kind::object)
    r.fail(std::string("\"weight_map\": expected an object, found ") + json_kind_name(map->kind));
  ShardIndex index;
  for (const JsonMember& m : map->members) {
    const std::string& tensor = m.key;
    const JsonValue& file = m.value;
    auto bad = [&](const std::string& why) {
      r.fail("\"weight_map\" tensor " + quote_for_message(tensor) + ": " + why);
    };
    if (file.kind != JsonValue::Kind::string) bad(std::string("expected a file name, found ") + json_kind_name(file.kind));
    const std::string& f = file.text;
    if (f.empty()) bad("empty file name");
    if (f.front() == '/') bad("absolute path " + quote_for_message(f) + " (shards must lie beside the index)");
    if (f.find('\0') != std::string::npos) bad("file name with a NUL byte");
    for (size_t pos = 0; pos <= f.size();) {
      size_t slash = f.find('/', pos);
      if (slash == std::string::npos) slash = f.size();
      if (f.compare(pos, slash - pos, "..") == 0 && slash - pos == 2)
        bad("file name " + quote_for_message(f) + " leaves the index's directory ('..')");
      pos = slash + 1;
    }
    index.weight_map.emplace_back(tensor, f);
    if (std::find(index.shards.begin(), index.shards.end(), f) == index.shards.end()) index.shards.push_back(f);
  }
  return index;
}

}  // namespace ferry::load
