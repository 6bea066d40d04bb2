// managed_allocator.cpp — the device, managed and managed_pool allocators (see
// managed_allocator.h). Thin over the CUDA runtime: every call's return code is
// checked (cuda_check.h) and becomes a ferry::Error; the policy lives in the
// pure layers (managed/managed_pool.*, managed/managed_options.*).
#include "cuda/managed/managed_allocator.h"

#include <dlfcn.h>

#include <array>
#include <exception>
#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "cuda/cuda_check.h"
#include "cuda/event_pool.h"
#include "cuda/scoped_device.h"
#include "managed/managed_pool.h"
#include "pool/stats.h"

namespace ferry::cuda {

namespace {

constexpr int kMaxDevices = 64;

// Returns `device`; InvalidArgument when no device can have that index.
int check_device_index(int device) {
  if (device < 0 || device >= kMaxDevices)
    throw InvalidArgument("device " + std::to_string(device) + " is out of range (0.." +
                          std::to_string(kMaxDevices - 1) + ")");
  return device;
}

// Makes `device` current for the scope (ScopedDevice) after checking its index.
class DeviceGuard : public ScopedDevice {
 public:
  explicit DeviceGuard(int device) : ScopedDevice(check_device_index(device)) {}
};

cudaMemLocation on_device(int device) {
  cudaMemLocation l{};
  l.type = cudaMemLocationTypeDevice;
  l.id = device;
  return l;
}

// CUDA 13 takes a cudaMemLocation; 12.x had it only as the _v2 names.
void prefetch_to_device(const void* p, size_t n, int device, cudaStream_t stream) {
#if CUDART_VERSION >= 13000
  check(cudaMemPrefetchAsync(p, n, on_device(device), 0, stream), "cudaMemPrefetchAsync");
#else
  check(cudaMemPrefetchAsync_v2(p, n, on_device(device), 0, stream), "cudaMemPrefetchAsync_v2");
#endif
}

void advise_one(const void* p, size_t n, cudaMemoryAdvise advice, int device, const char* call) {
#if CUDART_VERSION >= 13000
  check(cudaMemAdvise(p, n, advice, on_device(device)), call);
#else
  check(cudaMemAdvise_v2(p, n, advice, on_device(device)), call);
#endif
}

void advise(const void* p, size_t n, int device, const ManagedOptions& o) {
  if (o.preferred_location)
    advise_one(p, n, cudaMemAdviseSetPreferredLocation, device, "cudaMemAdvise(SetPreferredLocation)");
  if (o.accessed_by) advise_one(p, n, cudaMemAdviseSetAccessedBy, device, "cudaMemAdvise(SetAccessedBy)");
  if (o.read_mostly) advise_one(p, n, cudaMemAdviseSetReadMostly, device, "cudaMemAdvise(SetReadMostly)");
}

std::string who(ManagedKind kind, int device) {
  return std::string("ferry ") + managed_kind_name(kind) + " allocator on device " + std::to_string(device);
}

// ---- per-device facts and the managed-memory budget ------------------------------

struct DeviceFacts {
  std::once_flag once;
  int concurrent_managed_access = 0;
  std::exception_ptr error;  // set when the query failed (then every use rethrows it)
  std::mutex budget_mu;                    // serializes check + cudaMallocManaged
  std::atomic<uint64_t> live_managed{0};   // managed bytes ferry holds here (all allocators)
};

std::array<DeviceFacts, kMaxDevices>& facts() {
  static auto* f = new std::array<DeviceFacts, kMaxDevices>();  // never destroyed
  return *f;
}

DeviceFacts& facts_of(int device) {
  check_device_index(device);
  DeviceFacts& f = facts()[static_cast<size_t>(device)];
  std::call_once(f.once, [&] {
    cudaError_t e = cudaDeviceGetAttribute(&f.concurrent_managed_access,
                                           cudaDevAttrConcurrentManagedAccess, device);
    if (e != cudaSuccess) {
      try {
        check(e, "cudaDeviceGetAttribute(ConcurrentManagedAccess)");
      } catch (...) {
        f.error = std::current_exception();
      }
    }
  });
  if (f.error) std::rethrow_exception(f.error);
  return f;
}

void require_managed_hints(ManagedKind kind, int device, const ManagedOptions& o) {
  if (o.prefetch == PrefetchMode::none && !o.any_advice()) return;
  if (!facts_of(device).concurrent_managed_access)
    throw NotSupported(who(kind, device) +
                       ": prefetch and advice need a device with concurrentManagedAccess=1 (this one "
                       "reports 0); configure prefetch=0 and advise=none");
}

// cudaMallocManaged of n bytes after the oversubscription guard. Current
// device must be `device`.
void* managed_malloc(ManagedKind kind, size_t n, int device, bool oversubscribe) {
  DeviceFacts& f = facts_of(device);
  std::lock_guard lk(f.budget_mu);
  if (!oversubscribe) {
    size_t free_bytes = 0, total_bytes = 0;
    check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    check_managed_budget(n, free_bytes, total_bytes, f.live_managed.load(), false, who(kind, device));
  }
  void* p = nullptr;
  check(cudaMallocManaged(&p, n, cudaMemAttachGlobal), "cudaMallocManaged");
  f.live_managed += n;
  return p;
}

void managed_free_noexcept(void* p, size_t n, int device, std::string* error) noexcept {
  cudaError_t e = cudaFree(p);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (error) *error = "cudaFree failed: " + describe(e);
  }
  if (device >= 0 && device < kMaxDevices) facts()[static_cast<size_t>(device)].live_managed -= n;
}

// ---- events as fences --------------------------------------------------------------

class EventFence : public Fence {
 public:
  EventFence(cudaEvent_t e, EventPool* cache) : e_(e), cache_(cache) {}
  ~EventFence() override { cache_->give(e_); }
  bool ready() noexcept override {
    cudaError_t r = cudaEventQuery(e_);
    if (r == cudaSuccess) return true;
    cudaGetLastError();  // NotReady, or an error: either way not known to be done
    return false;
  }
  bool order_before(StreamId stream) noexcept override {
    cudaError_t r = cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(stream), e_, 0);
    if (r == cudaSuccess) return true;
    cudaGetLastError();
    return false;
  }

