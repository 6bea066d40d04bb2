// channel.cpp — the channel's host side: setup, argument checks, request
// submission, kernel relaunch, close. The protocol is described in channel.h;
// the shared memory layout in channel_layout.h.
//
// Invariants: a claimed ticket is always published unless the channel is
// marked broken (then every later request fails at once); a slot is handed to
// its next ticket only after its result was copied out; mapped memory and the
// stream are freed only once no request is in flight and the stream is idle.
#include "cuda/channel/channel.h"

#include <cuda_runtime_api.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#include "core/error.h"
#include "core/cpu_relax.h"
#include "core/fork.h"
#include "cuda/channel/channel_layout.h"
#include "cuda/cuda_check.h"
#include "cuda/device.h"
#include "cuda/driver_entry.h"
#include "cuda/pointer_lookup.h"
#include "cuda/scoped_device.h"
#include "cuda/channel/gdrcopy.h"

namespace ferry::cuda {

using namespace channel_layout;

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::microseconds;
using std::chrono::milliseconds;

static_assert(kChannelMaxPayload == kMaxPayload);
static_assert(kChannelMaxPayload == FERRY_CHANNEL_MAX_PAYLOAD);

constexpr uint32_t kMaxIdleUs = 10'000'000;
constexpr uint32_t kMaxSlots = 64;
constexpr uint32_t kMaxTimeoutMs = 3'600'000;
constexpr uint32_t kMaxSpinUs = 10'000;
constexpr uint64_t kMaxWaitUs = 3'600'000'000ull;
constexpr auto kStreamCheckInterval = milliseconds(1);

// Spins for `spin`, then yields for 200 us, then sleeps 20 us, doubling up to 1 ms.
class Backoff {
 public:
  explicit Backoff(microseconds spin) : start_(Clock::now()), spin_(spin) {}
  void pause() {
    const auto waited = Clock::now() - start_;
    if (waited < spin_) {
      cpu_relax();
    } else if (waited < spin_ + kYieldPhase) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(sleep_);
      sleep_ = std::min(sleep_ * 2, kMaxSleep);
    }
  }

 private:
  static constexpr microseconds kYieldPhase{200};
  static constexpr microseconds kMaxSleep{1000};
  Clock::time_point start_;
  microseconds spin_;
  microseconds sleep_{20};
};

void check_options(const ChannelOptions& o) {
  auto range = [](const char* name, uint64_t v, uint64_t lo, uint64_t hi) {
    if (v < lo || v > hi)
      throw InvalidArgument(std::string(name) + "=" + std::to_string(v) + ": expected " +
                            std::to_string(lo) + " .. " + std::to_string(hi));
  };
  range("idle_us", o.idle_us, 1, kMaxIdleUs);
  range("slots", o.slots, 1, kMaxSlots);
  range("timeout_ms", o.timeout_ms, 1, kMaxTimeoutMs);
  range("spin_us", o.spin_us, 0, kMaxSpinUs);
}

void check_device_index(int device) {
  const int n = device_count();  // NoDevice without driver or device
  if (device < 0 || device >= n)
    throw InvalidArgument("device " + std::to_string(device) + " does not exist (" +
                          std::to_string(n) + " CUDA device" + (n == 1 ? "" : "s") + ")");
}

void check_size(size_t n, const char* what) {
  if (n == 0) throw InvalidArgument(std::string(what) + " of 0 bytes: n must be at least 1");
  if (n > kChannelMaxPayload)
    throw InvalidArgument(std::string(what) + " of " + std::to_string(n) +
                          " bytes exceeds the channel's limit of 65536 bytes (64 KiB) per "
                          "request; use ferry's copy engine (ferry.copy) for transfers above "
                          "64 KiB");
}

// cudaStreamQuery, with "cannot ask now" (another thread is capturing a CUDA
// graph in global mode, PyTorch's default) reported as cudaErrorNotReady.
cudaError_t query_stream(cudaStream_t stream) {
  const cudaError_t e = cudaStreamQuery(stream);
  if (e == cudaErrorStreamCaptureUnsupported || e == cudaErrorStreamCaptureImplicit ||
      e == cudaErrorStreamCaptureWrongThread) {
    cudaGetLastError();  // our own refused call's error
    return cudaErrorNotReady;
  }
  return e;
}

}  // namespace

