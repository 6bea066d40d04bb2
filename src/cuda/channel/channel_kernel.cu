// channel_kernel.cu — the channel's persistent GPU kernel: one block that serves
// the request ring in mapped host memory (layout: channel_layout.h; protocol:
// channel.h).
//
// Warp 0 polls: lane i loads request word i of the next ticket's slot; when all
// 32 tags match the ticket, the request is complete and lane i stores its data
// half to the block's shared copy of the request. Lane 0 then fences (acquire,
// system scope) so that the slot's payload and device memory written before the
// request are visible, and the block serves the request. Completion:
// __syncthreads(), then thread 0 release-stores the slot's done word at system
// scope (covering every thread's writes before the barrier).
//
// Memory accesses: host payload is read with ld.global.cv (never a stale cached
// line) and written with st.global.wt; device memory is read with ld.global.cg
// (L2: this persistent kernel never serves a read from a line its SM's L1 kept
// from an earlier request, whatever wrote the memory since) and written with
// plain stores; 16-byte accesses where source and destination are co-aligned
// (always: the host places payload at payload_offset()), bytes at the edges
// (split_edges()).
#include <cuda/atomic>

#include "cuda/channel/channel_layout.h"

namespace ferry::cuda::channel_layout {
namespace {

constexpr unsigned kThreads = 256;
constexpr unsigned kUnroll = 8;  // 16-byte loads in flight per thread: 32 KiB per block
constexpr unsigned kFullWarp = 0xffffffffu;
constexpr unsigned kWaitPollsPerStopCheck = 64;

template <class T>
using SystemRef = ::cuda::atomic_ref<T, ::cuda::thread_scope_system>;

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

static_assert(kRequestWords == 32, "one request word per lane of warp 0");
static_assert(kInlineBytes <= kThreads, "one thread per inline byte");

// The request as warp 0 read it, for the whole block.
struct Request {
  uint32_t word[kRequestWords];  // the data halves (channel_layout.h: Word)
  uint32_t slot;
};

enum Action : int { kServe = 0, kExit = 1 };

struct HostMemory {
  static __device__ __forceinline__ uint4 load16(const uint4* p) { return __ldcv(p); }
  static __device__ __forceinline__ unsigned char load1(const unsigned char* p) { return __ldcv(p); }
  static __device__ __forceinline__ void store16(uint4* p, uint4 v) { __stwt(p, v); }
  static __device__ __forceinline__ void store1(unsigned char* p, unsigned char v) { __stwt(p, v); }
};

struct DeviceMemory {
  static __device__ __forceinline__ uint4 load16(const uint4* p) { return __ldcg(p); }
  static __device__ __forceinline__ unsigned char load1(const unsigned char* p) { return __ldcg(p); }
  static __device__ __forceinline__ void store16(uint4* p, uint4 v) { *p = v; }
  static __device__ __forceinline__ void store1(unsigned char* p, unsigned char v) { *p = v; }
};

// Whole block. Precondition: dst - src is a multiple of 16.
template <class Src, class Dst>
__device__ void copy_coaligned(unsigned char* dst, const unsigned char* src, uint32_t n) {
  const unsigned tid = threadIdx.x;
  const Edges e = split_edges(reinterpret_cast<uintptr_t>(dst), n);
  if (tid < e.head) Dst::store1(dst + tid, Src::load1(src + tid));
  const uint4* s = reinterpret_cast<const uint4*>(src + e.head);
  uint4* d = reinterpret_cast<uint4*>(dst + e.head);
  for (uint32_t base = 0; base < e.vectors; base += kThreads * kUnroll) {
    uint4 v[kUnroll];
#pragma unroll
    for (unsigned k = 0; k < kUnroll; ++k) {
      const uint32_t i = base + k * kThreads + tid;
      if (i < e.vectors) v[k] = Src::load16(s + i);
    }
#pragma unroll
    for (unsigned k = 0; k < kUnroll; ++k) {
      const uint32_t i = base + k * kThreads + tid;
      if (i < e.vectors) Dst::store16(d + i, v[k]);
    }
  }
  if (tid < n - e.tail) Dst::store1(dst + e.tail + tid, Src::load1(src + e.tail + tid));
}

// Whole block.
__device__ void fill_bytes(unsigned char* dst, unsigned char value, uint32_t n) {
  const unsigned tid = threadIdx.x;
  const Edges e = split_edges(reinterpret_cast<uintptr_t>(dst), n);
  if (tid < e.head) dst[tid] = value;
  const uint32_t b = value * 0x01010101u;
  const uint4 v = make_uint4(b, b, b, b);
  uint4* d = reinterpret_cast<uint4*>(dst + e.head);
  for (uint32_t i = tid; i < e.vectors; i += kThreads) d[i] = v;
  if (tid < n - e.tail) dst[e.tail + tid] = value;
}

// Thread 0 only: waits until *flag >= value (acquire), the timeout, or a stop.
__device__ uint32_t wait_for_flag(uint32_t* flag, uint32_t value, uint32_t timeout_us,
                                  Control* control) {
  SystemRef<uint32_t> f(*flag);
  SystemRef<uint64_t> stop(control->stop);
  const uint64_t deadline = global_timer_ns() + static_cast<uint64_t>(timeout_us) * 1000u;
  for (unsigned polls = 1;; ++polls) {
    if (f.load(::cuda::memory_order_acquire) >= value) return kResultOk;
    if (global_timer_ns() >= deadline) return kResultTimedOut;
    if (polls % kWaitPollsPerStopCheck == 0 && stop.load(::cuda::memory_order_relaxed) != 0)
      return kResultStopped;
    __nanosleep(64);
  }
}

// Whole block; the result of thread 0 is the request's.
__device__ uint32_t serve(const Request& r, Slot* slot, Control* control) {
  const unsigned tid = threadIdx.x;
  const uint32_t op = r.word[kWordOp];
  const uint32_t bytes = r.word[kWordBytes];
  const uint32_t value = r.word[kWordValue];
  if (bytes > kMaxPayload) return kResultBadRequest;
  const uint64_t device_address = request_address(r.word);
  unsigned char* address = reinterpret_cast<unsigned char*>(device_address);
  unsigned char* payload = slot->payload + payload_offset(device_address);
  switch (op) {
    case kOpNop:
      return kResultOk;
    case kOpWrite:
      if (has_inline_payload(op, bytes)) {
        if (tid < bytes) address[tid] = inline_payload(r.word)[tid];
      } else {
        copy_coaligned<HostMemory, DeviceMemory>(address, payload, bytes);
      }
      return kResultOk;
    case kOpRead:
      copy_coaligned<DeviceMemory, HostMemory>(payload, address, bytes);
      return kResultOk;
    case kOpFill:
      fill_bytes(address, static_cast<unsigned char>(value), bytes);
      return kResultOk;
    case kOpSignal:
      if (tid == 0)
        SystemRef<uint32_t>(*reinterpret_cast<uint32_t*>(address))
            .store(value, ::cuda::memory_order_release);
      return kResultOk;
    case kOpWait:
      return tid == 0 ? wait_for_flag(reinterpret_cast<uint32_t*>(address), value,
                                      r.word[kWordTimeoutUs], control)
                      : kResultOk;
    default:
      return kResultBadRequest;
  }
}

// Warp 0 only. Polls the slot of `ticket` until its request is complete
// (kServe, `request` filled), or until the kernel must leave (kExit: idle with
// the Dekker re-check of channel.h, or a stop request).
__device__ Action poll_for_request(const KernelParams& p, uint64_t ticket, uint64_t& idle_since,
                                   Request& request) {
  const unsigned lane = threadIdx.x & 31u;
  const uint32_t slot_index = static_cast<uint32_t>(ticket % p.slot_count);
  Slot* slot = p.slots + slot_index;
  const uint32_t tag = ticket_tag(ticket);
  SystemRef<uint64_t> my_word(slot->request[lane]);
  SystemRef<uint64_t> stop_word(p.control->stop);
  for (;;) {
    // Both loads are issued before either is used: one PCIe round trip per poll
    // (every lane loads the stop word: no branch for the compiler to wait before).
    const uint64_t word = my_word.load(::cuda::memory_order_relaxed);
    const uint64_t stop = stop_word.load(::cuda::memory_order_relaxed);
    if (__all_sync(kFullWarp, word_tag(word) == tag)) {
      request.word[lane] = word_data(word);
      if (lane == 0) {
        // The host's store of kWordOp came after its payload and after every
        // device write it wants this request to see: acquire them.
        ::cuda::atomic_thread_fence(::cuda::memory_order_acquire, ::cuda::thread_scope_system);
        request.slot = slot_index;
      }
      __syncwarp();
      return kServe;
    }
    int leave = 0;
    if (lane == 0) {
      SystemRef<uint64_t> state(p.control->kernel_state);
      if (stop != 0) {
        state.store(make_state(p.generation, kPhaseStopped), ::cuda::memory_order_release);
        leave = 1;
      } else if (global_timer_ns() - idle_since >= p.idle_ns) {
        // Dekker with the host (channel.h): publish "stopping", fence, re-check.
        state.store(make_state(p.generation, kPhaseStopping), ::cuda::memory_order_relaxed);
        ::cuda::atomic_thread_fence(::cuda::memory_order_seq_cst, ::cuda::thread_scope_system);
        const uint64_t op_word =
            SystemRef<uint64_t>(slot->request[kWordOp]).load(::cuda::memory_order_relaxed);
        if (word_tag(op_word) == tag) {
          // Published meanwhile: stay and read the rest of it.
          state.store(make_state(p.generation, kPhaseRunning), ::cuda::memory_order_relaxed);
          idle_since = global_timer_ns();
        } else {
          const uint64_t exits = ++p.state->idle_exits;
          SystemRef<uint64_t>(p.control->idle_exits).store(exits, ::cuda::memory_order_relaxed);
          state.store(make_state(p.generation, kPhaseStopped), ::cuda::memory_order_release);
          leave = 1;
        }
      }
    }
    if (__shfl_sync(kFullWarp, leave, 0)) return kExit;
  }
}

__global__ void __launch_bounds__(kThreads, 1) channel_kernel(KernelParams p) {
  __shared__ Request request;
  __shared__ int action;
  const unsigned tid = threadIdx.x;
  const bool poller = tid < 32;
  uint64_t ticket = 0;      // meaningful in warp 0
  uint64_t idle_since = 0;  // meaningful in lane 0
  if (poller) {
    ticket = p.state->next_ticket;
    if (tid == 0) {
      SystemRef<uint64_t>(p.control->kernel_state)
          .store(make_state(p.generation, kPhaseRunning), ::cuda::memory_order_relaxed);
      idle_since = global_timer_ns();
    }
  }
  for (;;) {
    if (poller) {
      const Action a = poll_for_request(p, ticket, idle_since, request);
      if (tid == 0) action = a;
    }
    __syncthreads();
    if (action == kExit) break;
    Slot* slot = p.slots + request.slot;
    const uint32_t result = serve(request, slot, p.control);
    __syncthreads();
    if (tid == 0) {
      SystemRef<uint64_t>(slot->done).store(make_word(ticket, result), ::cuda::memory_order_release);
      idle_since = global_timer_ns();
    }
    if (poller) ++ticket;
  }
  if (tid == 0) p.state->next_ticket = ticket;
}

}  // namespace

int launch_kernel(const KernelParams& params, CUstream_st* stream) {
  KernelParams copy = params;
  void* args[] = {&copy};
  return cudaLaunchKernel(reinterpret_cast<const void*>(&channel_kernel), dim3(1), dim3(kThreads),
                          args, 0, stream);
}

}  // namespace ferry::cuda::channel_layout