 private:
  cudaEvent_t e_;
  EventPool* cache_;
};

// For a free whose stream could be neither recorded nor synchronized (a broken
// context): the block stays reusable by its own stream only.
class NeverReady : public Fence {
 public:
  bool ready() noexcept override { return false; }
  bool order_before(StreamId) noexcept override { return false; }
};

// ---- the allocators ------------------------------------------------------------------

struct Record {
  size_t bytes = 0;
  int device = 0;
};

struct Acct {
  Counter allocated, requested;
  uint64_t allocations = 0, frees = 0, prefetched_bytes = 0, prefetches = 0;
};

class Allocator {
 public:
  explicit Allocator(ManagedKind kind) : kind_(kind), opts_(default_managed_options(kind)) {}
  virtual ~Allocator() = default;

  virtual void configure(const ManagedOptions& o) {
    std::lock_guard lk(mu_);
    opts_ = o;
  }
  ManagedOptions options() const {
    std::lock_guard lk(mu_);
    return opts_;
  }
  virtual void* allocate(size_t n, int device, cudaStream_t stream) = 0;
  virtual void deallocate(void* p, int device, cudaStream_t stream) = 0;
  virtual size_t trim(int) { return 0; }
  virtual ManagedStats stats(int device) const {
    std::lock_guard lk(mu_);
    ManagedStats s;
    for (int d = 0; d < kMaxDevices; ++d) {
      if (device != -1 && d != device) continue;
      const Acct& a = acct_[static_cast<size_t>(d)];
      s.allocated += a.allocated.current;
      s.allocated_peak += a.allocated.peak;
      s.requested += a.requested.current;
      s.allocations += a.allocations;
      s.frees += a.frees;
      s.prefetched_bytes += a.prefetched_bytes;
      s.prefetches += a.prefetches;
    }
    s.reserved = s.allocated;
    s.reserved_peak = s.allocated_peak;
    s.failures = failures_;
    return s;
  }
  void record_failure(const std::string& m, bool allocation) noexcept {
    std::lock_guard lk(mu_);
    if (allocation) ++failures_;
    try {
      last_failure_ = m;
    } catch (...) {
    }
  }
  std::string last_failure() const {
    std::lock_guard lk(mu_);
    return last_failure_;
  }

