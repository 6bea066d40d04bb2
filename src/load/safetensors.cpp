// safetensors.cpp — header and shard-index checks, in the order a reader
// meets them: the length field, the JSON, each tensor's fields, then how the
// tensors tile the data section.
#include "load/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <numeric>

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
static_assert(kMaxJsonValues < UINT32_MAX);  // ShardIndex::shard_of: fewer entries than values

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
std::string number_for_message(std::string_view text) {
  constexpr size_t kShown = 40;
  if (text.size() <= kShown) return std::string(text);
  return std::string(text.substr(0, kShown)) + "... (" + std::to_string(text.size()) + " characters)";
}

// The next value is of `kind`, or the tensor's field is in error.
void expect_kind(const Reporter& r, const std::string& name, JsonReader& json, const char* field, JsonKind kind) {
  const JsonKind found = json.peek();
  if (found != kind)
    r.tensor(name, std::string("\"") + field + "\": expected " + json_kind_name(kind) + ", found " +
                       json_kind_name(found));
}

uint64_t read_unsigned(const Reporter& r, const std::string& name, const char* field, JsonReader& json) {
  const JsonKind kind = json.peek();
  std::string found = json_kind_name(kind);
  if (kind == JsonKind::number) {
    const std::string_view text = json.read_number();
    if (auto n = json_uint64(text)) return *n;
    found = number_for_message(text);
  }
  r.tensor(name, std::string(field) + ": expected unsigned integers below 2^64, found " + found);
}

// A tensor's offsets against its shape and the file.
void check_size(const Reporter& r, const TensorEntry& t, const SafetensorsHeader& h) {
  if (t.end < t.begin) r.tensor(t.name, "data_offsets " + offsets_text(t.begin, t.end) + ": end before begin");
  uint64_t elements = 1;
  for (uint64_t dim : t.shape) {
    if (dim != 0 && elements > UINT64_MAX / dim)
      r.tensor(t.name, "shape " + shape_text(t.shape) + ": element count overflows 64 bits");
    elements *= dim;
  }
  const uint64_t bits_per = dtype_bits(t.dtype);
  if (elements > UINT64_MAX / bits_per)
    r.tensor(t.name, "shape " + shape_text(t.shape) + ": size in bits overflows 64 bits");
  const uint64_t bits = elements * bits_per;
  if (bits % 8 != 0)
    r.tensor(t.name, "shape " + shape_text(t.shape) + " of " + dtype_name(t.dtype) + " is " + std::to_string(bits) +
                         " bits, not a whole number of bytes");
  if (t.end - t.begin != bits / 8)
    r.tensor(t.name, "shape " + shape_text(t.shape) + " of " + dtype_name(t.dtype) + " is " +
                         std::to_string(bits / 8) + " bytes but data_offsets " + offsets_text(t.begin, t.end) +
                         " hold " + std::to_string(t.end - t.begin));
  const uint64_t data_bytes = h.file_bytes - h.data_offset;
  if (t.end > data_bytes)
    r.tensor(t.name, "data_offsets " + offsets_text(t.begin, t.end) + " run past the end of the file (the data " +
                         "section holds " + std::to_string(data_bytes) + " bytes)");
}

// One tensor entry; its own fields only (how it sits among the others: tile()).
// Members other than the three are skipped (safetensors ignores them too).
TensorEntry parse_entry(const Reporter& r, std::string name, JsonReader& json, const SafetensorsHeader& h) {
  if (json.peek() != JsonKind::object)
    r.tensor(name, std::string("expected an object, found ") + json_kind_name(json.peek()));
  TensorEntry t;
  t.name = std::move(name);
  bool has_dtype = false, has_shape = false, has_offsets = false;
  json.begin_object();
  for (std::string field, dtype; json.next_member(field);) {
    if ((field == "dtype" && has_dtype) || (field == "shape" && has_shape) ||
        (field == "data_offsets" && has_offsets)) {
      json.skip_value();  // named twice: refused as a duplicate key where the entry ends
    } else if (field == "dtype") {
      expect_kind(r, t.name, json, "dtype", JsonKind::string);
      json.read_string(dtype);
      auto d = parse_dtype(dtype);
      if (!d) r.tensor(t.name, "unknown dtype " + quote_for_message(dtype) + " (known: " + known_dtypes() + ")");
      t.dtype = *d;
      has_dtype = true;
    } else if (field == "shape") {
      expect_kind(r, t.name, json, "shape", JsonKind::array);
      t.shape.reserve(json.count_elements());  // exactly: 10M dims take 80 MB, not up to 240
      json.begin_array();
      while (json.next_item()) t.shape.push_back(read_unsigned(r, t.name, "shape", json));
      has_shape = true;
    } else if (field == "data_offsets") {
      expect_kind(r, t.name, json, "data_offsets", JsonKind::array);
      if (size_t n = json.count_elements(); n != 2)
        r.tensor(t.name, "\"data_offsets\": expected [begin, end], found " + std::to_string(n) + " values");
      json.begin_array();
      for (uint64_t* offset : {&t.begin, &t.end}) {
        json.next_item();
        *offset = read_unsigned(r, t.name, "data_offsets", json);
      }
      json.next_item();  // the ']': two items, counted above
      has_offsets = true;
    } else {
      json.skip_value();
    }
  }
  if (!has_dtype) r.tensor(t.name, "missing \"dtype\"");
  if (!has_shape) r.tensor(t.name, "missing \"shape\"");
  if (!has_offsets) r.tensor(t.name, "missing \"data_offsets\"");
  check_size(r, t, h);
  return t;
}

