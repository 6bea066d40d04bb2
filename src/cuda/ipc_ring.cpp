// ipc_ring.cpp — the node handoff's device ring over CUDA IPC (ipc_ring.h).
#include "cuda/ipc_ring.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/copy/copy_engine.h"
#include "cuda/cuda_check.h"
#include "cuda/pointer_lookup.h"
#include "cuda/scoped_device.h"

namespace ferry::cuda {

namespace {

// A non-blocking stream on one device, made on first use, destroyed with the holder.
class OwnStream {
 public:
  explicit OwnStream(int device) : device_(device) {}
  ~OwnStream() {
    if (!stream_) return;
    ScopedDevice keep;
    if (cudaSetDevice(device_) == cudaSuccess) cudaStreamDestroy(stream_);
    cudaGetLastError();
  }
  OwnStream(const OwnStream&) = delete;
  OwnStream& operator=(const OwnStream&) = delete;
  cudaStream_t get() {  // the caller has made device_ current
    if (!stream_) check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    return stream_;
  }

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
};

// engine_handoff_mover's mover: a Completion per ticket, kSlots kept.
class EngineMover : public node::HandoffMover {
 public:
  explicit EngineMover(CopyEngine& engine) : engine_(engine), stream_(engine.options().device) {}
  ~EngineMover() override {
    for (Completion& c : done_) {
      try {
        if (c.valid()) c.wait();  // never free a stream a copy still runs on
      } catch (...) {
      }
    }
  }
  uint64_t start(void* const* d, const void* const* s, const size_t* n, size_t k) override {
    // Host memory on both sides (a consumer whose destinations are an offload
    // tier in host memory, reading a host slot) is a memcpy here: the copy
    // engine moves bytes between host and device only.
    ScopedDevice on(engine_.options().device);  // the lookups and the stream need the context
    std::vector<CopyOp> ops;
    ops.reserve(k);
    PointerLookup lookup;  // one driver query per allocation
    for (size_t i = 0; i < k; ++i) {
      if (n[i] == 0) continue;
      if (lookup.classify(d[i], n[i]) != Memory::device && lookup.classify(s[i], n[i]) != Memory::device)
        std::memcpy(d[i], s[i], n[i]);
      else
        ops.push_back({d[i], s[i], n[i]});
    }
    k = ops.size();
    cudaStream_t st = stream_.get();
    Completion& slot = done_[next_ % kSlots];
    if (slot.valid()) slot.wait();  // the protocol waited for it already: a no-op
    slot = k ? engine_.copy_many_async(ops, st) : Completion();
    return next_++;
  }
  void wait(uint64_t ticket) override {
    if (ticket + kSlots < next_) throw InvalidArgument("EngineMover::wait: ticket " + std::to_string(ticket) + " is too old");
    Completion& c = done_[ticket % kSlots];
    if (!c.valid()) return;
    Completion mine = std::move(c);
    c = Completion();
    mine.wait();
  }

