// shard_index_fuzz.cpp — the shard index parser (model.safetensors.index.json,
// src/load/safetensors.cpp) on any text. Invariants of an accepted index: no
// shard name is empty, absolute or leaves the directory, every shard named by
// the weight map is listed once, and no tensor appears twice.
#include <set>

#include "fuzz_common.h"
#include "load/safetensors.h"

using namespace ferry;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  load::ShardIndex idx;
  if (!fuzz::accepted([&] { idx = load::parse_shard_index(fuzz::text(data, size), "fuzz.json"); })) return 0;
  std::set<std::string> tensors, shards(idx.shards.begin(), idx.shards.end());
  fuzz::require(shards.size() == idx.shards.size(), "a shard listed twice");
  for (const auto& [tensor, file] : idx.weight_map) {
    fuzz::require(tensors.insert(tensor).second, "a tensor mapped twice");
    fuzz::require(shards.count(file) == 1, "a mapped shard missing from the list");
    fuzz::require(!file.empty() && file.front() != '/', "an empty or absolute shard name");
    fuzz::require(file != ".." && file.rfind("../", 0) != 0 && file.find("/../") == std::string::npos &&
                      (file.size() < 3 || file.compare(file.size() - 3, 3, "/..") != 0),
                  "a shard name leaving the directory");
  }
  return 0;
}
