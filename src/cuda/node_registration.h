// node_registration.h — this process's pins of a node pool (node/node_pool.h):
// only the pieces it touches, registered with its own CUDA context in the
// background, so that a rank that uses 1 GiB of a 1 TiB node pool pins 1 GiB,
// and asking for a range does not wait for the driver.
//
// Pieces: piece_bytes of the data (FERRY_NODE_PIN_PIECE, 1 GiB by default:
// each cudaHostRegister costs about 8 ms whatever its size, so 64 MiB pieces
// spent 1.1 s of 1.5 s on 8 GiB), each one cudaHostRegister (2 MiB aligned,
// since the data starts on a 2 MiB boundary), in one of four states: none,
// queued, registering, ready (or failed, with the driver's message). A helper
// faults a piece in (MADV_POPULATE_WRITE) before registering it: the helpers
// do that side by side, while the driver registers one piece at a time. touch()
// queues the pieces of a range and starts helper threads (at most
// kMaxThreads; they end when the queue is empty: an idle process holds no
// thread); ready() answers without waiting; wait() blocks until the range's
// pieces are ready and throws the first failure.
//
// Locking: mu_ guards pieces_, queue_, running_ and failure_; cudaHostRegister
// runs outside it (a piece is "registering" meanwhile, so no other thread
// takes it). Unregistration happens in the destructor, after the threads end.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "node/node_pool.h"

namespace ferry::cuda {

class Registration;

class NodeRegistration {
 public:
  static constexpr int kMaxThreads = 8;

  // piece_bytes: a multiple of 2 MiB; 0 = FERRY_NODE_PIN_PIECE.
  NodeRegistration(std::shared_ptr<node::NodePool> pool, int device, size_t piece_bytes = 0);
  ~NodeRegistration();  // waits for the helpers, unregisters every piece
  NodeRegistration(const NodeRegistration&) = delete;
  NodeRegistration& operator=(const NodeRegistration&) = delete;

  // Queues the pieces over [offset, offset + bytes) of the data that are not
  // registered yet. Throws InvalidArgument outside the pool.
  void touch(uint64_t offset, uint64_t bytes);
  bool ready(uint64_t offset, uint64_t bytes);
  // touch() and waits; throws the registration's error (CudaError) if one failed.
  void wait(uint64_t offset, uint64_t bytes);
  uint64_t registered_bytes();
  int device() const { return device_; }
  size_t piece_bytes() const { return piece_; }

 private:
  enum State : uint8_t { none, queued, registering, done, failed };
  void check_range(uint64_t offset, uint64_t bytes) const;
  void work();

  std::shared_ptr<node::NodePool> pool_;
  int device_;
  size_t piece_;
  uint64_t generation_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::vector<State> pieces_;
  std::vector<std::unique_ptr<Registration>> pins_;  // by piece; written by the thread that registered it
  std::deque<size_t> queue_;
  int running_ = 0;  // helper threads alive (detached; the destructor waits for 0)
  std::string failure_;
};

}  // namespace ferry::cuda
