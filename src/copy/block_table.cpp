// block_table.cpp — a block table's checks (block_table.h).
#include "copy/block_table.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace ferry {

namespace {

// The end of the last byte any item of this side touches, or throws.
void check_side(const BlockSide& s, std::span<const int64_t> ids, const BlockTable& t, const char* name) {
  const std::string side = name;
  if (s.base == 0) throw InvalidArgument(side + "_base must not be 0");
  if (s.block_stride < t.block_bytes)
    throw InvalidArgument(side + "_block_stride=" + std::to_string(s.block_stride) + " is below block_bytes=" +
                          std::to_string(t.block_bytes) + ": the blocks would overlap");
  int64_t top = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0)
      throw InvalidArgument(side + "_ids[" + std::to_string(i) + "]=" + std::to_string(ids[i]) +
                            ": a block id is 0 or more");
    top = std::max(top, ids[i]);
  }
  unsigned __int128 end = s.base;
  end += static_cast<unsigned __int128>(t.layers - 1) * s.layer_stride;
  end += static_cast<unsigned __int128>(top) * s.block_stride + t.block_bytes;
  if (end > static_cast<unsigned __int128>(UINTPTR_MAX))
    throw InvalidArgument(side + " blocks: block " + std::to_string(top) + " of layer " + std::to_string(t.layers - 1) +
                          " lies past the end of the address space");
}

}  // namespace

void check_block_table(const BlockTable& t) {
  if (t.dst_ids.size() != t.src_ids.size())
    throw InvalidArgument("dst_ids has " + std::to_string(t.dst_ids.size()) + " block ids and src_ids " +
                          std::to_string(t.src_ids.size()) + ": one pair per block");
  if (t.dst_ids.empty()) throw InvalidArgument("copy_blocks: no block ids");
  if (t.block_bytes == 0) throw InvalidArgument("block_bytes must be > 0");
  if (t.layers == 0) throw InvalidArgument("layers must be >= 1");
  check_side(t.dst, t.dst_ids, t, "dst");
  check_side(t.src, t.src_ids, t, "src");
}

}  // namespace ferry
