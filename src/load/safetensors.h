// safetensors.h — the safetensors format (huggingface/safetensors): header
// parser, dtypes, and shard indexes (model.safetensors.index.json). Pure C++;
// the only I/O is read_safetensors_header(), through os/file.h.
//
// A file is: an 8-byte little-endian length N, N bytes of JSON, then the data
// section. The JSON is an object: "__metadata__" (optional, an object of
// strings) and one entry per tensor, {"dtype": "BF16", "shape": [4096, 4096],
// "data_offsets": [begin, end]}, offsets relative to the data section.
//
// What parse_safetensors_header() accepts is what safetensors' own loader
// accepts, checked the same strict way, plus duplicate keys refused:
//   - the file holds at least 8 bytes; N <= kMaxHeaderBytes; 8 + N <= file size;
//   - the header is UTF-8 JSON (json.h's strict reader), an object;
//   - each tensor: a known dtype; a shape of unsigned integers whose element
//     count times the dtype's bits is a whole number of bytes that does not
//     overflow 64 bits; data_offsets [begin, end] with begin <= end, and
//     end - begin the shape's byte size;
//   - sorted by data_offsets, the tensors tile the data section exactly: the
//     first begins at 0, each begins where the previous ended (no overlap, no
//     gap), the last ends at the end of the file.
// Each violation is an InvalidArgument that names the file and the tensor.
//
// Memory: the JSON is read with json.h's pull reader straight into the
// result, no tree between. A parse holds the result (80 bytes a tensor, 8 a
// dim, 8 and the text a string of the metadata: StringList) and the reader's
// 16 bytes a key of each open object; shapes, "__metadata__" and the weight
// map are counted before they are read, so that each is allocated once. The
// most hostile 20 MB headers and shard indexes take at most 4 times their
// size (tests/core/safetensors_memory_test.cpp; a JSON tree took up to 74).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "load/string_list.h"
#include "os/file.h"

namespace ferry::load {

// safetensors' own limit on N (MAX_HEADER_SIZE).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// Every dtype of safetensors' Dtype enum (safetensors/src/tensor.rs, 2026-05).
enum class Dtype : uint8_t {
  BOOL, F4, F6_E2M3, F6_E3M2, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ,
  I16, U16, F16, BF16, I32, U32, F32, C64, F64, I64, U64,
  count_
};

const char* dtype_name(Dtype d) noexcept;
unsigned dtype_bits(Dtype d) noexcept;  // 4 (F4), 6 (F6_*), 8 .. 64
std::optional<Dtype> parse_dtype(std::string_view name) noexcept;

struct TensorEntry {
  std::string name;
  Dtype dtype = Dtype::U8;
  std::vector<uint64_t> shape;  // [] is a scalar (one element)
  uint64_t begin = 0, end = 0;  // data_offsets: relative to the data section
};

struct SafetensorsHeader {
  uint64_t header_bytes = 0;  // N
  uint64_t data_offset = 0;   // 8 + N: where the data section starts in the file
  uint64_t file_bytes = 0;
  os::FileIdentity identity;  // read_safetensors_header: fstat of the file it read (else zeros)
  std::vector<TensorEntry> tensors;  // sorted by (begin, end), i.e. file order
  bool has_metadata = false;
  StringList metadata_keys, metadata_values;  // __metadata__, as written: key i has value i

  // The tensor named `name`, or nullptr.
  const TensorEntry* find(std::string_view name) const;
};

// The header length N from the first 8 bytes of a file of file_bytes bytes,
// checked against the file's size and kMaxHeaderBytes.
uint64_t safetensors_header_length(std::span<const uint8_t> first_bytes, uint64_t file_bytes,
                                   std::string_view file_name);

// `bytes` is the start of a file of file_bytes bytes: at least 8 + N of them
// (more is ignored). Throws InvalidArgument naming file_name (and the tensor).
SafetensorsHeader parse_safetensors_header(std::span<const uint8_t> bytes, uint64_t file_bytes,
                                           std::string_view file_name);

// The same without exceptions (the fuzzing entry point): 0, or
// FERRY_ERROR_INVALID_ARGUMENT with the message in *error (either output may
// be null). `data` is the whole file: file_bytes = size.
int parse_safetensors_header(const uint8_t* data, size_t size, SafetensorsHeader* out,
                             std::string* error) noexcept;

// Opens `path`, reads its first 8 + N bytes and parses them. InvalidArgument
// for a damaged file, OsError when it cannot be opened or read.
SafetensorsHeader read_safetensors_header(const std::string& path);

// model.safetensors.index.json: {"metadata": {...}, "weight_map": {tensor: shard}},
// as columns: tensors[k] (in file order) lies in shards[shard_of[k]].
struct ShardIndex {
  StringList tensors;
  std::vector<uint32_t> shard_of;
  StringList shards;  // the distinct shard files, as written, in first-seen order
};

// Shard names must be plain file names or relative paths below the index's
// directory (no absolute path, no ".." component, no empty name).
ShardIndex parse_shard_index(std::string_view json_text, std::string_view index_name);

}  // namespace ferry::load
