// host_target.cpp — memcpy destinations and aligned heap slots.
#include "load/host_target.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "os/file.h"

namespace ferry::load {

HostTarget::HostTarget(size_t slot_count, size_t slot_bytes) : slot_bytes_(slot_bytes) {
  if (slot_count == 0 || slot_bytes == 0 || slot_bytes % os::kDirectIoAlignment != 0)
    throw InvalidArgument("host target: " + std::to_string(slot_count) + " slots of " +
                          std::to_string(slot_bytes) + " bytes: expected >= 1 slot of a positive multiple of 4096");
  for (size_t i = 0; i < slot_count; ++i) {
    void* p = std::aligned_alloc(os::kDirectIoAlignment, slot_bytes);
    if (!p) {
      for (unsigned char* q : slots_) std::free(q);
      throw OutOfMemory("host target: no memory for a " + format_bytes(slot_bytes) + " slot");
    }
    slots_.push_back(static_cast<unsigned char*>(p));
  }
}

HostTarget::~HostTarget() {
  for (unsigned char* p : slots_) std::free(p);
  slots_.clear();
}

void HostTarget::copy_out(size_t, const unsigned char* src, uintptr_t dst, size_t n) {
  std::memcpy(reinterpret_cast<void*>(dst), src, n);
}

}  // namespace ferry::load