struct Channel::Impl {
  struct Request {
    Op op;
    const void* address;  // device address (write/read/fill/signal/wait)
    uint32_t bytes;
    uint32_t value;
    uint32_t timeout_us;
    const void* write_src;
    void* read_dst;
    const char* what;  // for messages: "write", "read", ...
  };

  int device = -1;
  ChannelOptions options;
  cudaStream_t stream = nullptr;
  void* mapped = nullptr;               // cudaHostAlloc'ed: Control, then the slots
  Control* control = nullptr;           // host view
  Slot* slots = nullptr;                // host view
  Control* control_device = nullptr;    // device view
  Slot* slots_device = nullptr;         // device view
  KernelState* kernel_state = nullptr;  // device memory (cudaMallocAsync on stream)
  std::unique_ptr<std::atomic<uint64_t>[]> slot_turn;  // ticket allowed to use each slot
  std::unique_ptr<GdrcopyWriter> gdrcopy;

  std::atomic<uint64_t> next_ticket{0};
  std::atomic<uint64_t> launched_generation{0};
  std::atomic<uint64_t> requests{0}, launches{0}, gdrcopy_writes{0};
  std::atomic<uint64_t> idle_exits_at_close{0};
  std::atomic<int> active{0};  // requests (and stats reads) in flight
  std::atomic<bool> closing{false};
  std::atomic<bool> broken{false};
  std::mutex broken_mutex;
  std::string broken_reason;  // guarded by broken_mutex
  int broken_code = 0;        // guarded by broken_mutex
  const uint64_t generation = fork_generation();  // a forked child refuses it (core/fork.h)

  ~Impl() { free_resources(); }

  bool forked() const noexcept { return generation != fork_generation(); }

  // Counts a request in flight; refuses when closed, broken or inherited by a forked child.
  class Active {
   public:
    explicit Active(Impl& c) : c_(c) {
      if (c_.forked()) throw NotSupported(forked_child_message("this ferry channel"));
      c_.active.fetch_add(1, std::memory_order_seq_cst);
      if (c_.closing.load(std::memory_order_seq_cst)) {
        c_.active.fetch_sub(1, std::memory_order_seq_cst);
        throw InvalidArgument("the channel is closed");
      }
      if (c_.broken.load(std::memory_order_acquire)) {
        c_.active.fetch_sub(1, std::memory_order_seq_cst);
        c_.throw_broken();
      }
    }
    ~Active() { c_.active.fetch_sub(1, std::memory_order_seq_cst); }
    Active(const Active&) = delete;
    Active& operator=(const Active&) = delete;

   private:
    Impl& c_;
  };

  [[noreturn]] void throw_broken() {
    std::lock_guard<std::mutex> lock(broken_mutex);
    throw CudaError("the channel is unusable after an earlier failure (" + broken_reason +
                        "); close it and create a new one",
                    broken_code);
  }

  // Marks the channel broken and throws.
  [[noreturn]] void fail(const std::string& reason, int code) {
    {
      std::lock_guard<std::mutex> lock(broken_mutex);
      if (!broken.load(std::memory_order_relaxed)) {
        broken_reason = reason;
        broken_code = code;
      }
      broken.store(true, std::memory_order_release);
    }
    throw CudaError(reason + "; the channel is now unusable: close it and create a new one", code);
  }

  std::string stream_status() const {
    const cudaError_t e = query_stream(stream);
    if (e == cudaErrorNotReady)
      return "the channel kernel is queued or running (a GPU saturated by long kernels keeps a "
             "relaunched kernel off the SMs; or the GPU hangs)";
    if (e == cudaSuccess) return "the channel's stream is idle, no kernel serves (a ferry bug)";
    return "the channel's stream reports " + describe(e);
  }

