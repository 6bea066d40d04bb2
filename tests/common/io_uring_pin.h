// io_uring_pin.h — a real DMA pin of host memory on a machine without a GPU:
// io_uring's fixed buffers (IORING_REGISTER_BUFFERS) pin their pages with
// FOLL_PIN | FOLL_LONGTERM, as cudaHostRegister does. So the kernel treats
// them as cudaHostRegister'ed pages, at fork() too: a pinned private page is
// copied into the child. PinHooks pins a pool's chunks this way, for tests of
// what fork() does to pinned pool memory (tests/core/pool_fork_test.cpp).
//
// Each pin is one io_uring instance with one registered buffer; closing the
// ring unpins. A kernel or sandbox without io_uring (io_uring_disabled,
// seccomp), or a memlock limit that refuses the pin, makes pin() fail with an
// errno: tests skip, saying so.
#pragma once

#include <linux/io_uring.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstddef>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "core/error.h"
#include "pool/pool.h"

namespace ferrytest {

// Pins [p, p + bytes) (bytes <= 1 GiB, io_uring's limit per buffer). Returns
// the ring's fd (close it to unpin) or -errno.
inline int io_uring_pin(void* p, size_t bytes) {
  io_uring_params params;
  std::memset(&params, 0, sizeof params);
  const int ring = static_cast<int>(::syscall(__NR_io_uring_setup, 1, &params));
  if (ring < 0) return -errno;
  iovec iov{p, bytes};
  if (::syscall(__NR_io_uring_register, ring, IORING_REGISTER_BUFFERS, &iov, 1) != 0) {
    const int err = errno;
    ::close(ring);
    return -err;
  }
  return ring;
}

// ChunkHooks that pin each chunk through io_uring: a pinned pool without CUDA.
class PinHooks : public ferry::ChunkHooks {
 public:
  void on_chunk_ready(void* base, size_t bytes) override {
    const int ring = io_uring_pin(base, bytes);
    if (ring < 0) throw ferry::OsError("io_uring buffer registration (test pin)", -ring);
    std::lock_guard lock(mu_);
    rings_[base] = ring;
  }
  void on_chunk_release(void* base, size_t) noexcept override {
    std::lock_guard lock(mu_);
    auto it = rings_.find(base);
    if (it == rings_.end()) return;
    ::close(it->second);
    rings_.erase(it);
  }
  size_t pinned_chunks() {
    std::lock_guard lock(mu_);
    return rings_.size();
  }

 private:
  std::mutex mu_;
  std::map<void*, int> rings_;  // mu_: chunk base -> its ring
};

// Why this machine cannot pin through io_uring ("" when it can).
inline std::string io_uring_pin_unavailable() {
  void* p = nullptr;
  if (::posix_memalign(&p, 4096, 4096) != 0) return "no memory";
  const int ring = io_uring_pin(p, 4096);
  if (ring >= 0) ::close(ring);
  std::free(p);
  if (ring >= 0) return "";
  return std::string("io_uring cannot pin memory here (") + std::strerror(-ring) + ")";
}

}  // namespace ferrytest
