// ipc_ring.h — the node handoff's device ring (node/handoff.h's peer route):
// the CUDA side that the CUDA-free protocol is given.
//
// Consumer: publish() allocates the ring on this process's GPU (cudaMalloc) and
// exports it (cudaIpcGetMemHandle, and the GPU's PCI bus id, so the producer
// finds the same GPU whatever its CUDA_VISIBLE_DEVICES numbering); the
// protocol writes both into the named block, which only this user's processes
// can reach (the node pool's private directory, peer uids checked).
// Producer: map() finds that GPU here (cudaDeviceGetByPCIBusId), checks that
// this process's GPU reaches it (the same GPU, or cudaDeviceCanAccessPeer) and
// opens the handle once (cudaIpcOpenMemHandle, cudaIpcMemLazyEnablePeerAccess);
// where any of that fails it says why and the protocol takes the host slots.
// copy(): one cudaMemcpyBatchAsync on this object's stream (non-blocking, on
// this side's GPU), then cudaStreamSynchronize (start() records an event
// instead, wait() synchronizes it; unmap() synchronizes the stream before it
// closes the mapping, so no copy runs into a closed one): the producer's GPU writes the
// consumer's GPU over NVLink or PCIe P2P; the consumer scatters from its ring
// (device to device, or to host destinations). Where the batch call is refused
// once, copies go one cudaMemcpyAsync each from then on (remembered).
//
// Small blocks (the SM path): with `sms` > 0, where the SM copy kernel
// (copy/block_copy.h) reaches every piece of a batch (memory of this side's
// GPU, or the ring), pieces under kHandoffDmaMinBytes go by that kernel on at
// most `sms` SMs in one launch, and larger ones by the copy engines at the
// same time (one cudaMemcpyBatchAsync). Over NVLink a DMA descriptor costs
// ~5 us: small blocks crossed slowly by the copy engines alone. Two H200s
// (2026-11-28, `ferry bench node --parts handoff`, GB/s end to end, all of a
// batch on one path): 64 KiB blocks 35.1 through the pool, 267 on 16 SMs, 275
// on 32; 600 mixed 64 KiB-2 MiB 119 by DMA, 117 / 208 / 261 / 296 on 4 / 16 /
// 32 / 64 SMs; 2 MiB blocks 291 by DMA, 281 / 270 on 16 / 32 SMs; split
// as above, mixed 262 on 32 SMs and 291 on 64, 64 KiB 259, 2 MiB 259. Batches
// the kernel cannot reach (host memory on a side, another GPU's memory) take
// the copy engines.
//
// Lifetime: free_ring() frees the ring only when the protocol says the producer
// let go of it (CUDA: freeing memory another process still maps is undefined);
// the destructor never frees it (a ring the protocol leaked stays leaked), but
// unmaps a mapping and destroys the stream. No call leaves the caller's current
// device changed. One thread at a time (the Handoff's calling thread); no lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "cuda/copy/op_buffers.h"
#include "node/handoff.h"

typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;

namespace ferry::cuda {

class CopyEngine;

// The pool route's mover for a side with a GPU: start() is the copy engine's
// copy_many_async (pinned pool slots <-> device; host memory on both sides is
// a memcpy) on a non-blocking stream of its own on the engine's device,
// wait() waits for its Completion.
std::unique_ptr<node::HandoffMover> engine_handoff_mover(CopyEngine& engine);

// Whether memory of GPU `to` can be written from GPU `from` (the same GPU, or
// cudaDeviceCanAccessPeer): the peer route's condition, for tests and reports.
bool devices_reach(int from, int to);

// IpcRing's default SMs for the SM path (see above; 0: copy engines only).
inline constexpr int kDefaultHandoffPeerSms = 32;
// Pieces this large or larger go by the copy engines (no SMs), beside the kernel.
inline constexpr size_t kHandoffDmaMinBytes = size_t{1} << 20;

class IpcRing : public node::HandoffDevice {
 public:
  // InvalidArgument for a device this process does not see, or sms outside [0, 1024].
  explicit IpcRing(int device, int sms = kDefaultHandoffPeerSms);
  ~IpcRing() override;
  IpcRing(const IpcRing&) = delete;
  IpcRing& operator=(const IpcRing&) = delete;

  bool on_device(void* const* dsts, size_t n) override;
  char* publish(uint64_t bytes, node::HandoffRingExport* out) override;
  void free_ring() noexcept override;
  char* map(const node::HandoffRingExport& ring, std::string* why) override;
  void unmap() noexcept override;
  void copy(void* const* dsts, const void* const* srcs, const size_t* sizes, size_t n) override;
  uint64_t start(void* const* dsts, const void* const* srcs, const size_t* sizes, size_t n) override;
  void wait(uint64_t ticket) override;
  bool overlaps() const override { return true; }
  uint64_t min_mean_bytes() const override { return sms_ > 0 ? 0 : node::kHandoffPeerMinMeanBytes; }

  int device() const { return device_; }
  int sms() const { return sms_; }
  uint64_t sm_batches() const override { return sm_batches_; }

 private:
  cudaStream_t stream();
  void enqueue(void* const* dsts, const void* const* srcs, const size_t* sizes, size_t n, cudaStream_t s);
  void enqueue_dma(void* const* dsts, const void* const* srcs, const size_t* sizes, size_t n, cudaStream_t s);
  bool sm_reachable(void* const* dsts, const void* const* srcs, const size_t* sizes, size_t n);
  static constexpr uint64_t kEvents = 4;  // tickets in flight at most (the protocol keeps 2)

  int device_;
  int sms_;                 // the SM path's SMs (0: copy engines only)
  cudaStream_t stream_ = nullptr;
  cudaStream_t side_ = nullptr;  // the kernel's, beside stream_'s DMA (made on first use)
  cudaEvent_t fork_ = nullptr, join_ = nullptr;  // stream_ -> side_ -> stream_
  char* ring_ = nullptr;    // consumer: the published ring
  char* mapped_ = nullptr;  // producer: the consumer's ring, mapped here
  uint64_t ring_bytes_ = 0;  // of ring_ or mapped_
  OpBuffers ops_;            // the SM path's block lists (its own lock; no CUDA call under it)
  uint64_t sm_batches_ = 0;
  bool batch_ok_ = true;    // cudaMemcpyBatchAsync accepted (else one cudaMemcpyAsync per piece)
  cudaEvent_t events_[kEvents] = {};  // start(): ticket t records events_[t % kEvents]
  uint64_t next_ticket_ = 0;
};

}  // namespace ferry::cuda
