// channel.h — the low-latency channel: small copies and signals between the
// CPU and one GPU through a persistent GPU kernel that serves a ring of request
// slots in mapped pinned host memory (no cudaMemcpy, no kernel module).
//
// Protocol (memory layout: channel_layout.h; kernel: channel_kernel.cu)
// ---------------------------------------------------------------------
// Cross-bus rule: the GPU has hostNativeAtomicSupported=0, so host and GPU
// share words only through 8-byte loads and stores (acquire/release or
// relaxed), each word written by one side only. Read-modify-writes happen on
// one side only (host: the ticket counter and slot turns, in ordinary memory).
//
// Submit (host, any thread):
//   1. t = next_ticket++; slot s = t % slots. Wait until slot_turn[s] == t
//      (its previous user copied its result out).
//   2. Write a payload that does not travel inline (writes above 104 bytes)
//      to slot.payload + (device address % 16), then the 32 request words
//      {tag(t), data} with release stores, the op word (kWordOp) last
//      (pack_request() in channel_layout.h).
//   3. seq_cst fence, then ensure a kernel serves (below).
//   4. Poll slot.done (acquire) until its tag is tag(t): spin spin_us, then
//      yield, then sleep 20 us .. 1 ms; every 1 ms check the stream for a
//      device error; past the timeout fail (the channel is then unusable).
//   5. Copy a read's payload out; slot_turn[s] = t + slots (release).
// Serve (kernel, one block): tickets strictly in order. Warp 0 loads the 32
// words of the next ticket's slot in parallel; when all tags match, lane 0
// fences (acquire, system), the block executes the request, __syncthreads(),
// thread 0 release-stores done = {tag(t), result} at system scope.
// So requests complete in ticket order, and a thread's requests in its order.
//
// Idle exit and relaunch (a Dekker handshake on Control::kernel_state, whose
// value is generation << 2 | phase and which only the kernel writes):
//   kernel, idle for idle_us (%globaltimer):
//     state = STOPPING(g); fence.sc.sys; re-read the op word of the next
//     ticket; if published: state = RUNNING(g), keep serving;
//     else: state = STOPPED(g) (release), save next_ticket, exit.
//   host, after publishing (step 3): seq_cst fence; read state, then the
//   last launched generation L:
//     gen(state) < L        -> a kernel launched after this state was written
//                              has not started yet: it will serve.
//     RUNNING(L)            -> served (if that kernel tries to stop, its
//                              re-check comes after our fence and sees us).
//     STOPPING(L)           -> undecided: re-read.
//     STOPPED(L)            -> compare-exchange L -> L+1; the winner launches
//                              generation L+1 on the channel's stream.
//   The fences make "host reads RUNNING/old" and "kernel re-check misses the
//   request" impossible together. Launches on one stream run one after the
//   other, so a relaunch starts after the old kernel is gone; a kernel that
//   finds nothing idles out again. If the next ticket is claimed but not yet
//   published, the kernel may leave; that ticket's owner relaunches.
//
// Coexistence: the kernel leaves after idle_us without requests, so
// cudaDeviceSynchronize() / torch.cuda.synchronize() return once requests stop,
// and a process that exits without close() does not hang. The stream is
// non-blocking (no implicit sync with the legacy stream) and has the device's
// highest priority, so a relaunch gets the next free SM first.
//
// Ordering with CUDA streams: none. The kernel serves a request as soon as it
// is published; it does not wait for work queued on any stream. Device memory
// that a request reads or overwrites must be settled first (stream or event
// synchronize): cudaMemset and kernels are asynchronous, and cudaMemcpy from
// pageable host memory returns before its DMA has landed.
//
// Limits: 1 .. kChannelMaxPayload (64 KiB) bytes per request; larger transfers
// belong to the copy engine. A wait request holds the whole channel until its
// flag is reached or it times out. A request that does not complete within
// timeout_ms (e.g. a GPU saturated by long kernels keeps the relaunched kernel
// off every SM) makes the channel unusable (CudaError): close and recreate it.
//
// Locking: no mutex on the request path (atomics only, listed above); the
// broken-reason string has its own mutex. close() must not race with the
// destructor; it may race with requests of other threads: new requests are
// refused, requests in flight are awaited.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace ferry::cuda {

constexpr size_t kChannelMaxPayload = 64 * 1024;

struct ChannelOptions {
  uint32_t idle_us = 200;       // the kernel leaves after this long without a request; 1 .. 10 s
  uint32_t slots = 8;           // request slots: concurrent requests in flight; 1 .. 64
  uint32_t timeout_ms = 5000;   // a request not done by then fails; 1 .. 3600 s
  uint32_t spin_us = 20;        // callers poll this long before yielding; 0 .. 10 ms
  bool use_gdrcopy = false;     // writes through GDRCopy mappings (NotSupported without it)
};

struct ChannelStats {
  uint64_t requests = 0;        // completed requests (GDRCopy writes included)
  uint64_t launches = 0;        // kernel launches: the first request, then one per relaunch
  uint64_t idle_exits = 0;      // kernels that left because they were idle
  uint64_t gdrcopy_writes = 0;  // writes that went through a GDRCopy mapping
};

class Channel {
 public:
  // Throws InvalidArgument (bad option, quoted), NotSupported (use_gdrcopy
  // without GDRCopy, with the reason), NoDevice, or CudaError/OutOfMemory.
  explicit Channel(int device, const ChannelOptions& options = {});
  ~Channel();  // close(), errors swallowed
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  // Preconditions (InvalidArgument otherwise): 1 <= n <= kChannelMaxPayload;
  // the device range lies inside one allocation of this channel's device
  // (cudaMalloc, cudaMallocManaged, cuMemMap, ...).
  void write(void* device_dst, const void* src, size_t n);
  void read(void* dst, const void* device_src, size_t n);
  void fill(void* device_dst, int value, size_t n);  // value 0..255
  // Stores value to a 4-byte aligned device flag with release semantics at
  // system scope (a kernel that acquires it sees the channel's earlier writes).
  void signal(uint32_t* device_flag, uint32_t value);
  // The kernel waits until *device_flag >= value (unsigned compare, acquire) or
  // timeout_us passes (at most 3600 s); true when the value was reached.
  bool wait(const uint32_t* device_flag, uint32_t value, uint64_t timeout_us);
  // Round trip of an empty request in microseconds (relaunches the kernel if idle).
  double ping();

  ChannelStats stats() const;
  int device() const noexcept;
  const ChannelOptions& options() const noexcept;
  bool closed() const noexcept;

  // Stops the kernel and frees everything; idempotent. Waits for requests in
  // flight. Throws CudaError if the kernel cannot be stopped within timeout_ms
  // (its memory is then deliberately leaked, never freed under a live kernel).
  void close();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::cuda
