// op_buffers.cpp — the block lists' pinned buffers (op_buffers.h).
#include "cuda/copy/op_buffers.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <bit>

#include "cuda/cuda_check.h"

namespace ferry::cuda {

OpBuffers::~OpBuffers() {
  for (auto& b : all_) {
    if (b->recorded) cudaEventSynchronize(b->used);  // a kernel may still read it
    if (b->host) cudaFreeHost(b->host);
    if (b->used) cudaEventDestroy(b->used);
  }
}

OpBuffers::Buffer* OpBuffers::acquire(size_t bytes) {
  Buffer* b = nullptr;
  {
    std::lock_guard lock(mu_);
    if (!free_.empty()) {  // the oldest released: the likeliest to be done
      b = free_.front();
      free_.erase(free_.begin());
    }
  }
  // Still read by a launch (async calls back to back): a new buffer rather than
  // a wait, up to kMaxBuffers; then wait for the oldest.
  if (b && b->recorded && b->used && cudaEventQuery(b->used) == cudaErrorNotReady) {
    std::lock_guard lock(mu_);
    if (all_.size() < kMaxBuffers) {
      free_.insert(free_.begin(), b);
      b = nullptr;
    }
  }
  if (!b) {
    std::lock_guard lock(mu_);
    all_.push_back(std::make_unique<Buffer>());
    b = all_.back().get();
  }
  try {
    if (!b->used) check(cudaEventCreateWithFlags(&b->used, cudaEventDisableTiming), "cudaEventCreate (op buffer)");
    if (b->recorded) check(cudaEventSynchronize(b->used), "cudaEventSynchronize (op buffer)");
    if (b->capacity < bytes) {
      if (b->host) check(cudaFreeHost(b->host), "cudaFreeHost (op buffer)");
      b->host = b->device = nullptr;
      b->capacity = 0;
      const size_t n = std::bit_ceil(std::max<size_t>(bytes, 64u << 10));
      check(cudaHostAlloc(&b->host, n, cudaHostAllocMapped | cudaHostAllocWriteCombined), "cudaHostAlloc (op buffer)");
      b->capacity = n;
      check(cudaHostGetDevicePointer(&b->device, b->host, 0), "cudaHostGetDevicePointer (op buffer)");
    }
  } catch (...) {
    release(b, nullptr, false);
    throw;
  }
  return b;
}

void OpBuffers::release(Buffer* b, cudaStream_t stream, bool enqueued) noexcept {
  if (enqueued) {
    // If the record fails, wait for the stream instead: the buffer must not be
    // rewritten while a kernel may read it.
    if (cudaEventRecord(b->used, stream) == cudaSuccess)
      b->recorded = true;
    else
      cudaStreamSynchronize(stream), b->recorded = false, cudaGetLastError();
  }
  std::lock_guard lock(mu_);
  free_.push_back(b);
}

void launch_listed_copies(OpBuffers& buffers, std::span<const BlockCopy> ops, cudaStream_t stream, int max_sms,
                          size_t launch_bytes_per_sm) {
  size_t pieces = 0, bytes = 0;
  for (const BlockCopy& op : ops) pieces += block_pieces(op.bytes), bytes += op.bytes;
  OpBuffers::Buffer* b = buffers.acquire(pieces * sizeof(BlockCopy));
  auto* out = static_cast<BlockCopy*>(b->host);
  for (const BlockCopy& op : ops) {
    auto* d = static_cast<char*>(op.dst);
    auto* s = static_cast<const char*>(op.src);
    for (size_t at = 0; at < op.bytes; at += kBlockPieceBytes)
      *out++ = {d + at, s + at, std::min(kBlockPieceBytes, op.bytes - at)};
  }
  // The list is in write-combined memory: drain the CPU's write-combining
  // buffers before the launch lets the GPU read it.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  bool enqueued = false;
  try {
    launch_block_copies(static_cast<const BlockCopy*>(b->device), pieces, bytes, stream, max_sms,
                        launch_bytes_per_sm);
    enqueued = true;
  } catch (...) {
    buffers.release(b, stream, enqueued);
    throw;
  }
  buffers.release(b, stream, enqueued);
}

}  // namespace ferry::cuda
