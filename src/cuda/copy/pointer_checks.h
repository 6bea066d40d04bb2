// pointer_checks.h — what a copy's two pointers are, checked before any work
// is enqueued: NULL, size 0, wrap-around, overlap, host<->host, device memory
// of another device, device ranges shorter than the copy, host ranges that
// are not mapped. Each refusal is an InvalidArgument naming the pointer.
#pragma once

#include <cstddef>

#include "copy/strategy.h"

namespace ferry::cuda {

class PointerLookup;

// A validated pair: the direction, where the host side is, and whether the
// driver reports it pinned.
struct CopyPair {
  Direction dir = Direction::h2d;
  bool host_pinned = false;
  bool device_to_device = false;  // both device memory (dir is then h2d, host nullptr)
  const void* host = nullptr;
};

// Throws InvalidArgument for any refusal above. `device` is the engine's.
CopyPair check_copy_pair(void* dst, const void* src, size_t bytes, PointerLookup& lookup, int device);

// What choose_route (copy/strategy.h) is told about a checked pair.
inline CopyFacts copy_facts(const CopyPair& pair, size_t bytes, CallKind call) {
  CopyFacts f;
  f.dir = pair.dir;
  f.bytes = bytes;
  f.backing = pair.host_pinned ? HostBacking::pinned : HostBacking::unknown;
  f.device_to_device = pair.device_to_device;
  f.call = call;
  return f;
}

}  // namespace ferry::cuda