 protected:
  // Records a live allocation that `allocate` made (bytes both held and asked).
  void remember(void* p, size_t n, int device, size_t prefetched) {
    std::lock_guard lk(mu_);
    live_.emplace(p, Record{n, device});
    Acct& a = acct_[static_cast<size_t>(device)];
    counter_add(a.allocated, n);
    counter_add(a.requested, n);
    ++a.allocations;
    if (prefetched) {
      a.prefetched_bytes += prefetched;
      ++a.prefetches;
    }
  }
  Record forget(void* p) {
    std::lock_guard lk(mu_);
    auto it = live_.find(p);
    if (it == live_.end())
      throw InvalidArgument(std::string("ferry ") + managed_kind_name(kind_) + " allocator: " + format_address(p) +
                            " is not one of its live allocations (foreign pointer or double free)");
    Record r = it->second;
    live_.erase(it);
    Acct& a = acct_[static_cast<size_t>(r.device)];
    counter_sub(a.allocated, r.bytes);
    counter_sub(a.requested, r.bytes);
    ++a.frees;
    return r;
  }

  const ManagedKind kind_;
  mutable std::mutex mu_;  // protects everything below
  ManagedOptions opts_;
  std::unordered_map<void*, Record> live_;
  std::array<Acct, kMaxDevices> acct_{};
  uint64_t failures_ = 0;
  std::string last_failure_;
};

class DeviceAllocator final : public Allocator {
 public:
  DeviceAllocator() : Allocator(ManagedKind::device) {}
  void* allocate(size_t n, int device, cudaStream_t) override {
    DeviceGuard g(device);
    void* p = nullptr;
    check(cudaMalloc(&p, n), "cudaMalloc");
    try {
      remember(p, n, device, 0);
    } catch (...) {
      if (cudaFree(p) != cudaSuccess) cudaGetLastError();
      throw;
    }
    return p;
  }
  void deallocate(void* p, int, cudaStream_t) override {
    Record r = forget(p);
    DeviceGuard g(r.device);
    check(cudaFree(p), "cudaFree");  // synchronizes the device, as the study's baseline did
  }
};

class ManagedAllocator final : public Allocator {
 public:
  ManagedAllocator() : Allocator(ManagedKind::managed) {}
  void* allocate(size_t n, int device, cudaStream_t stream) override {
    const ManagedOptions o = options();
    DeviceGuard g(device);
    require_managed_hints(kind_, device, o);
    void* p = managed_malloc(kind_, n, device, o.oversubscribe);
    size_t prefetched = 0;
    try {
      advise(p, n, device, o);
      if (o.prefetch != PrefetchMode::none) {
        prefetch_to_device(p, n, device, stream);
        prefetched = n;
      }
      remember(p, n, device, prefetched);
    } catch (...) {
      managed_free_noexcept(p, n, device, nullptr);
      throw;
    }
    return p;
  }
  void deallocate(void* p, int, cudaStream_t) override {
    Record r = forget(p);
    DeviceGuard g(r.device);
    std::string error;
    managed_free_noexcept(p, r.bytes, r.device, &error);
    if (!error.empty()) throw CudaError(error, 0);
  }
};

class PoolAllocator final : public Allocator {
 public:
  PoolAllocator() : Allocator(ManagedKind::managed_pool) {}

  void configure(const ManagedOptions& o) override {
    Allocator::configure(o);
    std::lock_guard lk(devices_mu_);
    for (auto& d : devices_)
      if (d) d->pool->set_options(pool_options(o));
  }

