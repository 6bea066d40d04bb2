// file_loader.cpp — DeviceTarget (pinned slots, the load stream, events per
// slot) and Loader::load.
#include "cuda/load/file_loader.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "core/error.h"
#include "core/fork.h"
#include "core/options.h"
#include "core/worker_pool.h"
#include "copy/copy_crew.h"
#include "pool/numa_home.h"
#include "cuda/cuda_check.h"
#include "cuda/device.h"
#include "cuda/pinned_pool.h"
#include "cuda/scoped_device.h"
#include "cuda/staging_area.h"
#include "os/affinity.h"
#include "os/file.h"
#include "os/memory.h"
#include "os/sysfs.h"
#include "pool/pool.h"

namespace ferry::cuda {
namespace {

// The slots are one staging area (cuda/staging_area.h, the copy engine's
// ring too) whose events sleep: slot i is free for a new fill once its event
// (recorded after the fill's DMAs on the load stream) has completed.
class DeviceTarget final : public load::Target {
 public:
  explicit DeviceTarget(const LoaderOptions& o);
  ~DeviceTarget() override;

  size_t slot_count() const override { return slots_->geometry().slots; }
  size_t slot_bytes() const override { return slots_->geometry().chunk_bytes; }
  unsigned char* slot(size_t i) const override { return slots_->slot(i); }
  void wait_slot_free(size_t i) override {
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaEventSynchronize(slots_->slot_done(i)), "cudaEventSynchronize (staging slot)");
  }
  void copy_out(size_t, const unsigned char* src, uintptr_t dst, size_t n) override {
    check(cudaMemcpyAsync(reinterpret_cast<void*>(dst), src, n, cudaMemcpyHostToDevice, stream_),
          "cudaMemcpyAsync (staging slot -> device)");
  }
  void slot_filled(size_t i) override {
    check(cudaEventRecord(slots_->slot_done(i), stream_), "cudaEventRecord");
  }
  void finish() override;
  void abort() noexcept override;

  // Orders this load's stream after the work queued on `caller`.
  void begin(cudaStream_t caller);

 private:
  void destroy() noexcept;  // the destructor's work, also for a failed constructor

  int device_;
  std::unique_ptr<Pool> pool_;
  std::unique_ptr<StagingArea> slots_;  // from pool_
  cudaStream_t stream_ = nullptr;       // the DMAs
};

DeviceTarget::DeviceTarget(const LoaderOptions& o) : device_(o.device) {
  StagingGeometry geometry;
  geometry.chunk_bytes = o.slot_bytes;
  geometry.slots = static_cast<uint32_t>(o.staging_bytes / o.slot_bytes);
  PoolOptions po = PoolOptions::from_environment();
  // One chunk of the ring's size: one mapping, one registration, nothing pinned beside it.
  const size_t ring_bytes = size_t{geometry.slots} * geometry.chunk_bytes;
  po.chunk_bytes = (ring_bytes + os::kHugePage2MBytes - 1) / os::kHugePage2MBytes * os::kHugePage2MBytes;
  po.target_bytes = 0;
  po.zero_recycled = false;
  po.release_delay_ms = 0;
  pool_ = make_pinned_pool(po, device_);  // NoDevice without a GPU
  try {
    set_device(device_);
    // Readers sleep on the slots' events: spinning would take the cores pread needs.
    slots_ = std::make_unique<StagingArea>(*pool_, geometry, SlotWait::sleep);
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  } catch (...) {
    destroy();
    throw;
  }
}

DeviceTarget::~DeviceTarget() { destroy(); }

void DeviceTarget::destroy() noexcept {
  ScopedDevice restore;
  cudaSetDevice(device_);
  if (stream_) cudaStreamSynchronize(stream_), cudaStreamDestroy(stream_);
  stream_ = nullptr;
  slots_.reset();  // waits for each slot's last DMA, gives the memory back to pool_
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
  cudaEventDestroy(ready);  // the wait is enqueued; destroying the event does not undo it
  check(err, "ordering the load after the caller's stream (cudaEventRecord / cudaStreamWaitEvent)");
}

void DeviceTarget::finish() {
  check(cudaSetDevice(device_), "cudaSetDevice");
  check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (load stream)");
}

void DeviceTarget::abort() noexcept {
  cudaSetDevice(device_);
  cudaStreamSynchronize(stream_);
  cudaGetLastError();
}

// One reader per CPU the readers may run on (the node's, when bound), capped.
int default_threads(const std::vector<int>& cpus) { return default_thread_count(os::cpus_or_usable(cpus)); }

// A slot is one pread and one event; more than this many is a mistake (4 KiB
// slots in 4 GiB), not a ring.
constexpr size_t kMaxSlots = size_t{1} << 20;

void validate(const LoaderOptions& o) {
  if (o.slot_bytes == 0 || o.slot_bytes % os::kDirectIoAlignment != 0)
    throw InvalidArgument("loader: slot_bytes=" + std::to_string(o.slot_bytes) +
                          ": expected a positive multiple of 4096");
  if (o.staging_bytes / o.slot_bytes < 2)
    throw InvalidArgument("loader: staging_bytes=" + std::to_string(o.staging_bytes) + " holds fewer than 2 slots of " +
                          format_bytes(o.slot_bytes) + " (reads must overlap the DMA)");
  if (o.staging_bytes / o.slot_bytes > kMaxSlots)
    throw InvalidArgument("loader: staging_bytes=" + std::to_string(o.staging_bytes) + " holds more than " +
                          std::to_string(kMaxSlots) + " slots of " + format_bytes(o.slot_bytes) +
                          " (an event each): use larger slots");
  if (o.threads < 0 || o.threads > 256)
    throw InvalidArgument("loader: threads=" + std::to_string(o.threads) + ": expected 0 (one per core) .. 256");
}

}  // namespace

