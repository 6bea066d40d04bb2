// channel_kernel.cu — the channel's persistent GPU kernel: one block that serves
// the request ring in mapped host memory (layout: channel_layout.h; protocol:
// channel.h).
//
// Polling: warps 0 .. pollers-1 poll the next ticket's slot; lane i loads
// request word i (lane 0 the op word, with an acquire load); when all 32 tags
// match the ticket, the request is complete. Warp w starts w / pollers of a
// PCIe round trip (kPollPeriodNs) after warp 0, so that the warps' loads are
// spread over a round trip and a request is seen sooner after it lands. The
// first warp to see it complete claims the ticket with a block-scope
// compare-and-swap on the shared `decision` word and copies the request into
// shared memory; the other warps leave their poll loop as soon as they see the
// ticket decided. Warp 0 lane 0 alone also reads the stop word (every
// kStopCheckPolls polls) and watches the idle time; it decides an exit through
// the same compare-and-swap, so a ticket is either served once or left,
// unserved, to the next kernel (which starts at the saved next_ticket).
//
// Serving: __syncthreads(), the whole block executes the request,
// __syncthreads(), then thread 0 release-stores the slot's done word at system
// scope (covering every thread's writes before the barrier). Every thread
// holds the same ticket and advances it once per served request; every thread
// passes the same two barriers per request, since a polling warp returns only
// once the ticket is decided.
//
// Ordering: no system-scope fence on the receive path. The host's release
// store of the op word comes after its payload and after every device write
// the request must see; the claiming warp's lane 0 acquire-loads that word
// (ld.acquire.sys: no MEMBAR.SYS, unlike fence.acq_rel.sys), and the other
// threads read after __syncthreads() (block scope; causality order is
// transitive). The other request words need no ordering: each is valid by its
// tag.
//
// Memory accesses: host payload is read with ld.global.cv (never a stale cached
// line) and written with st.global.wt; device memory is read with ld.global.cg
// (L2: this persistent kernel never serves a read from a line its SM's L1 kept
// from an earlier request, whatever wrote the memory since) and written with
// plain stores; 16-byte accesses where source and destination are co-aligned
// (always: the host places payload at payload_offset()), bytes at the edges
// (split_edges()).
#include <cuda/atomic>

#include "cuda/channel_layout.h"

