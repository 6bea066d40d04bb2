// layout_source.cpp — LayoutSource: a file's layout cut into slots (layout_source.h).
#include "load/layout_source.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "os/file.h"

namespace ferry::load {

uint64_t FileLayout::total() const {
  uint64_t n = header.size();
  for (const FilePart& p : parts) n += p.bytes;
  return n;
}

LayoutSource::LayoutSource(const FileLayout& layout, std::vector<unsigned char*> slots, size_t slot_bytes,
                           DeviceReads* device)
    : layout_(layout),
      slots_(std::move(slots)),
      at_(slots_.begin(), slots_.end()),
      on_device_(slots_.size(), 0),
      slot_bytes_(slot_bytes),
      device_(device) {
  uint64_t at = layout.header.size();
  starts_.reserve(layout.parts.size());
  for (size_t k = 0; k < layout.parts.size(); ++k) {
    const FilePart& p = layout.parts[k];
    if (p.device >= 0 && p.bytes > 0 && !device_)
      throw InvalidArgument("save: part " + std::to_string(k) + " is in memory of cuda:" + std::to_string(p.device) +
                            " but this save has no device reads (a ferry bug: please report it)");
    if (p.bytes > 0 && p.address == 0)
      throw InvalidArgument("save: part " + std::to_string(k) + " has no address");
    starts_.push_back(at);
    at += p.bytes;
  }
}

// Memory that already holds bytes [file_offset, +n) of one host part, 4 KiB
// aligned there (written as it is), or nullptr. Moves the cursor (file order).
const unsigned char* LayoutSource::view_of(uint64_t file_offset, size_t n) const {
  if (file_offset < layout_.header.size()) return nullptr;
  size_t k = part_;
  while (k < starts_.size() && starts_[k] + layout_.parts[k].bytes <= file_offset) ++k;
  if (k == starts_.size()) return nullptr;
  const FilePart& p = layout_.parts[k];
  if (p.device >= 0 || file_offset + n > starts_[k] + p.bytes) return nullptr;
  const uintptr_t a = p.address + (file_offset - starts_[k]);
  return a % os::kDirectIoAlignment == 0 ? reinterpret_cast<const unsigned char*>(a) : nullptr;
}

void LayoutSource::fill(size_t i, uint64_t file_offset, size_t n) {
  on_device_[i] = 0;
  if (const unsigned char* v = view_of(file_offset, n)) {
    at_[i] = v;
    return;
  }
  unsigned char* dst = slots_[i];
  at_[i] = dst;
  copies_.clear();
  uint64_t pos = file_offset;
  const uint64_t end = file_offset + n, header = layout_.header.size();
  if (pos < header) {
    const uint64_t k = std::min(end, header) - pos;
    std::memcpy(dst, layout_.header.data() + pos, k);
    pos += k;
  }
  while (pos < end) {
    while (part_ < starts_.size() && starts_[part_] + layout_.parts[part_].bytes <= pos) ++part_;
    if (part_ == starts_.size())
      throw InvalidArgument("save: bytes [" + std::to_string(pos) + ", " + std::to_string(end) +
                            ") lie past the layout's end (a ferry bug: please report it)");
    const FilePart& p = layout_.parts[part_];
    const uint64_t in = pos - starts_[part_], k = std::min(end, starts_[part_] + p.bytes) - pos;
    const auto* src = reinterpret_cast<const unsigned char*>(p.address + in);
    if (p.device < 0) {
      std::memcpy(dst + (pos - file_offset), src, k);
      copied_ += k;
    } else {
      copies_.push_back(DeviceCopy{p.device, dst + (pos - file_offset), src, static_cast<size_t>(k)});
    }
    pos += k;
  }
  if (!copies_.empty()) {
    device_->read(i, copies_);
    on_device_[i] = 1;
  }
}

void LayoutSource::wait_filled(size_t i) {
  if (on_device_[i]) device_->wait(i);
}

void LayoutSource::abort() noexcept {
  if (device_) device_->abort();
}

}  // namespace ferry::load