 private:
  static constexpr uint64_t kSlots = 4;
  CopyEngine& engine_;
  OwnStream stream_;  // destroyed after done_ is waited for (declared before it)
  Completion done_[kSlots];
  uint64_t next_ = 0;
};

}  // namespace

std::unique_ptr<node::HandoffMover> engine_handoff_mover(CopyEngine& engine) {
  return std::make_unique<EngineMover>(engine);
}

bool devices_reach(int from, int to) {
  if (from == to) return true;
  int can = 0;
  check(cudaDeviceCanAccessPeer(&can, from, to), "cudaDeviceCanAccessPeer");
  return can != 0;
}

IpcRing::IpcRing(int device, int sms) : device_(device), sms_(sms) {
  if (sms < 0 || sms > 1024)
    throw InvalidArgument("IpcRing: sms=" + std::to_string(sms) + ": expected 0 (copy engines only) to 1024");
  int count = 0;
  check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (device < 0 || device >= count)
    throw InvalidArgument("device=" + std::to_string(device) + ": this process sees " + std::to_string(count) +
                          " CUDA devices");
}

IpcRing::~IpcRing() {
  unmap();
  ScopedDevice keep;
  if (cudaSetDevice(device_) == cudaSuccess) {
    if (stream_) cudaStreamSynchronize(stream_);
    if (side_) cudaStreamSynchronize(side_);
    for (cudaEvent_t e : {events_[0], events_[1], events_[2], events_[3], fork_, join_})
      if (e) cudaEventDestroy(e);
    if (stream_) cudaStreamDestroy(stream_);
    if (side_) cudaStreamDestroy(side_);
  }
  cudaGetLastError();
}

cudaStream_t IpcRing::stream() {
  if (!stream_) check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  return stream_;
}

bool IpcRing::on_device(void* const* dsts, size_t n) {
  PointerLookup lookup;
  for (size_t i = 0; i < n; ++i) {
    const PointerInfo p = lookup.find(dsts[i]);
    if (p.kind != Memory::device || p.device != device_) return false;
  }
  return n > 0;
}

char* IpcRing::publish(uint64_t bytes, node::HandoffRingExport* out) {
  if (ring_) throw InvalidArgument("IpcRing::publish: a ring is already published");
  ScopedDevice on(device_);
  void* p = nullptr;
  check(cudaMalloc(&p, bytes), "cudaMalloc (the handoff's device ring)");
  cudaIpcMemHandle_t handle{};
  const cudaError_t got = cudaIpcGetMemHandle(&handle, p);
  const cudaError_t bus = got == cudaSuccess
                              ? cudaDeviceGetPCIBusId(out->bus_id, static_cast<int>(sizeof out->bus_id), device_)
                              : cudaSuccess;
  if (got != cudaSuccess || bus != cudaSuccess) {
    cudaFree(p);
    cudaGetLastError();
    check(got != cudaSuccess ? got : bus,
          got != cudaSuccess ? "cudaIpcGetMemHandle (the handoff's device ring)" : "cudaDeviceGetPCIBusId");
  }
  static_assert(sizeof handle == node::kHandoffExportBytes, "the ring's export holds one cudaIpcMemHandle_t");
  std::memcpy(out->handle, &handle, sizeof handle);
  out->bus_id[sizeof out->bus_id - 1] = '\0';
  out->bytes = bytes;
  ring_ = static_cast<char*>(p);
  ring_bytes_ = bytes;
  return ring_;
}

void IpcRing::free_ring() noexcept {
  if (!ring_) return;
  ScopedDevice keep;
  if (cudaSetDevice(device_) == cudaSuccess) cudaFree(ring_);
  cudaGetLastError();
  ring_ = nullptr;
}

char* IpcRing::map(const node::HandoffRingExport& ring, std::string* why) {
  if (mapped_) unmap();
  ScopedDevice on(device_);
  int peer = -1;
  if (cudaDeviceGetByPCIBusId(&peer, ring.bus_id) != cudaSuccess) {
    cudaGetLastError();
    *why = "the consumer's GPU (PCI " + std::string(ring.bus_id) + ") is not visible in this process";
    return nullptr;
  }
  if (peer != device_) {
    int can = 0;
    check(cudaDeviceCanAccessPeer(&can, device_, peer), "cudaDeviceCanAccessPeer");
    if (!can) {
      *why = "GPU " + std::to_string(device_) + " cannot reach the consumer's GPU " + std::to_string(peer) +
             " (PCI " + std::string(ring.bus_id) + "): no peer access (NVLink or PCIe P2P)";
      return nullptr;
    }
  }
  cudaIpcMemHandle_t handle;
  std::memcpy(&handle, ring.handle, sizeof handle);
  void* p = nullptr;
  const cudaError_t err = cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess);
  if (err != cudaSuccess) {
    cudaGetLastError();
    *why = "cudaIpcOpenMemHandle of the consumer's ring failed on GPU " + std::to_string(device_) + ": " +
           describe(err);
    return nullptr;
  }
  mapped_ = static_cast<char*>(p);
  ring_bytes_ = ring.bytes;
  return mapped_;
}

void IpcRing::unmap() noexcept {
  if (!mapped_) return;
  ScopedDevice keep;
  if (cudaSetDevice(device_) == cudaSuccess) {
    if (stream_) cudaStreamSynchronize(stream_);  // copies started into the mapping land first
    cudaIpcCloseMemHandle(mapped_);
  }
  cudaGetLastError();
  mapped_ = nullptr;
}

// Whether every piece's both ends are memory of this side's GPU or lie in the
// ring (published or mapped here): what the SM kernel may read and write.
bool IpcRing::sm_reachable(void* const* dsts, const void* const* srcs, const size_t* sizes, size_t n) {
  const char* ring = ring_ ? ring_ : mapped_;
  PointerLookup lookup;  // one driver query per allocation
  auto reachable = [&](const void* p, size_t bytes) {
    const char* c = static_cast<const char*>(p);
    if (ring && c >= ring && bytes <= ring_bytes_ && static_cast<uint64_t>(c - ring) <= ring_bytes_ - bytes)
      return true;
    const PointerInfo info = lookup.find(p);
    return info.kind == Memory::device && info.device == device_ && lookup.device_bytes_after(p) >= bytes;
  };
  for (size_t i = 0; i < n; ++i)
    if (sizes[i] > 0 && (!reachable(dsts[i], sizes[i]) || !reachable(srcs[i], sizes[i]))) return false;
  return true;
}