  // The allocation holding [p, p+n) on this channel's device; InvalidArgument otherwise.
  DeviceAllocation check_device_range(const void* p, size_t n, const char* what) const {
    auto refuse = [&](const std::string& why) {
      return InvalidArgument(std::string(what) + " " + format_address(p) + why);
    };
    if (!p) throw InvalidArgument(std::string(what) + " must not be NULL");
    const PointerAttributes q = query_pointer(p);
    if (q.status != CUDA_SUCCESS)
      throw refuse(" is not an address the CUDA driver knows (cuPointerGetAttributes error " +
                   std::to_string(q.status) + ")");
    const unsigned int memory_type = q.memory_type;
    const bool managed = q.managed;
    const int ordinal = q.ordinal;
    const uintptr_t start = q.range_start;
    const size_t size = q.range_size;
    if (memory_type == 0)
      throw refuse(" is not CUDA device memory (the driver does not know this address: "
                   "ordinary host memory, or memory already freed)");
    if (!managed && memory_type == CU_MEMORYTYPE_HOST)
      throw refuse(" is pinned host memory, not device memory: copy it on the host with memcpy");
    if (!managed && ordinal != device)
      throw refuse(" is memory of device " + std::to_string(ordinal) +
                   "; this channel serves device " + std::to_string(device));
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    if (size == 0 || a < start || n > start + size - a)
      throw refuse(" + " + std::to_string(n) + " bytes runs past the end of its allocation [" +
                   format_address(reinterpret_cast<void*>(start)) + ", +" + std::to_string(size) +
                   " bytes)");
    return DeviceAllocation{start, size, q.buffer_id};
  }

  // Protocol step 2: payload, then the request words, the op word last.
  void publish(Slot& slot, uint64_t ticket, const Request& r) {
    const uint64_t address = reinterpret_cast<uintptr_t>(r.address);
    const RequestData d = pack_request(r.op, address, r.bytes, r.value, r.timeout_us, r.write_src);
    if (r.op == kOpWrite && !has_inline_payload(r.op, r.bytes))
      std::memcpy(slot.payload + payload_offset(address), r.write_src, r.bytes);
    for (uint32_t i = kRequestWords - 1; i > kWordOp; --i)
      std::atomic_ref<uint64_t>(slot.request[i]).store(make_word(ticket, d.word[i]),
                                                       std::memory_order_release);
    std::atomic_ref<uint64_t>(slot.request[kWordOp])
        .store(make_word(ticket, d.word[kWordOp]), std::memory_order_release);
  }

  // Protocol step 3 (after the seq_cst fence): make sure a kernel will serve.
  void ensure_serving(Clock::time_point deadline) {
    std::atomic_ref<uint64_t> state_word(control->kernel_state);
    Backoff backoff(microseconds(options.spin_us));
    for (;;) {
      const uint64_t state = state_word.load(std::memory_order_acquire);
      uint64_t launched = launched_generation.load(std::memory_order_acquire);
      const uint64_t generation = state_generation(state);
      if (generation < launched) return;  // a newer kernel has yet to start: it serves
      if (generation == launched) {
        if (state_phase(state) == kPhaseRunning) return;
        if (state_phase(state) == kPhaseStopped) {
          if (launched_generation.compare_exchange_strong(launched, launched + 1,
                                                          std::memory_order_acq_rel))
            launch(launched + 1);
          return;  // we launched, or another thread did (a newer kernel serves)
        }
      }
      // Stopping (or a state newer than the generation we read): re-read.
      if (Clock::now() >= deadline)
        fail("the channel kernel did not leave its 'stopping' state in time; " + stream_status(),
             cudaErrorTimeout);
      backoff.pause();
    }
  }

  void launch(uint64_t generation) {
    cudaError_t err = cudaSuccess;
    try {
      ScopedDevice scope(device);
      KernelParams p{};
      p.control = control_device;
      p.slots = slots_device;
      p.state = kernel_state;
      p.slot_count = options.slots;
      p.generation = generation;
      p.idle_ns = static_cast<uint64_t>(options.idle_us) * 1000u;
      err = static_cast<cudaError_t>(launch_kernel(p, stream));
    } catch (const Error& e) {
      fail(std::string("cannot launch the channel kernel: ") + e.what(), cudaErrorUnknown);
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      fail("cudaLaunchKernel (channel kernel, generation " + std::to_string(generation) +
               ") failed: " + describe(err),
           err);
    }
    launches.fetch_add(1, std::memory_order_relaxed);
  }

