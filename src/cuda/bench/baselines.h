// baselines.h — the CUDA runtime's own ways of doing what ferry does, timed the
// same way, so that `ferry bench` and `ferry doctor` print ferry beside them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cuda/copy/copy_engine.h"

typedef struct CUstream_st* cudaStream_t;

namespace ferry::cuda {

struct AllocFreeSeconds {
  double alloc = 0, free = 0;
};

// cudaHostAlloc(bytes) then cudaFreeHost, each timed once (first use in this
// process pays the context creation: call warm_up() first).
AllocFreeSeconds time_cuda_host_alloc(size_t bytes, int device);

// Per-iteration nanoseconds of cudaHostAlloc+cudaFreeHost of `bytes`.
std::vector<uint64_t> time_cuda_host_alloc_free_ns(size_t bytes, int iterations, int device);

// cudaHostRegister of an existing range, then cudaHostUnregister, timed once.
AllocFreeSeconds time_cuda_host_register(void* ptr, size_t bytes, int device);

// Creates the device's primary context so that later timings exclude it.
void warm_up(int device);

// Nanoseconds of each cudaMemcpy (after a warm-up copy).
std::vector<uint64_t> time_cuda_memcpy_ns(void* dst, const void* src, size_t bytes, int iterations);
// Nanoseconds of cudaMemcpyAsync + cudaStreamSynchronize on a non-blocking stream.
std::vector<uint64_t> time_cuda_memcpy_async_ns(void* dst, const void* src, size_t bytes, int iterations);
// Wall nanoseconds of an H2D (host_a -> dev_a) and a D2H (dev_b -> host_b)
// copy run at once from two threads: by `engine` with `strategy`, or by
// cudaMemcpy when engine is nullptr.
std::vector<uint64_t> time_bidirectional_ns(CopyEngine* engine, void* dev_a, const void* host_a, void* host_b,
                                            const void* dev_b, size_t bytes, Strategy strategy, int iterations);

// Nanoseconds of each round of `count` cudaMemcpyAsync calls (one per block)
// on a non-blocking stream, then a stream synchronize.
std::vector<uint64_t> time_memcpy_loop_ns(void* const* dsts, const void* const* srcs, const size_t* sizes,
                                          size_t count, int iterations);

// cudaMemcpyBatchAsync as a KV connector would call it directly (vLLM's
// cuMemcpyBatchAsync path): each list on its own thread and non-blocking
// stream, all started together, one batch call per list per round, then a
// stream synchronize. Per round: the wall nanoseconds until every list is
// done, and the longest CPU time a thread spent in its batch call.
struct BatchList {
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<size_t> sizes;
};
struct BatchTimes {
  std::vector<uint64_t> wall_ns, submit_ns;
};
BatchTimes time_memcpy_batch(const std::vector<BatchList>& lists, int iterations);

// A non-blocking stream, destroyed with the handle (for benchmarks).
class StreamHandle {
 public:
  StreamHandle();
  ~StreamHandle();
  StreamHandle(const StreamHandle&) = delete;
  StreamHandle& operator=(const StreamHandle&) = delete;
  cudaStream_t get() const noexcept { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// Plain allocations for benchmarks and tests (throw on failure).
// device -1: the calling thread's current device (of this runtime copy); else that device,
// the current one left as it was.
void* device_malloc(size_t bytes, int device = -1);
void device_free(void* p);
void* pinned_host_alloc(size_t bytes);
void pinned_host_free(void* p);

}  // namespace ferry::cuda
