// split_at_ends.h — one copy cut into pieces that never cross the end of a
// range on either side: what a DMA needs over pinned memory registered in
// several pieces (a cudaMemcpyAsync over two adjacent registrations fails with
// invalid argument: seen on the node pool's 64 MiB pieces, H200).
// Pure: the caller says, for an address, how many bytes are left in its range
// (SIZE_MAX: no end to respect). No CUDA here (cuda/copy/many_plan.h asks the
// driver through PointerLookup::pinned_bytes_after).
#pragma once

#include <algorithm>
#include <cstddef>

namespace ferry {

// Calls emit(dst, src, n) for consecutive pieces of [0, bytes); each piece
// ends where the copy does or where dst's or src's range ends, whichever is
// first. left(p) must be >= 1 for any p inside the copy.
template <class Left, class Emit>
void split_at_ends(void* dst, const void* src, size_t bytes, Left&& left, Emit&& emit) {
  while (bytes > 0) {
    const size_t n = std::min({bytes, left(static_cast<const void*>(src)), left(static_cast<const void*>(dst))});
    emit(dst, src, n);
    dst = static_cast<char*>(dst) + n;
    src = static_cast<const char*>(src) + n;
    bytes -= n;
  }
}

}  // namespace ferry
