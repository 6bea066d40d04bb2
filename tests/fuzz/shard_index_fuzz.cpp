// shard_index_fuzz.cpp — the shard index parser (model.safetensors.index.json,
// src/load/safetensors.cpp) on any text. Invariants of an accepted index: no
// shard name is empty, absolute or leaves the directory, the shards are
// distinct and numbered in first-seen order, every tensor's shard_of points
// at one of them, and no tensor appears twice.
#include <set>
#include <string>

#include "fuzz_common.h"
#include "load/safetensors.h"

using namespace ferry;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  load::ShardIndex idx;
  if (!fuzz::accepted([&] { idx = load::parse_shard_index(fuzz::text(data, size), "fuzz.json"); })) return 0;
  fuzz::require(idx.shard_of.size() == idx.tensors.size(), "a tensor without its shard");
  std::set<std::string> tensors, shards;
  for (std::string_view file : idx.shards) {
    fuzz::require(shards.emplace(file).second, "a shard listed twice");
    fuzz::require(!file.empty() && file.front() != '/', "an empty or absolute shard name");
    const std::string f(file);
    fuzz::require(f != ".." && f.rfind("../", 0) != 0 && f.find("/../") == std::string::npos &&
                      (f.size() < 3 || f.compare(f.size() - 3, 3, "/..") != 0),
                  "a shard name leaving the directory");
  }
  uint32_t seen = 0;  // shards numbered so far, in first-seen order
  for (size_t k = 0; k < idx.tensors.size(); ++k) {
    fuzz::require(tensors.emplace(idx.tensors[k]).second, "a tensor mapped twice");
    fuzz::require(idx.shard_of[k] <= seen && idx.shard_of[k] < idx.shards.size(), "shards out of first-seen order");
    if (idx.shard_of[k] == seen) ++seen;
  }
  fuzz::require(seen == idx.shards.size(), "a shard no tensor lies in");
  return 0;
}