namespace ferry::cuda::channel_layout {
namespace {

constexpr unsigned kThreads = kBlockThreads;
constexpr unsigned kUnroll = 8;  // 16-byte loads in flight per thread: 32 KiB per block
constexpr unsigned kFullWarp = 0xffffffffu;
// Polls between loads of the stop word (warp 0's request polls, a wait's flag
// polls): each is one more PCIe read; close() waits that many polls longer.
constexpr unsigned kStopCheckPolls = 64;
// About one PCIe read round trip from the GPU to mapped host memory: the
// polling warps' start times are spread over it.
constexpr unsigned kPollPeriodNs = 1000;

template <class T>
using SystemRef = ::cuda::atomic_ref<T, ::cuda::thread_scope_system>;
template <class T>
using BlockRef = ::cuda::atomic_ref<T, ::cuda::thread_scope_block>;

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

static_assert(kRequestWords == 32, "one request word per lane of a polling warp");
static_assert(kWordOp == 0, "lane 0 acquires the op word and decides for its warp");
static_assert(kInlineBytes <= kThreads, "one thread per inline byte");
static_assert(kMaxPollers * 32 <= kThreads, "polling warps are warps of the block");

// The request as the claiming warp read it, for the whole block.
struct Request {
  uint32_t word[kRequestWords];  // the data halves (channel_layout.h: Word)
};

// What the block does with the ticket being polled. The shared `decision` word
// holds make_word(ticket, Action) once that ticket is decided, and until then
// make_word(ticket - 1, kServe): the previous ticket was served (an exit ends
// the kernel), or thread 0 set it so at start.
enum Action : uint32_t { kServe = 0, kExit = 1 };
using Decision = unsigned long long;  // atomicCAS_block's type

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
    if (polls % kStopCheckPolls == 0 && stop.load(::cuda::memory_order_relaxed) != 0)
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

// Decides `ticket` for `action`: true when this call decided it, false when
// another warp had already. Relaxed: the claiming warp's shared writes reach
// the block through the __syncthreads() that follows. atomicCAS_block on the
// __shared__ word compiles to ATOMS.CAS.64; atomic_ref's compare_exchange goes
// through a generic address (ATOM.E.CAS.64 with a fallback sequence).
__device__ bool decide(Decision& decision, uint64_t ticket, Action action) {
  const Decision undecided = make_word(ticket - 1, kServe);
  return atomicCAS_block(&decision, undecided, make_word(ticket, action)) == undecided;
}

__device__ bool decided(Decision& decision, uint64_t ticket) {
  return word_tag(BlockRef<Decision>(decision).load(::cuda::memory_order_relaxed)) ==
         ticket_tag(ticket);
}

// Warp 0 lane 0, after a poll that did not find the request complete: leaves
// on a stop request (`stop`: the stop word, or 0 when not read this poll) or
// after idle_ns with the Dekker re-check of channel.h. Either exit is decided
// through decide(), so that a ticket another warp claimed meanwhile is served
// instead. Returns whether the ticket is now decided (leave the poll loop).
__device__ bool stop_or_idle_exit(const KernelParams& p, uint64_t ticket, Slot* slot,
                                  uint64_t stop, uint64_t& idle_since, Decision& decision) {
  SystemRef<uint64_t> state(p.control->kernel_state);
  if (stop != 0) {
    if (decide(decision, ticket, kExit))
      state.store(make_state(p.generation, kPhaseStopped), ::cuda::memory_order_release);
    return true;
  }
  if (global_timer_ns() - idle_since < p.idle_ns) return false;
  // Dekker with the host (channel.h): publish "stopping", fence, re-check.
  state.store(make_state(p.generation, kPhaseStopping), ::cuda::memory_order_relaxed);
  ::cuda::atomic_thread_fence(::cuda::memory_order_seq_cst, ::cuda::thread_scope_system);
  const uint64_t op_word =
      SystemRef<uint64_t>(slot->request[kWordOp]).load(::cuda::memory_order_relaxed);
  if (word_tag(op_word) != ticket_tag(ticket) && decide(decision, ticket, kExit)) {
    const uint64_t exits = ++p.state->idle_exits;
    SystemRef<uint64_t>(p.control->idle_exits).store(exits, ::cuda::memory_order_relaxed);
    state.store(make_state(p.generation, kPhaseStopped), ::cuda::memory_order_release);
    return true;
  }
  // Published meanwhile (our re-check saw it, or another warp claimed it):
  // stay and serve it.
  state.store(make_state(p.generation, kPhaseRunning), ::cuda::memory_order_relaxed);
  idle_since = global_timer_ns();
  return decided(decision, ticket);
}

// Polling warps (warp < p.pollers). Polls the slot of `ticket` until the
// ticket is decided: claimed by this warp (which then fills `request`) or by
// another one, or an exit decided by warp 0. Control flow is warp-uniform
// around the __all_sync / __shfl_sync calls.
__device__ void poll_for_request(const KernelParams& p, uint64_t ticket, uint64_t& idle_since,
                                 Request& request, Decision& decision) {
  const unsigned lane = threadIdx.x & 31u;
  const unsigned warp = threadIdx.x / 32u;
  Slot* slot = p.slots + ticket % p.slot_count;
  const uint32_t tag = ticket_tag(ticket);
  SystemRef<uint64_t> my_word(slot->request[lane]);
  SystemRef<uint64_t> stop_word(p.control->stop);
  // Stagger: warp w polls w / pollers of a round trip after warp 0.
  if (warp != 0) __nanosleep(warp * (kPollPeriodNs / p.pollers));
  for (unsigned polls = 1;; ++polls) {
    // One PCIe round trip per poll: every load below is issued before any is
    // used. Lane 0 acquires the op word (top comment); the other words are
    // valid by their tags alone. The stop word is a second PCIe read: warp 0
    // lane 0 reads it only every kStopCheckPolls polls.
    const uint64_t word = lane == kWordOp ? my_word.load(::cuda::memory_order_acquire)
                                          : my_word.load(::cuda::memory_order_relaxed);
    const bool read_stop = warp == 0 && lane == 0 && polls % kStopCheckPolls == 0;
    const uint64_t stop = read_stop ? stop_word.load(::cuda::memory_order_relaxed) : 0;
    if (__all_sync(kFullWarp, word_tag(word) == tag)) {
      int won = 0;
      if (lane == 0) won = decide(decision, ticket, kServe);
      // Only the winner writes the shared request; a loser leaves it alone.
      if (__shfl_sync(kFullWarp, won, 0)) request.word[lane] = word_data(word);
      return;
    }
    int leave = 0;
    if (lane == 0)
      leave = decided(decision, ticket) ||
              (warp == 0 && stop_or_idle_exit(p, ticket, slot, stop, idle_since, decision));
    if (__shfl_sync(kFullWarp, leave, 0)) return;
  }
}

__global__ void __launch_bounds__(kThreads, 1) channel_kernel(KernelParams p) {
  __shared__ Request request;
  __shared__ Decision decision;  // see Action
  const unsigned tid = threadIdx.x;
  const bool poller = tid / 32u < p.pollers;
  // Every thread holds the same ticket and advances it in step.
  uint64_t ticket = p.state->next_ticket;
  uint64_t idle_since = 0;  // meaningful in thread 0 (warp 0 lane 0)
  if (tid == 0) {
    decision = make_word(ticket - 1, kServe);  // `ticket` undecided
    SystemRef<uint64_t>(p.control->kernel_state)
        .store(make_state(p.generation, kPhaseRunning), ::cuda::memory_order_relaxed);
    idle_since = global_timer_ns();
  }
  __syncthreads();  // `decision` is set before any warp polls
  for (;;) {
    if (poller) poll_for_request(p, ticket, idle_since, request, decision);
    __syncthreads();  // the ticket is decided; if served, `request` is complete
    if (word_data(BlockRef<Decision>(decision).load(::cuda::memory_order_relaxed)) == kExit) break;
    Slot* slot = p.slots + ticket % p.slot_count;
    const uint32_t result = serve(request, slot, p.control);
    // Every thread's writes are done, and every thread has read `decision`
    // before a polling warp decides the next ticket.
    __syncthreads();
    if (tid == 0) {
      SystemRef<uint64_t>(slot->done).store(make_word(ticket, result), ::cuda::memory_order_release);
      idle_since = global_timer_ns();
    }
    ++ticket;
  }
  // The exit left `ticket` unserved: the next kernel starts with it.
  if (tid == 0) p.state->next_ticket = ticket;
}

}  // namespace

int launch_kernel(const KernelParams& params, CUstream_st* stream) {
  if (params.pollers < 1 || params.pollers > kMaxPollers) return cudaErrorInvalidValue;
  KernelParams copy = params;
  void* args[] = {&copy};
  return cudaLaunchKernel(reinterpret_cast<const void*>(&channel_kernel), dim3(1), dim3(kThreads),
                          args, 0, stream);
}

}  // namespace ferry::cuda::channel_layout
