// block_table.h — a paged KV layout as copy items: a serving engine's block
// table (which host block goes to which device block) over `layers` layers,
// without a 64,000-element address array built by the caller. Pure: no CUDA.
//
// Item (l, i), in layer-major order (so that consecutive ids of one layer
// sit next to each other and the copy engine merges them):
//   dst = dst.base + l * dst.layer_stride + dst_ids[i] * dst.block_stride
//   src = src.base + l * src.layer_stride + src_ids[i] * src.block_stride
//   bytes = block_bytes
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace ferry {

struct BlockSide {
  uintptr_t base = 0;
  size_t block_stride = 0;  // bytes from one block to the next (>= block_bytes)
  size_t layer_stride = 0;  // bytes from one layer's block 0 to the next layer's
};

struct BlockTable {
  BlockSide dst, src;
  size_t block_bytes = 0;
  size_t layers = 1;
  std::span<const int64_t> dst_ids, src_ids;
};

// Throws InvalidArgument: ids of different lengths or none, a negative id,
// block_bytes 0, layers 0, a block stride below block_bytes, a base of 0, or
// an address past 2**64.
void check_block_table(const BlockTable& t);

inline size_t block_table_items(const BlockTable& t) { return t.dst_ids.size() * t.layers; }

// emit(dst, src, bytes) for every item, in the order above. Preconditions:
// check_block_table(t) passed.
template <class Emit>
void for_each_block(const BlockTable& t, Emit&& emit) {
  for (size_t l = 0; l < t.layers; ++l) {
    const uintptr_t d0 = t.dst.base + l * t.dst.layer_stride, s0 = t.src.base + l * t.src.layer_stride;
    for (size_t i = 0; i < t.dst_ids.size(); ++i)
      emit(d0 + static_cast<uintptr_t>(t.dst_ids[i]) * t.dst.block_stride,
           s0 + static_cast<uintptr_t>(t.src_ids[i]) * t.src.block_stride, t.block_bytes);
  }
}

}  // namespace ferry