// Enqueues the batch on s (device_ current). Where sms_ > 0 and the kernel
// reaches every piece: pieces under kHandoffDmaMinBytes by the SM kernel,
// larger ones by the copy engines at the same time (the kernel on side_,
// forked from s and joined back into it, so s's later work waits for both).
// Else every piece by the copy engines (enqueue_dma).
void IpcRing::enqueue(void* const* dsts, const void* const* srcs, const size_t* sizes, size_t n, cudaStream_t s) {
  if (sms_ == 0 || !sm_reachable(dsts, srcs, sizes, n)) return enqueue_dma(dsts, srcs, sizes, n, s);
  std::vector<BlockCopy> small;
  std::vector<void*> bd;
  std::vector<const void*> bs;
  std::vector<size_t> bn;
  for (size_t i = 0; i < n; ++i) {
    if (sizes[i] == 0) continue;
    if (sizes[i] >= kHandoffDmaMinBytes)
      bd.push_back(dsts[i]), bs.push_back(srcs[i]), bn.push_back(sizes[i]);
    else
      small.push_back({dsts[i], srcs[i], sizes[i]});
  }
  if (small.empty()) return enqueue_dma(bd.data(), bs.data(), bn.data(), bd.size(), s);
  ++sm_batches_;
  if (bd.empty()) return launch_listed_copies(ops_, small, s, sms_, 0);  // one launch: a handoff is a transfer
  if (!side_) {
    check(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    check(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    check(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  }
  check(cudaEventRecord(fork_, s), "cudaEventRecord (the handoff's fork)");
  check(cudaStreamWaitEvent(side_, fork_, 0), "cudaStreamWaitEvent (the handoff's fork)");
  launch_listed_copies(ops_, small, side_, sms_, 0);
  check(cudaEventRecord(join_, side_), "cudaEventRecord (the handoff's join)");
  try {
    enqueue_dma(bd.data(), bs.data(), bn.data(), bd.size(), s);
  } catch (...) {
    cudaStreamWaitEvent(s, join_, 0);  // s's later work still waits for the kernel
    throw;
  }
  check(cudaStreamWaitEvent(s, join_, 0), "cudaStreamWaitEvent (the handoff's join)");
}

// One cudaMemcpyBatchAsync on s, or one cudaMemcpyAsync each where the batch
// call was refused (remembered).
void IpcRing::enqueue_dma(void* const* dsts, const void* const* srcs, const size_t* sizes, size_t n,
                          cudaStream_t s) {
  if (n > 1 && batch_ok_) {
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t attr_index = 0;
    std::vector<void*> d(dsts, dsts + n);
    std::vector<const void*> sr(srcs, srcs + n);
    std::vector<size_t> len(sizes, sizes + n);
    const cudaError_t err = cudaMemcpyBatchAsync(d.data(), sr.data(), len.data(), n, &attr, &attr_index, 1, s);
    if (err == cudaSuccess) return;
    cudaGetLastError();
    if (err != cudaErrorNotSupported && err != cudaErrorInvalidValue)
      check(err, "cudaMemcpyBatchAsync (the handoff's device copies)");
    batch_ok_ = false;  // refused here: one copy each from now on
  }
  for (size_t i = 0; i < n; ++i)
    check(cudaMemcpyAsync(dsts[i], srcs[i], sizes[i], cudaMemcpyDefault, s),
          "cudaMemcpyAsync (the handoff's device copies)");
}

void IpcRing::copy(void* const* dsts, const void* const* srcs, const size_t* sizes, size_t n) {
  if (n == 0) return;
  ScopedDevice on(device_);
  cudaStream_t s = stream();
  enqueue(dsts, srcs, sizes, n, s);
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize (the handoff's device copies)");
}

uint64_t IpcRing::start(void* const* dsts, const void* const* srcs, const size_t* sizes, size_t n) {
  ScopedDevice on(device_);
  cudaStream_t s = stream();
  const uint64_t t = next_ticket_;
  cudaEvent_t& e = events_[t % kEvents];
  if (!e) check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  if (n > 0) enqueue(dsts, srcs, sizes, n, s);
  check(cudaEventRecord(e, s), "cudaEventRecord (the handoff's device copies)");
  ++next_ticket_;
  return t;
}

void IpcRing::wait(uint64_t ticket) {
  if (ticket + kEvents < next_ticket_)
    throw InvalidArgument("IpcRing::wait: ticket " + std::to_string(ticket) + " is older than the last " +
                          std::to_string(kEvents));
  check(cudaEventSynchronize(events_[ticket % kEvents]), "cudaEventSynchronize (the handoff's device copies)");
}

}  // namespace ferry::cuda