  // Protocol step 4.
  uint64_t await_done(Slot& slot, uint64_t ticket, Clock::time_point deadline, const Request& r) {
    std::atomic_ref<uint64_t> done(slot.done);
    Backoff backoff(microseconds(options.spin_us));
    auto next_stream_check = Clock::now() + kStreamCheckInterval;
    for (;;) {
      const uint64_t word = done.load(std::memory_order_acquire);
      if (word_tag(word) == ticket_tag(ticket)) return word;
      if (broken.load(std::memory_order_acquire)) throw_broken();
      const auto now = Clock::now();
      if (now >= next_stream_check) {
        const cudaError_t e = query_stream(stream);
        if (e != cudaSuccess && e != cudaErrorNotReady)
          fail("the channel kernel failed: its stream reports " + describe(e) +
                   " (a device error poisons the whole CUDA context)",
               e);
        next_stream_check = now + kStreamCheckInterval;
      }
      if (now >= deadline)
        fail(std::string("channel request (") + r.what + " of " + std::to_string(r.bytes) +
                 " bytes at " + format_address(r.address) + ") did not complete within " +
                 std::to_string(options.timeout_ms) + " ms; " + stream_status(),
             cudaErrorTimeout);
      backoff.pause();
    }
  }

  // The whole request protocol; returns the kernel's Result. Caller holds an Active.
  uint32_t execute(const Request& r) {
    const auto deadline = Clock::now() + milliseconds(options.timeout_ms) +
                          microseconds(r.op == kOpWait ? r.timeout_us : 0);
    const uint64_t ticket = next_ticket.fetch_add(1, std::memory_order_relaxed);
    const uint32_t s = static_cast<uint32_t>(ticket % options.slots);
    Backoff backoff(microseconds(options.spin_us));
    while (slot_turn[s].load(std::memory_order_acquire) != ticket) {
      if (broken.load(std::memory_order_acquire)) throw_broken();
      if (Clock::now() >= deadline)
        fail("no request slot became free within " + std::to_string(options.timeout_ms) +
                 " ms; " + stream_status(),
             cudaErrorTimeout);
      backoff.pause();
    }
    Slot& slot = slots[s];
    publish(slot, ticket, r);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    ensure_serving(deadline);
    const uint64_t done = await_done(slot, ticket, deadline, r);
    if (r.op == kOpRead)
      std::memcpy(r.read_dst, slot.payload + payload_offset(reinterpret_cast<uintptr_t>(r.address)),
                  r.bytes);
    slot_turn[s].store(ticket + options.slots, std::memory_order_release);
    requests.fetch_add(1, std::memory_order_relaxed);
    const uint32_t result = word_data(done);
    if (result == kResultBadRequest)
      throw Error(FERRY_ERROR_INTERNAL, std::string("the channel kernel refused a ") + r.what +
                                            " request of " + std::to_string(r.bytes) +
                                            " bytes (a ferry bug: please report it)");
    if (result == kResultStopped)
      throw InvalidArgument(std::string("the channel was closed during this ") + r.what);
    return result;
  }

  // Frees everything (the kernel must be gone). Never throws.
  void free_resources() noexcept {
    if (control)
      idle_exits_at_close.store(std::atomic_ref<uint64_t>(control->idle_exits).load(),
                                std::memory_order_relaxed);
    gdrcopy.reset();
    bool failed = false;
    if (stream) {
      if (kernel_state) failed |= cudaFreeAsync(kernel_state, stream) != cudaSuccess;
      failed |= cudaStreamSynchronize(stream) != cudaSuccess;
      failed |= cudaStreamDestroy(stream) != cudaSuccess;
    }
    if (mapped) failed |= cudaFreeHost(mapped) != cudaSuccess;
    if (failed) cudaGetLastError();
    forget_resources();
  }

  // Drops the pointers without freeing (a kernel may still use the memory, or
  // the CUDA runtime is being unloaded at process exit).
  void forget_resources() noexcept {
    gdrcopy.release();
    stream = nullptr;
    kernel_state = nullptr;
    mapped = nullptr;
    control = nullptr;
    slots = nullptr;
  }
};

