// node_registration.cpp — background cudaHostRegister of a node pool's pieces.
#include "cuda/node_registration.h"

#include <algorithm>
#include <thread>

#include "core/error.h"
#include "core/fork.h"
#include "core/options.h"
#include "cuda/registration.h"
#include "os/memory.h"

namespace ferry::cuda {

NodeRegistration::NodeRegistration(std::shared_ptr<node::NodePool> pool, int device, size_t piece_bytes)
    : pool_(std::move(pool)),
      device_(device),
      piece_(piece_bytes ? piece_bytes : options().size("FERRY_NODE_PIN_PIECE")),
      generation_(fork_generation()) {
  check_chunk_bytes(piece_, "node pool piece_bytes=" + std::to_string(piece_));
  pieces_.assign((pool_->capacity() + piece_ - 1) / piece_, none);
  pins_.resize(pieces_.size());
}

NodeRegistration::~NodeRegistration() {
  if (generation_ != fork_generation()) {  // a forked child: the parent's pins and threads
    for (auto& p : pins_) abandon_in_child(p);
    return;
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    queue_.clear();  // queued pieces stay unregistered
    changed_.wait(lock, [&] { return running_ == 0; });
  }
  pins_.clear();  // unregisters
}

void NodeRegistration::check_range(uint64_t offset, uint64_t bytes) const {
  if (generation_ != fork_generation())
    throw NotSupported(forked_child_message("node pool '" + pool_->name() + "' registration"));
  if (bytes == 0 || offset > pool_->capacity() || bytes > pool_->capacity() - offset)
    throw InvalidArgument("node pool '" + pool_->name() + "': range [" + std::to_string(offset) + ", +" +
                          std::to_string(bytes) + ") is not inside its " + format_bytes(pool_->capacity()));
}

void NodeRegistration::touch(uint64_t offset, uint64_t bytes) {
  check_range(offset, bytes);
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t p = offset / piece_; p <= (offset + bytes - 1) / piece_; ++p)
    if (pieces_[p] == none) {
      pieces_[p] = queued;
      queue_.push_back(p);
    }
  const int want = std::min<int>(kMaxThreads, static_cast<int>(queue_.size()));
  while (running_ < want) {
    ++running_;
    std::thread([this] { work(); }).detach();
  }
}

void NodeRegistration::work() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!queue_.empty()) {
    const size_t p = queue_.front();
    queue_.pop_front();
    pieces_[p] = registering;
    lock.unlock();
    const uint64_t at = p * piece_;
    const uint64_t n = std::min<uint64_t>(piece_, pool_->capacity() - at);
    std::unique_ptr<Registration> pin;
    std::string error;
    // Faulted in here, side by side with the other helpers (the kernel zeroes
    // new pages); the driver would do it inside its one-at-a-time register.
    // A kernel before 5.14 says EINVAL: the driver faults them in then. Whole
    // 2 MiB pages (hugetlb wants them; the file ends on one).
    os::populate_write(pool_->data() + at, (n + (size_t{2} << 20) - 1) / (size_t{2} << 20) * (size_t{2} << 20));
    try {
      pin = std::make_unique<Registration>(pool_->data() + at, n, device_);
    } catch (const std::exception& e) {
      error = e.what();
    }
    lock.lock();
    pins_[p] = std::move(pin);
    pieces_[p] = error.empty() ? done : failed;
    if (!error.empty() && failure_.empty()) failure_ = "node pool '" + pool_->name() + "': " + error;
    changed_.notify_all();
  }
  --running_;
  changed_.notify_all();  // the destructor may wait for this; nothing of *this is touched after the unlock
}

bool NodeRegistration::ready(uint64_t offset, uint64_t bytes) {
  check_range(offset, bytes);
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t p = offset / piece_; p <= (offset + bytes - 1) / piece_; ++p)
    if (pieces_[p] != done) return false;
  return true;
}

void NodeRegistration::wait(uint64_t offset, uint64_t bytes) {
  touch(offset, bytes);
  std::unique_lock<std::mutex> lock(mu_);
  for (size_t p = offset / piece_; p <= (offset + bytes - 1) / piece_; ++p) {
    changed_.wait(lock, [&] { return pieces_[p] == done || pieces_[p] == failed; });
    if (pieces_[p] == failed) throw CudaError(failure_, 0);
  }
}

uint64_t NodeRegistration::registered_bytes() {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t n = 0;
  for (const auto& pin : pins_)
    if (pin) n += pin->registered_bytes();
  return n;
}

}  // namespace ferry::cuda