  void* allocate(size_t n, int device, cudaStream_t stream) override {
    const ManagedOptions o = options();
    DeviceGuard g(device);
    require_managed_hints(kind_, device, o);
    PerDevice& d = per_device(device);
    ManagedPool::Block b = d.pool->allocate(n, reinterpret_cast<StreamId>(stream));
    if (o.prefetch == PrefetchMode::alloc && b.prefetch_bytes) {
      try {
        prefetch_to_device(b.prefetch_ptr, b.prefetch_bytes, device, stream);
      } catch (...) {
        // Nothing was enqueued. The granules stay marked: they fault in on first use.
        d.pool->deallocate(b.ptr, reinterpret_cast<StreamId>(stream), nullptr);
        throw;
      }
      d.pool->note_prefetch(b.prefetch_bytes);
    }
    return b.ptr;
  }

  void deallocate(void* p, int device, cudaStream_t stream) override {
    PerDevice& d = per_device(device);
    if (d.pool->allocation_size(p) == 0)
      throw InvalidArgument(who(kind_, device) + ": " + format_address(p) +
                            " is not one of its live allocations (foreign pointer, wrong device or "
                            "double free)");
    d.pool->deallocate(p, reinterpret_cast<StreamId>(stream), fence(d, device, stream));
  }

  size_t trim(int device) override {
    size_t bytes = 0;
    for (int dev = 0; dev < kMaxDevices; ++dev) {
      if (device != -1 && dev != device) continue;
      PerDevice* d = existing(dev);
      if (!d) continue;
      bytes += d->pool->trim();  // the chunk source's release sets the device
    }
    return bytes;
  }

  ManagedStats stats(int device) const override {
    ManagedStats s;
    {
      std::lock_guard lk(mu_);
      s.failures = failures_;
    }
    for (int dev = 0; dev < kMaxDevices; ++dev) {
      if (device != -1 && dev != device) continue;
      PerDevice* d = existing(dev);
      if (!d) continue;
      ManagedPoolStats p = d->pool->stats();
      s.allocated += p.allocated.current;
      s.allocated_peak += p.allocated.peak;
      s.requested += p.requested.current;
      s.reserved += p.reserved.current;
      s.reserved_peak += p.reserved.peak;
      s.allocations += p.allocations;
      s.frees += p.frees;
      s.prefetched_bytes += p.prefetched_bytes;
      s.prefetches += p.prefetches;
      s.chunks += p.chunks;
      s.reuse_same_stream += p.reuse_same_stream;
      s.reuse_after_fence += p.reuse_after_fence;
      s.reuse_by_wait += p.reuse_by_wait;
    }
    return s;
  }

 private:
  struct PerDevice {
    EventPool events;
    std::unique_ptr<ManagedPool> pool;
  };

  static ManagedPoolOptions pool_options(const ManagedOptions& o) {
    ManagedPoolOptions p;
    p.chunk_bytes = o.chunk_bytes;
    p.stream_wait = o.stream_wait;
    return p;
  }

  PerDevice* existing(int device) const {
    std::lock_guard lk(devices_mu_);
    return devices_[static_cast<size_t>(device)].get();
  }

  PerDevice& per_device(int device) {
    check_device_index(device);
    std::lock_guard lk(devices_mu_);
    auto& slot = devices_[static_cast<size_t>(device)];
    if (!slot) {
      auto d = std::make_unique<PerDevice>();
      ChunkSource src{
          [this, device](size_t bytes, StreamId stream) -> void* { return obtain(bytes, device, stream); },
          [device](void* base, size_t bytes) {
            std::string error;
            std::unique_ptr<DeviceGuard> g;
            try {
              g = std::make_unique<DeviceGuard>(device);
            } catch (...) {  // cudaFree of managed memory works from any device
            }
            managed_free_noexcept(base, bytes, device, &error);
            if (!error.empty()) std::fprintf(stderr, "ferry: managed_pool: %s\n", error.c_str());
          }};
      d->pool = std::make_unique<ManagedPool>(pool_options(options()), std::move(src));
      slot = std::move(d);
    }
    return *slot;
  }