Channel::Channel(int device, const ChannelOptions& options) : impl_(std::make_unique<Impl>()) {
  Impl& c = *impl_;
  check_options(options);
  c.device = device;
  c.options = options;
  if (options.use_gdrcopy) {
    const GdrcopyStatus& g = gdrcopy_status();
    if (!g.available) throw NotSupported("use_gdrcopy=1: GDRCopy is not available: " + g.reason);
  }
  check_device_index(device);
  ScopedDevice scope(device);
  driver_pointer_attributes();  // a driver without it fails here, not at the first request

  int least = 0, greatest = 0;
  check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
  check(cudaStreamCreateWithPriority(&c.stream, cudaStreamNonBlocking, greatest),
        "cudaStreamCreateWithPriority (channel stream)");

  const size_t bytes = sizeof(Control) + options.slots * sizeof(Slot);
  check(cudaHostAlloc(&c.mapped, bytes, cudaHostAllocMapped | cudaHostAllocPortable),
        "cudaHostAlloc (channel ring)");
  void* device_view = nullptr;
  check(cudaHostGetDevicePointer(&device_view, c.mapped, 0), "cudaHostGetDevicePointer");
  if (reinterpret_cast<uintptr_t>(device_view) % alignof(Slot) != 0 ||
      reinterpret_cast<uintptr_t>(c.mapped) % alignof(Slot) != 0)
    throw Error(FERRY_ERROR_INTERNAL, "the channel ring is not 256-byte aligned (host " +
                                          format_address(c.mapped) + ", device " + format_address(device_view) + ")");
  std::memset(c.mapped, 0, bytes);
  c.control = static_cast<Control*>(c.mapped);
  c.slots = reinterpret_cast<Slot*>(static_cast<char*>(c.mapped) + sizeof(Control));
  c.control_device = static_cast<Control*>(device_view);
  c.slots_device = reinterpret_cast<Slot*>(static_cast<char*>(device_view) + sizeof(Control));
  c.control->kernel_state = make_state(0, kPhaseStopped);
  for (uint32_t s = 0; s < options.slots; ++s) {
    // As if ticket s - slots had used the slot last (channel_layout.h invariant).
    const uint64_t previous = static_cast<uint64_t>(s) - options.slots;
    for (uint64_t& word : c.slots[s].request) word = make_word(previous, 0);
    c.slots[s].done = make_word(previous, kResultOk);
  }
  check(cudaMallocAsync(reinterpret_cast<void**>(&c.kernel_state), sizeof(KernelState), c.stream),
        "cudaMallocAsync (channel kernel state)");
  check(cudaMemsetAsync(c.kernel_state, 0, sizeof(KernelState), c.stream), "cudaMemsetAsync");

  c.slot_turn = std::make_unique<std::atomic<uint64_t>[]>(options.slots);
  for (uint32_t s = 0; s < options.slots; ++s) c.slot_turn[s].store(s, std::memory_order_relaxed);
  if (options.use_gdrcopy) c.gdrcopy = std::make_unique<GdrcopyWriter>();
}

Channel::~Channel() {
  if (impl_->forked()) {  // no CUDA call in a forked child
    abandon_in_child(impl_);
    return;
  }
  try {
    close();
  } catch (...) {
  }
}

