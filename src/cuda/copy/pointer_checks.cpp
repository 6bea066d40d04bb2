// pointer_checks.cpp — the checks of a copy's pointers (pointer_checks.h).
#include "cuda/copy/pointer_checks.h"

#include <cstdint>
#include <string>

#include "core/error.h"
#include "cuda/pointer_lookup.h"
#include "os/mapping.h"

namespace ferry::cuda {

namespace {

void check_device_range(PointerLookup& lookup, const void* p, size_t bytes, const char* role) {
  size_t after = lookup.device_bytes_after(p);
  if (after != 0 && after < bytes)
    throw InvalidArgument(std::string(role) + " " + format_address(p) + ": the device allocation holds " +
                          format_bytes(after) + " from there, the copy needs " + format_bytes(bytes));
}

void check_host_range(const void* p, size_t bytes, const char* role) {
  if (os::range_is_mapped(p, bytes) != 0)
    throw InvalidArgument(std::string(role) + " " + format_address(p) + " (+" + format_bytes(bytes) +
                          ") is neither device memory nor mapped host memory");
}

void check_device_owner(const PointerInfo& info, int device, const void* p, const char* role) {
  if (info.kind == Memory::device && info.device >= 0 && info.device != device)
    throw InvalidArgument(std::string(role) + " " + format_address(p) + " is memory of device " + std::to_string(info.device) +
                          ", but this engine copies for device " + std::to_string(device));
}

}  // namespace

CopyPair check_copy_pair(void* dst, const void* src, size_t bytes, PointerLookup& lookup, int device) {
  if (!dst || !src) throw InvalidArgument(std::string(!dst ? "dst" : "src") + " must not be NULL");
  if (bytes == 0) throw InvalidArgument("copy of 0 bytes");
  const auto d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
  if (d + bytes < d || s + bytes < s) throw InvalidArgument("copy range wraps around the address space");
  if (d < s + bytes && s < d + bytes)
    throw InvalidArgument("source " + format_address(src) + " and destination " + format_address(dst) + " overlap (" +
                          format_bytes(bytes) + ")");
  Memory md = lookup.classify(dst, bytes), ms = lookup.classify(src, bytes);
  if (md == Memory::device) {
    check_device_owner(lookup.find(dst), device, dst, "destination");
    check_device_range(lookup, dst, bytes, "destination");
  }
  if (ms == Memory::device) {
    check_device_owner(lookup.find(src), device, src, "source");
    check_device_range(lookup, src, bytes, "source");
  }
  if (md == Memory::device && ms == Memory::device) return {Direction::h2d, false, true, nullptr};
  if (md != Memory::device && ms != Memory::device)
    throw InvalidArgument("neither " + format_address(src) + " nor " + format_address(dst) +
                          " is device memory: ferry copies between host and device (use memcpy on the host)");
  CopyPair c;
  c.device_to_device = false;
  c.dir = md == Memory::device ? Direction::h2d : Direction::d2h;
  Memory host_kind = c.dir == Direction::h2d ? ms : md;
  c.host = c.dir == Direction::h2d ? src : dst;
  c.host_pinned = host_kind == Memory::pinned_host;
  if (!c.host_pinned) check_host_range(c.host, bytes, c.dir == Direction::h2d ? "source" : "destination");
  return c;
}

}  // namespace ferry::cuda
