// file_loader.cpp — DeviceTarget (pinned slots, the load stream, events per
// slot, registered file regions on the map stream) and Loader::load.
#include "cuda/load/file_loader.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <thread>

#include "core/error.h"
#include "core/fork.h"
#include "core/options.h"
#include "core/worker_pool.h"
#include "cuda/cuda_check.h"
#include "cuda/device.h"
#include "cuda/pinned_pool.h"
#include "cuda/scoped_device.h"
#include "os/file.h"
#include "pool/pool.h"

namespace ferry::cuda {
namespace {

constexpr size_t kMergeGap = size_t{64} << 10;

double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Slot i is free for a new fill once slot_done[i] (recorded after the fill's
// DMAs on the load stream) has completed. A registered region is released
// once its event on the map stream has completed.
class DeviceTarget final : public load::Target {
 public:
  explicit DeviceTarget(const LoaderOptions& o);
  ~DeviceTarget() override;

  size_t slot_count() const override { return slots_.size(); }
  size_t slot_bytes() const override { return slot_bytes_; }
  unsigned char* slot(size_t i) const override { return slots_[i]; }
  void wait_slot_free(size_t i) override {
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaEventSynchronize(slot_done_[i]), "cudaEventSynchronize (staging slot)");
  }
  void copy_out(size_t, const unsigned char* src, uintptr_t dst, size_t n) override {
    check(cudaMemcpyAsync(reinterpret_cast<void*>(dst), src, n, cudaMemcpyHostToDevice, stream_),
          "cudaMemcpyAsync (staging slot -> device)");
  }
  void slot_filled(size_t i) override { check(cudaEventRecord(slot_done_[i], stream_), "cudaEventRecord"); }
  void* map_begin(const void* base, size_t bytes, std::string* refused) override;
  void copy_mapped(const void* src, uintptr_t dst, size_t n) override {
    check(cudaMemcpyAsync(reinterpret_cast<void*>(dst), src, n, cudaMemcpyHostToDevice, map_stream_),
          "cudaMemcpyAsync (registered file pages -> device)");
  }
  void map_end(void* handle) override;
  void finish() override;
  void abort() noexcept override;

  // Orders this load's streams after the work queued on `caller`.
  void begin(cudaStream_t caller);
  uint64_t registrations = 0;  // these three: mapped worker, then the load's thread
  double register_s = 0, unregister_s = 0;

 private:
  struct Region {
    const void* base;
    size_t bytes;
    cudaEvent_t done;
  };
  void release_front() noexcept;
  void release_all() noexcept;
  void destroy() noexcept;  // the destructor's work, also for a failed constructor

  int device_;
  size_t slot_bytes_;
  size_t inflight_limit_;
  std::unique_ptr<Pool> pool_;
  std::vector<unsigned char*> slots_;
  std::vector<cudaEvent_t> slot_done_;
  cudaStream_t stream_ = nullptr;      // staged DMAs
  cudaStream_t map_stream_ = nullptr;  // DMAs from registered file pages
  // Registered regions whose DMAs may still run, oldest first. Only the
  // mapped worker touches them during a load, the load's thread after it.
  std::deque<Region> regions_;
  size_t region_bytes_ = 0;
};

DeviceTarget::DeviceTarget(const LoaderOptions& o)
    : device_(o.device), slot_bytes_(o.slot_bytes), inflight_limit_(o.mapped_inflight_bytes) {
  const size_t count = o.staging_bytes / o.slot_bytes;
  PoolOptions po = PoolOptions::from_environment();
  po.chunk_bytes = std::max(po.chunk_bytes, (o.slot_bytes + (size_t{2} << 20) - 1) & ~((size_t{2} << 20) - 1));
  po.target_bytes = 0;
  po.zero_recycled = false;
  po.release_delay_ms = 0;
  pool_ = make_pinned_pool(po, device_);  // NoDevice without a GPU
  try {
    set_device(device_);
    for (size_t i = 0; i < count; ++i) {
      slots_.push_back(static_cast<unsigned char*>(pool_->allocate(slot_bytes_, os::kDirectIoAlignment, HugeWant::yes)));
      cudaEvent_t e = nullptr;  // readers sleep on it (spinning would take the cores pread needs)
      check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventBlockingSync), "cudaEventCreate");
      slot_done_.push_back(e);
    }
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    check(cudaStreamCreateWithFlags(&map_stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  } catch (...) {
    destroy();
    throw;
  }
}

DeviceTarget::~DeviceTarget() { destroy(); }

void DeviceTarget::destroy() noexcept {
  ScopedDevice restore;
  cudaSetDevice(device_);
  release_all();
  if (stream_) cudaStreamSynchronize(stream_), cudaStreamDestroy(stream_);
  if (map_stream_) cudaStreamSynchronize(map_stream_), cudaStreamDestroy(map_stream_);
  stream_ = map_stream_ = nullptr;
  for (cudaEvent_t e : slot_done_) cudaEventDestroy(e);
  slot_done_.clear();
  for (unsigned char* p : slots_) {
    try {
      pool_->deallocate(p);
    } catch (...) {  // cannot happen: the pool handed out p
    }
  }
  slots_.clear();
  cudaGetLastError();
}

void DeviceTarget::begin(cudaStream_t caller) {
  check(cudaSetDevice(device_), "cudaSetDevice");
  // A stream of another device would fail below as "invalid resource handle": say what is wrong.
  int stream_device = device_;
  if (caller && cudaStreamGetDevice(caller, &stream_device) == cudaSuccess && stream_device != device_)
    throw InvalidArgument("the stream is one of cuda:" + std::to_string(stream_device) + "; this loader serves cuda:" +
                          std::to_string(device_) + " (pass a stream of its device, or none)");
  cudaGetLastError();
  cudaEvent_t ready = nullptr;
  check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
  cudaError_t err = cudaEventRecord(ready, caller);
  if (err == cudaSuccess) err = cudaStreamWaitEvent(stream_, ready, 0);
  if (err == cudaSuccess) err = cudaStreamWaitEvent(map_stream_, ready, 0);
  cudaEventDestroy(ready);  // the waits are enqueued; destroying the event does not undo them
  check(err, "ordering the load after the caller's stream (cudaEventRecord / cudaStreamWaitEvent)");
  registrations = 0;
  register_s = unregister_s = 0;
}

void* DeviceTarget::map_begin(const void* base, size_t bytes, std::string* refused) {
  check(cudaSetDevice(device_), "cudaSetDevice");
  while (!regions_.empty() && cudaEventQuery(regions_.front().done) == cudaSuccess) release_front();
  while (!regions_.empty() && region_bytes_ + bytes > inflight_limit_) {
    cudaEventSynchronize(regions_.front().done);
    release_front();
  }
  const auto t0 = std::chrono::steady_clock::now();
  cudaError_t err = cudaHostRegister(const_cast<void*>(base), bytes, cudaHostRegisterReadOnly);
  register_s += since(t0);
  if (err != cudaSuccess) {
    cudaGetLastError();
    *refused = "cudaHostRegister(" + format_bytes(bytes) + " of a read-only file mapping, ReadOnly) failed: " +
               describe(err);
    return nullptr;
  }
  Region r{base, bytes, nullptr};
  err = cudaEventCreateWithFlags(&r.done, cudaEventDisableTiming | cudaEventBlockingSync);
  if (err != cudaSuccess) {
    cudaHostUnregister(const_cast<void*>(base));
    check(err, "cudaEventCreate");
  }
  ++registrations;
  regions_.push_back(r);
  region_bytes_ += bytes;
  return &regions_.back();
}

void DeviceTarget::map_end(void* handle) {
  // The handle is the newest region (the mapped worker handles one at a time).
  if (regions_.empty() || handle != &regions_.back())
    throw InvalidArgument("DeviceTarget::map_end: not the region map_begin returned last");
  check(cudaEventRecord(regions_.back().done, map_stream_), "cudaEventRecord (registered region)");
}

void DeviceTarget::release_front() noexcept {
  Region r = regions_.front();
  regions_.pop_front();
  region_bytes_ -= r.bytes;
  const auto t0 = std::chrono::steady_clock::now();
  cudaHostUnregister(const_cast<void*>(r.base));
  unregister_s += since(t0);
  cudaEventDestroy(r.done);
}

void DeviceTarget::release_all() noexcept {
  if (!regions_.empty() && map_stream_) cudaStreamSynchronize(map_stream_);
  while (!regions_.empty()) release_front();
}

void DeviceTarget::finish() {
  check(cudaSetDevice(device_), "cudaSetDevice");
  cudaError_t a = cudaStreamSynchronize(stream_);
  cudaError_t b = cudaStreamSynchronize(map_stream_);
  release_all();
  check(a, "cudaStreamSynchronize (load stream)");
  check(b, "cudaStreamSynchronize (mapped-load stream)");
}

void DeviceTarget::abort() noexcept {
  cudaSetDevice(device_);
  cudaStreamSynchronize(stream_);
  cudaStreamSynchronize(map_stream_);
  release_all();
  cudaGetLastError();
}

int default_threads() {
  unsigned n = std::thread::hardware_concurrency();
  return static_cast<int>(std::clamp(n == 0 ? 4u : n, 1u, 16u));
}

void validate(const LoaderOptions& o) {
  if (o.slot_bytes == 0 || o.slot_bytes % os::kDirectIoAlignment != 0)
    throw InvalidArgument("loader: slot_bytes=" + std::to_string(o.slot_bytes) +
                          ": expected a positive multiple of 4096");
  if (o.staging_bytes / o.slot_bytes < 2)
    throw InvalidArgument("loader: staging_bytes=" + std::to_string(o.staging_bytes) + " holds fewer than 2 slots of " +
                          format_bytes(o.slot_bytes) + " (reads must overlap the DMA)");
  if (o.threads < 0 || o.threads > 256)
    throw InvalidArgument("loader: threads=" + std::to_string(o.threads) + ": expected 0 (one per core) .. 256");
  if (!(o.mapped_share >= 0 && o.mapped_share <= 1))
    throw InvalidArgument("loader: mapped_share=" + std::to_string(o.mapped_share) + ": expected 0 .. 1");
  if (o.mapped_inflight_bytes < o.slot_bytes)
    throw InvalidArgument("loader: mapped_inflight_bytes=" + std::to_string(o.mapped_inflight_bytes) +
                          ": expected at least slot_bytes");
}

}  // namespace

LoaderOptions LoaderOptions::from_options(const Options& options, int device) {
  LoaderOptions o;
  o.device = device;
  o.staging_bytes = options.size("FERRY_LOAD_STAGING");
  o.slot_bytes = options.size("FERRY_LOAD_SLOT");
  o.threads = static_cast<int>(options.integer("FERRY_LOAD_THREADS"));
  o.direct_io = load::parse_direct_io(options.text("FERRY_LOAD_DIRECT_IO"));
  int64_t percent = options.integer("FERRY_LOAD_MAPPED_PERCENT");
  if (percent < 0 || percent > 100)
    throw InvalidArgument("FERRY_LOAD_MAPPED_PERCENT='" + std::to_string(percent) + "': expected 0 .. 100");
  o.mapped_share = static_cast<double>(percent) / 100.0;
  return o;
}

LoaderOptions LoaderOptions::from_environment(int device) { return from_options(ferry::options(), device); }

struct Loader::Impl {
  explicit Impl(const LoaderOptions& o) : target(o), workers(o.threads + 1) {}
  DeviceTarget target;
  WorkerPool workers;  // readers + the mapped worker
  const uint64_t generation = fork_generation();  // a forked child refuses it (core/fork.h)
  bool forked() const noexcept { return generation != fork_generation(); }
};

Loader::Loader(LoaderOptions options) : options_(options) {
  if (options_.threads == 0) options_.threads = default_threads();
  validate(options_);
  ScopedDevice restore;  // creating the pool and streams makes the device current
  impl_ = std::make_unique<Impl>(options_);
}

Loader::~Loader() {
  if (impl_ && impl_->forked()) {  // no join, no CUDA call in a forked child
    abandon_in_child(impl_);
    return;
  }
  ScopedDevice restore;  // releasing the pinned pool makes the loader's device current
  impl_.reset();
}

LoadStats Loader::load(std::span<const std::string> files, std::span<const load::FileRange> ranges,
                       cudaStream_t stream) {
  if (impl_->forked()) throw NotSupported(forked_child_message("this ferry loader"));
  if (busy_.exchange(true))
    throw InvalidArgument("this Loader is already running a load (one at a time: use one Loader per thread)");
  struct Idle {
    std::atomic<bool>& busy;
    ~Idle() { busy = false; }
  } idle{busy_};
  ScopedDevice restore;
  load::FileSet set(files, options_.direct_io, options_.mapped_share > 0);
  load::ReadPlan plan = load::plan_reads(ranges, set.sizes(), set.names(), {options_.slot_bytes, kMergeGap});
  impl_->target.begin(stream);
  load::PipelineOptions po;
  po.threads = options_.threads;
  po.mapped_share = options_.mapped_share;
  po.progress = options_.progress == Progress::always ||
                (options_.progress == Progress::automatic && os::is_terminal(2));
  LoadStats st;
  static_cast<load::PipelineStats&>(st) = load::run_pipeline(plan, set, impl_->target, impl_->workers, po);
  st.registrations = impl_->target.registrations;
  st.register_seconds = impl_->target.register_s;
  st.unregister_seconds = impl_->target.unregister_s;
  st.staging_bytes = impl_->target.slot_count() * impl_->target.slot_bytes();
  st.threads = options_.threads;
  return st;
}

}  // namespace ferry::cuda