LoaderOptions LoaderOptions::from_options(const Options& options, int device) {
  LoaderOptions o;
  o.device = device;
  o.staging_bytes = options.size("FERRY_LOAD_STAGING");
  o.slot_bytes = options.size("FERRY_LOAD_SLOT");
  o.threads = static_cast<int>(options.integer("FERRY_LOAD_THREADS"));
  o.direct_io = load::parse_direct_io(options.text("FERRY_LOAD_DIRECT_IO"));
  return o;
}

LoaderOptions LoaderOptions::from_environment(int device) { return from_options(ferry::options(), device); }

struct Loader::Impl {
  Impl(const LoaderOptions& o, int node, const std::vector<int>& cpus)
      : numa_node(node), target(o), workers(o.threads, ThreadAffinity{cpus, &os::bind_thread_to_cpus}) {}
  const int numa_node;  // the GPU's host node (pool/numa_home.h); -1: none
  DeviceTarget target;  // its slots bound to numa_node by make_pinned_pool
  WorkerPool workers;   // the readers, on numa_node's usable CPUs
  const uint64_t generation = fork_generation();  // a forked child refuses it (core/fork.h)
  bool forked() const noexcept { return generation != fork_generation(); }
};

Loader::Loader(LoaderOptions options) : options_(options) {
  validate(options_);
  ScopedDevice on(options_.device);  // throws NoDevice / InvalidArgument; restores the caller's device
  const int node = numa_home(pci_bus_id(options_.device));
  const std::vector<int> cpus = host_crew_cpus(node);
  if (options_.threads == 0) options_.threads = default_threads(cpus);
  impl_ = std::make_unique<Impl>(options_, cpus.empty() ? -1 : node, cpus);
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
  load::FileSet set(files, options_.direct_io);
  load::PlanOptions plan_options;  // read_plan.h's merge gap
  plan_options.window_bytes = options_.slot_bytes;
  load::ReadPlan plan = load::plan_reads(ranges, set.sizes(), set.names(), plan_options);
  impl_->target.begin(stream);
  load::PipelineOptions po;
  po.threads = options_.threads;
  po.progress = options_.progress == Progress::always ||
                (options_.progress == Progress::automatic && os::is_terminal(2));
  LoadStats st;
  static_cast<load::PipelineStats&>(st) = load::run_pipeline(plan, set, impl_->target, impl_->workers, po);
  st.staging_bytes = impl_->target.slot_count() * impl_->target.slot_bytes();
  st.numa_node = impl_->numa_node;
  st.threads = options_.threads;
  return st;
}

}  // namespace ferry::cuda
