// first_touch.cpp — front-to-back parallel first touch.
#include "pool/first_touch.h"

#include <algorithm>
#include <cerrno>

#include "core/fault.h"

namespace ferry {
namespace {

constexpr size_t kPageBytes = size_t{4} << 10;

void touch_range(uintptr_t begin, uintptr_t end) noexcept {
  for (volatile char* q = reinterpret_cast<char*>(begin); q < reinterpret_cast<char*>(end); q += kPageBytes) *q = 0;
}

}  // namespace

FirstTouch::FirstTouch(uintptr_t base, size_t bytes, int threads)
    : base_(base),
      bytes_(bytes),
      units_((bytes + kUnitBytes - 1) / kUnitBytes),
      start_(std::chrono::steady_clock::now()),
      done_(units_, false) {
  if (fault_injected(FaultPoint::touch)) {
    error_ = ENOMEM;
    return;
  }
  const size_t wanted = std::clamp<size_t>(units_, 1, static_cast<size_t>(std::max(threads, 1)));
  {
    std::lock_guard lock(mu_);
    helpers_running_ = static_cast<int>(wanted);
  }
  try {
    helpers_.reserve(wanted);
    for (size_t i = 0; i < wanted; ++i)
      helpers_.emplace_back([this] {
        run();
        std::lock_guard lock(mu_);
        --helpers_running_;
        cv_.notify_all();
      });
  } catch (...) {
    // Out of threads or memory: join() touches what the started ones leave.
    std::lock_guard lock(mu_);
    helpers_running_ -= static_cast<int>(wanted - helpers_.size());
  }
}

FirstTouch::~FirstTouch() {
  if (!joined_) {
    stop();
    join();
  }
}

void FirstTouch::unit_done(size_t unit) noexcept {
  std::lock_guard lock(mu_);
  done_[unit] = true;
  const size_t before = prefix_units_;
  while (prefix_units_ < units_ && done_[prefix_units_]) ++prefix_units_;
  if (prefix_units_ == units_ && before != units_) touched_at_ = std::chrono::steady_clock::now();
  if (prefix_units_ != before) cv_.notify_all();
}

void FirstTouch::run() noexcept {
  while (!stop_.load(std::memory_order_relaxed)) {
    const size_t unit = next_unit_.fetch_add(1, std::memory_order_relaxed);
    if (unit >= units_) return;
    const uintptr_t begin = base_ + unit * kUnitBytes;
    touch_range(begin, std::min(begin + kUnitBytes, base_ + bytes_));
    unit_done(unit);
  }
}

bool FirstTouch::wait_touched(size_t bytes, const std::atomic<bool>* cancel) {
  const size_t units = std::min(units_, (bytes + kUnitBytes - 1) / kUnitBytes);
  std::unique_lock lock(mu_);
  for (;;) {
    if (prefix_units_ >= units) return true;
    if (helpers_running_ == 0 || stop_.load() || (cancel && cancel->load())) return false;
    cv_.wait_for(lock, std::chrono::milliseconds(1));
  }
}

void FirstTouch::stop() noexcept { stop_.store(true); }

int FirstTouch::join() noexcept {
  if (joined_) return error_;
  joined_ = true;
  if (error_ == 0) run();  // the caller takes what is left
  for (std::thread& t : helpers_) t.join();
  std::lock_guard lock(mu_);
  const bool complete = prefix_units_ == units_;
  const auto end = complete ? touched_at_ : std::chrono::steady_clock::now();
  elapsed_ns_ = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(end - start_).count());
  if (error_ != 0) return error_;
  return complete ? 0 : ECANCELED;
}

}  // namespace ferry