  // A new chunk: guard, cudaMallocManaged, advice, and prefetch=chunk.
  void* obtain(size_t bytes, int device, StreamId stream) {
    const ManagedOptions o = options();
    DeviceGuard g(device);
    void* p = managed_malloc(kind_, bytes, device, o.oversubscribe);
    try {
      advise(p, bytes, device, o);
      if (o.prefetch == PrefetchMode::chunk) {
        prefetch_to_device(p, bytes, device, reinterpret_cast<cudaStream_t>(stream));
        if (PerDevice* d = existing(device)) d->pool->note_prefetch(bytes);
      }
    } catch (...) {
      managed_free_noexcept(p, bytes, device, nullptr);
      throw;
    }
    return p;
  }

  // An event recorded on the freeing stream. If that fails, the stream is
  // synchronized instead (no fence needed); if that fails too, the block is
  // left to its own stream (NeverReady).
  std::unique_ptr<Fence> fence(PerDevice& d, int device, cudaStream_t stream) noexcept {
    try {
      DeviceGuard g(device);
      cudaEvent_t e = d.events.take();
      cudaError_t r = cudaEventRecord(e, stream);
      if (r == cudaSuccess) return std::make_unique<EventFence>(e, &d.events);
      cudaGetLastError();
      d.events.give(e);
    } catch (...) {
    }
    if (cudaStreamSynchronize(stream) == cudaSuccess) return nullptr;
    cudaGetLastError();
    try {
      return std::make_unique<NeverReady>();
    } catch (...) {
      return nullptr;  // out of host memory as well: nothing better is left
    }
  }

  mutable std::mutex devices_mu_;  // protects devices_ (the slots; pools lock themselves)
  std::array<std::unique_ptr<PerDevice>, kMaxDevices> devices_;
};

Allocator& allocator(ManagedKind kind) {
  // Never destroyed (see the header).
  static DeviceAllocator* device = new DeviceAllocator();
  static ManagedAllocator* managed = new ManagedAllocator();
  static PoolAllocator* pool = new PoolAllocator();
  switch (kind) {
    case ManagedKind::device: return *device;
    case ManagedKind::managed: return *managed;
    case ManagedKind::managed_pool: return *pool;
  }
  throw InvalidArgument("unknown allocator kind");
}

}  // namespace

void managed_configure(ManagedKind kind, std::string_view options) {
  allocator(kind).configure(parse_managed_options(kind, options));
}

std::string managed_options_text(ManagedKind kind) { return allocator(kind).options().text(kind); }

void* managed_allocate(ManagedKind kind, size_t n, int device, cudaStream_t stream) {
  if (n == 0) throw InvalidArgument("managed_allocate: 0 bytes");
  return allocator(kind).allocate(n, device, stream);
}

bool managed_deallocate(ManagedKind kind, void* p, int device, cudaStream_t stream, std::string* error) noexcept {
  try {
    try {
      allocator(kind).deallocate(p, device, stream);
      return true;
    } catch (const std::exception& e) {
      *error = e.what();
    }
  } catch (...) {  // copying the message failed (out of host memory)
  }
  return false;
}

size_t managed_trim(ManagedKind kind, int device) {
  if (device != -1) check_device_index(device);
  return allocator(kind).trim(device);
}

ManagedStats managed_stats(ManagedKind kind, int device) {
  if (device != -1) check_device_index(device);
  return allocator(kind).stats(device);
}

void managed_record_failure(ManagedKind kind, const std::string& message, bool allocation) noexcept {
  try {
    allocator(kind).record_failure(message, allocation);
  } catch (...) {
  }
}

std::string managed_last_failure(ManagedKind kind) { return allocator(kind).last_failure(); }

std::string library_path() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&library_path), &info) && info.dli_fname) return info.dli_fname;
  return "";
}

}  // namespace ferry::cuda
