// op_buffers.h — pinned, device-mapped buffers that carry a batch's block list
// to the block-copy kernel (block_copy.h): the CPU writes the list once (24
// bytes a block, write-combined), the kernel reads it through the mapping, and
// the buffer is reused once the launch that read it has finished.
//
// Lifecycle of a buffer: free (in free_, its last launch possibly still
// running: `used` recorded after it) -> lent by acquire() (which waits for
// `used` outside the lock, then grows the buffer if it is too small) ->
// filled and read by one launch -> release() records `used` on that launch's
// stream and puts it back at the end of free_. acquire() takes the oldest
// free buffer; if a launch still reads it (async calls back to back), it makes
// a new one instead of waiting, up to kMaxBuffers. A buffer grows, never
// shrinks.
//
// Locking: mu_ guards free_ and all_ (the list, not the buffers' fields: a
// lent buffer belongs to its borrower). No CUDA call runs under mu_.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "cuda/copy/block_copy.h"

typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;

namespace ferry::cuda {

class OpBuffers {
 public:
  static constexpr size_t kMaxBuffers = 8;  // launches in flight before acquire() waits

  struct Buffer {
    void* host = nullptr;     // cudaHostAlloc(mapped, write-combined): written by the CPU only
    void* device = nullptr;   // its device view, for the kernel
    size_t capacity = 0;
    cudaEvent_t used = nullptr;  // recorded after the last launch that read it
    bool recorded = false;       // `used` was recorded at least once
  };

  OpBuffers() = default;
  ~OpBuffers();  // frees every buffer; precondition: no launch that reads one is pending
  OpBuffers(const OpBuffers&) = delete;
  OpBuffers& operator=(const OpBuffers&) = delete;

  // A buffer of at least `bytes` that no launch still reads. Preconditions:
  // the engine's device is current. Throws CudaError / OutOfMemory.
  Buffer* acquire(size_t bytes);
  // Back to the pool once the launch that reads it is enqueued on `stream`;
  // stream == nullptr and enqueued == false: nothing was launched with it.
  void release(Buffer* b, cudaStream_t stream, bool enqueued) noexcept;

 private:
  std::mutex mu_;
  std::vector<Buffer*> free_;                  // mu_
  std::vector<std::unique_ptr<Buffer>> all_;   // mu_
};

// Enqueues the SM kernel's copies of `ops` on `stream` (block_copy.h): each op
// cut into kBlockPieceBytes pieces, the list written into one of `buffers`,
// launch_block_copies(max_sms, launch_bytes_per_sm). The copy engine's SM path
// and the handoff's device ring both launch this way. Preconditions: those of
// launch_block_copies, except the piece limit (ops may be of any size > 0).
void launch_listed_copies(OpBuffers& buffers, std::span<const BlockCopy> ops, cudaStream_t stream, int max_sms,
                          size_t launch_bytes_per_sm);

}  // namespace ferry::cuda
