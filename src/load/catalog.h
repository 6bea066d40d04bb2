// catalog.h — the tensors of a checkpoint's safetensors files in one value:
// every header read and checked, names unique across files, a shard index's
// weight_map checked against the headers. Columns rather than one object per
// tensor, so that a checkpoint of thousands of tensors reaches Python in a
// handful of lists (python/ferry/torch/safetensors.py reads them).
//
// Refused (InvalidArgument naming the files and the tensor): a tensor in two
// files, an index entry whose tensor is in another file or in none, an index
// entry naming a file index out of range; what read_safetensors_header
// refuses (OsError for a file that cannot be read).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "load/safetensors.h"

namespace ferry::load {

// Threads that read and parse a checkpoint's headers at once (one per file,
// at most one per usable core): 8 shards' headers of 2,388 tensors in the
// time of one.
inline constexpr int kCatalogThreads = 16;

struct Catalog {
  // Tensor i of the checkpoint, files in the order given, tensors in file order.
  std::vector<std::string> names;
  std::vector<uint32_t> file;     // index into the files given
  std::vector<Dtype> dtype;
  std::vector<uint64_t> offset;   // of the first byte, from the start of the file
  std::vector<uint64_t> bytes;
  std::vector<uint64_t> shape;    // every tensor's dimensions, one after the other
  std::vector<uint32_t> shape_at; // tensor i's dimensions: shape[shape_at[i] .. shape_at[i + 1])
  std::vector<os::FileIdentity> identity;  // per file: the one its header was read from

  size_t size() const noexcept { return names.size(); }
};

// index_tensors[k] is in files[index_files[k]] (a shard index's weight_map,
// its file names resolved by the caller); both empty when there is no index.
Catalog read_catalog(std::span<const std::string> files, std::span<const std::string> index_tensors,
                     std::span<const uint32_t> index_files);

}  // namespace ferry::load