void parse_metadata(const Reporter& r, JsonReader& json, SafetensorsHeader& h) {
  if (json.peek() != JsonKind::object)
    r.fail(std::string("\"__metadata__\": expected an object of strings, found ") + json_kind_name(json.peek()));
  h.has_metadata = true;
  const size_t n = json.count_elements();
  h.metadata_keys.reserve(n);
  h.metadata_values.reserve(n);
  json.begin_object();
  for (std::string key, value; json.next_member(key);) {
    if (json.peek() != JsonKind::string)
      r.fail("\"__metadata__\" " + quote_for_message(key) + ": expected a string, found " +
             json_kind_name(json.peek()));
    json.read_string(value);
    h.metadata_keys.push_back(key);
    h.metadata_values.push_back(value);
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

// A shard's name is a relative path that stays below the index's directory.
template <class Bad>
void check_shard_name(const std::string& f, const Bad& bad) {
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
}

// The weight map as written: index.tensors, and beside them their files.
void read_weight_map(const Reporter& r, JsonReader& json, ShardIndex& index, StringList& files) {
  if (json.peek() != JsonKind::object)
    r.fail(std::string("\"weight_map\": expected an object, found ") + json_kind_name(json.peek()));
  const size_t n = json.count_elements();
  index.tensors.reserve(n);
  files.reserve(n);
  json.begin_object();
  for (std::string tensor, file; json.next_member(tensor);) {
    auto bad = [&](const std::string& why) {
      r.fail("\"weight_map\" tensor " + quote_for_message(tensor) + ": " + why);
    };
    if (json.peek() != JsonKind::string) bad(std::string("expected a file name, found ") + json_kind_name(json.peek()));
    json.read_string(file);
    check_shard_name(file, bad);
    index.tensors.push_back(tensor);
    files.push_back(file);
  }
}

// index.shards: the distinct files, in first-seen order; index.shard_of[k]:
// where files[k] is among them. By sorting, not with a hash set: no node per
// name (an index of a million shards would take more than its text), and no
// crafted names can make it slow.
void number_shards(const StringList& files, ShardIndex& index) {
  const size_t n = files.size();
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), uint32_t{0});
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    if (int c = files[a].compare(files[b])) return c < 0;
    return a < b;
  });
  // shard_of[k]: first the entry where files[k] is first seen, then that entry's shard.
  index.shard_of.resize(n);
  for (size_t i = 0, j; i < n; i = j)
    for (j = i; j < n && files[order[j]] == files[order[i]]; ++j) index.shard_of[order[j]] = order[i];
  std::vector<uint32_t>& shard_at = order;  // reused: entry -> its shard, for first-seen entries
  for (uint32_t k = 0; k < n; ++k) {
    if (index.shard_of[k] == k) {
      shard_at[k] = static_cast<uint32_t>(index.shards.size());
      index.shards.push_back(files[k]);
    }
    index.shard_of[k] = shard_at[index.shard_of[k]];
  }
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
  JsonReader json(text, std::string(file_name) + ": header: ");
  if (json.peek() != JsonKind::object)
    r.fail(std::string("header: expected a JSON object, found ") + json_kind_name(json.peek()));
  json.begin_object();
  for (std::string key; json.next_member(key);) {
    if (key != "__metadata__")
      h.tensors.push_back(parse_entry(r, std::move(key), json, h));
    else if (h.has_metadata)
      json.skip_value();  // named twice: refused as a duplicate key where the header ends
    else
      parse_metadata(r, json, h);
  }
  json.finish();
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
  SafetensorsHeader h = parse_safetensors_header(bytes, file_bytes, path);
  if (int err = os::file_identity(fd, &h.identity)) throw OsError("fstat '" + path + "'", err);
  return h;
}

ShardIndex parse_shard_index(std::string_view json_text, std::string_view index_name) {
  Reporter r(index_name);
  ShardIndex index;
  StringList files;  // files[k]: the shard of index.tensors[k]
  {                  // the reader's memory goes before number_shards() takes its own
    JsonReader json(json_text, std::string(index_name) + ": ");
    if (json.peek() != JsonKind::object)
      r.fail(std::string("expected a JSON object, found ") + json_kind_name(json.peek()));
    bool has_map = false;
    json.begin_object();
    for (std::string key; json.next_member(key);) {
      if (key != "weight_map" || has_map) {
        json.skip_value();  // metadata, or the map named twice (refused where the index ends)
        continue;
      }
      has_map = true;
      read_weight_map(r, json, index, files);
    }
    json.finish();
    if (!has_map) r.fail("no \"weight_map\": not a safetensors shard index");
  }
  number_shards(files, index);
  return index;
}

}  // namespace ferry::load