void Channel::write(void* device_dst, const void* src, size_t n) {
  Impl& c = *impl_;
  Impl::Active active(c);
  check_size(n, "write");
  if (!src) throw InvalidArgument("src must not be NULL");
  const DeviceAllocation a = c.check_device_range(device_dst, n, "dev_dst");
  if (c.gdrcopy && c.gdrcopy->write(a, device_dst, src, n)) {
    c.gdrcopy_writes.fetch_add(1, std::memory_order_relaxed);
    c.requests.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  c.execute({kOpWrite, device_dst, static_cast<uint32_t>(n), 0, 0, src, nullptr, "write"});
}

void Channel::read(void* dst, const void* device_src, size_t n) {
  Impl& c = *impl_;
  Impl::Active active(c);
  check_size(n, "read");
  if (!dst) throw InvalidArgument("dst must not be NULL");
  c.check_device_range(device_src, n, "dev_src");
  c.execute({kOpRead, device_src, static_cast<uint32_t>(n), 0, 0, nullptr, dst, "read"});
}

void Channel::fill(void* device_dst, int value, size_t n) {
  Impl& c = *impl_;
  Impl::Active active(c);
  check_size(n, "fill");
  if (value < 0 || value > 255)
    throw InvalidArgument("fill value " + std::to_string(value) + ": expected a byte, 0 .. 255");
  c.check_device_range(device_dst, n, "dev_dst");
  c.execute({kOpFill, device_dst, static_cast<uint32_t>(n), static_cast<uint32_t>(value), 0,
             nullptr, nullptr, "fill"});
}

void Channel::signal(uint32_t* device_flag, uint32_t value) {
  Impl& c = *impl_;
  Impl::Active active(c);
  if (reinterpret_cast<uintptr_t>(device_flag) % 4 != 0)
    throw InvalidArgument("dev_flag " + format_address(device_flag) + " is not 4-byte aligned");
  c.check_device_range(device_flag, 4, "dev_flag");
  c.execute({kOpSignal, device_flag, 4, value, 0, nullptr, nullptr, "signal"});
}

bool Channel::wait(const uint32_t* device_flag, uint32_t value, uint64_t timeout_us) {
  Impl& c = *impl_;
  Impl::Active active(c);
  if (reinterpret_cast<uintptr_t>(device_flag) % 4 != 0)
    throw InvalidArgument("dev_flag " + format_address(device_flag) + " is not 4-byte aligned");
  if (timeout_us > kMaxWaitUs)
    throw InvalidArgument("wait timeout of " + std::to_string(timeout_us) +
                          " us: at most 3600 s (a wait holds the whole channel)");
  c.check_device_range(device_flag, 4, "dev_flag");
  return c.execute({kOpWait, device_flag, 4, value, static_cast<uint32_t>(timeout_us), nullptr,
                    nullptr, "wait"}) == kResultOk;
}

double Channel::ping() {
  Impl& c = *impl_;
  Impl::Active active(c);
  const auto start = Clock::now();
  c.execute({kOpNop, nullptr, 0, 0, 0, nullptr, nullptr, "ping"});
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

ChannelStats Channel::stats() const {
  Impl& c = *impl_;
  if (c.forked()) throw NotSupported(forked_child_message("this ferry channel"));
  ChannelStats s;
  s.requests = c.requests.load(std::memory_order_relaxed);
  s.launches = c.launches.load(std::memory_order_relaxed);
  s.gdrcopy_writes = c.gdrcopy_writes.load(std::memory_order_relaxed);
  c.active.fetch_add(1, std::memory_order_seq_cst);
  if (c.closing.load(std::memory_order_seq_cst))
    s.idle_exits = c.idle_exits_at_close.load(std::memory_order_relaxed);
  else
    s.idle_exits = std::atomic_ref<uint64_t>(c.control->idle_exits).load(std::memory_order_acquire);
  c.active.fetch_sub(1, std::memory_order_seq_cst);
  return s;
}

int Channel::device() const noexcept { return impl_->device; }

const ChannelOptions& Channel::options() const noexcept { return impl_->options; }

bool Channel::closed() const noexcept { return impl_->closing.load(std::memory_order_acquire); }

void Channel::close() {
  Impl& c = *impl_;
  if (c.forked()) return;  // the parent's kernel and memory are not the child's to stop
  if (c.closing.exchange(true, std::memory_order_seq_cst)) return;
  const auto limit = milliseconds(c.options.timeout_ms);
  auto wait_for = [](auto&& ready, Clock::duration within) {
    const auto deadline = Clock::now() + within;
    Backoff backoff(microseconds(0));
    while (!ready()) {
      if (Clock::now() >= deadline) return false;
      backoff.pause();
    }
    return true;
  };
  auto drained = [&] { return c.active.load(std::memory_order_seq_cst) == 0; };
  bool quiet = wait_for(drained, limit);
  // Ask a running kernel to leave now (it also aborts a wait in progress).
  std::atomic_ref<uint64_t>(c.control->stop).store(1, std::memory_order_release);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!quiet) quiet = wait_for(drained, limit);
  cudaError_t stream_state = cudaErrorNotReady;
  const bool stream_idle = wait_for(
      [&] { return (stream_state = query_stream(c.stream)) != cudaErrorNotReady; }, limit);
  if (stream_state == cudaErrorCudartUnloading) {  // process exit: the runtime tears down
    c.forget_resources();
    return;
  }
  if (!quiet || !stream_idle) {
    c.forget_resources();
    throw CudaError(std::string("close: ") +
                        (!quiet ? "requests still in flight" : "the channel kernel did not stop") +
                        " after " + std::to_string(2 * c.options.timeout_ms) +
                        " ms; its memory is leaked rather than freed under a live kernel",
                    cudaErrorTimeout);
  }
  ScopedDevice scope(c.device);
  c.free_resources();
}

}  // namespace ferry::cuda
