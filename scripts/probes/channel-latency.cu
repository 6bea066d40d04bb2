// channel-latency.cu — where does the channel's round trip go? Standalone probe:
//   nvcc -O2 -std=c++17 -arch=sm_90 -o channel-latency scripts/probes/channel-latency.cu -lcuda
//   ./channel-latency [timed_round_trips=5000] [warmup=200]
// Each variant (table in main) launches its own persistent one-block kernel on
// a non-blocking highest-priority stream, as channel.cpp does, serving a mapped
// pinned ring; the host times each round trip with steady_clock, then stops the
// kernel with the ring's stop word. Each variant adds channel costs to another.
// How the host publishes a request: A, B, B2 (kernel reads word 0 only): one
// relaxed store. C, D, F (kernel checks 32 tags): 32 relaxed stores, ascending,
// no fence. B3, E, G, H, R: like channel.cpp publish(): release stores from
// word 31 down to the op word, then execute()'s seq_cst fence. How it polls the
// done word: relaxed loads in a tight spin; B3, E: acquire loads, tight spin;
// G, H, R: acquire loads with channel.cpp's Backoff::pause (clock read + pause).
// On x86-64 relaxed and release stores, relaxed and acquire loads, are the same
// mov; the seq_cst fence is an mfence.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include <cuda/atomic>

using Clock = std::chrono::steady_clock;
using SysRef = cuda::atomic_ref<uint64_t, cuda::thread_scope_system>;  // host and device
constexpr auto kTimeout = std::chrono::seconds(2);
#if defined(__x86_64__)
#define CPU_RELAX() __builtin_ia32_pause()  // channel.cpp's cpu_relax()
#else
#define CPU_RELAX() asm volatile("yield")
#endif
enum Op : uint32_t { kNop = 1, kWrite = 2, kRead = 3 };  // channel_layout.h values

// Mapped pinned memory, each word in its own 256-byte block as in channel_layout.h.
struct alignas(256) Ring {
  uint64_t req[32];                         // host -> GPU: {tag = ticket, data32}
  alignas(256) uint64_t done;               // GPU -> host: {tag = ticket, result}
  alignas(256) uint64_t stop;               // host -> GPU: nonzero: leave now
  alignas(256) uint64_t state;              // G/H/R's ensure_serving() reads it
  alignas(256) unsigned char payload[256];  // R: the read's bytes at address & 15
};

__host__ __device__ constexpr uint64_t make_word(uint32_t tag, uint32_t data) {
  return (static_cast<uint64_t>(tag) << 32) | data;
}
__host__ __device__ constexpr uint32_t tag_of(uint64_t w) { return static_cast<uint32_t>(w >> 32); }

static Ring* g_ring = nullptr;  // host view, so that die() can stop a running kernel
[[noreturn]] static void die(const char* what) {
  std::fprintf(stderr, "channel-latency: ERROR: %s\n", what);
  if (g_ring) SysRef(g_ring->stop).store(1, cuda::memory_order_seq_cst);
  std::fflush(nullptr);
  std::_Exit(1);  // skip atexit teardown, which could wait on a stuck kernel
}
static void ck(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return;
  char b[256];
  std::snprintf(b, sizeof b, "%s: %s", call, cudaGetErrorString(e));
  die(b);
}
#define CK(call) ck((call), #call)

// ---------------------------------------------------------------- kernels

// A (kMode 0), B (1), B2 (2). Thread 0 polls req[0]; it reads the stop word
// only every 1024 polls, off the critical path.
template <int kMode>
__global__ void one_word_kernel(Ring* r) {
  if (threadIdx.x != 0) return;
  uint32_t ticket = 1;
  for (unsigned polls = 1;; ++polls) {
    uint64_t w;
    if constexpr (kMode == 0) w = *reinterpret_cast<volatile uint64_t*>(&r->req[0]);
    else w = SysRef(r->req[0]).load(cuda::memory_order_relaxed);
    if (tag_of(w) == ticket) {
      if constexpr (kMode == 0) {
        __threadfence_system();
        *reinterpret_cast<volatile uint64_t*>(&r->done) = make_word(ticket, 0);
      } else {
        if constexpr (kMode == 1)
          cuda::atomic_thread_fence(cuda::memory_order_acquire, cuda::thread_scope_system);
        SysRef(r->done).store(make_word(ticket, 0), cuda::memory_order_release);
      }
      ++ticket;
    } else if (polls % 1024 == 0 && *reinterpret_cast<volatile uint64_t*>(&r->stop) != 0) {
      return;
    }
  }
}

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// C (kThreads 32), D..R (256): channel_kernel.cu's structure. Warp 0: lane i
// loads req[i] and the stop word every round, __all_sync on the tags; else lane
// 0 checks stop and the (never reached) idle time and __shfl_syncs its verdict.
template <unsigned kThreads>
__global__ void __launch_bounds__(kThreads, 1) lanes_kernel(Ring* r) {
  __shared__ uint32_t word[32];
  __shared__ int leave;
  const unsigned tid = threadIdx.x, lane = tid & 31u;
  uint32_t ticket = 1;
  uint64_t idle_since = global_timer_ns();
  for (;;) {
    if (tid < 32) {
      SysRef mine(r->req[lane]), stop(r->stop);
      for (;;) {
        const uint64_t w = mine.load(cuda::memory_order_relaxed);  // both loads in flight
        const uint64_t s = stop.load(cuda::memory_order_relaxed);  // before either is used
        if (__all_sync(0xffffffffu, tag_of(w) == ticket)) {
          word[lane] = static_cast<uint32_t>(w);
          if (lane == 0) {
            cuda::atomic_thread_fence(cuda::memory_order_acquire, cuda::thread_scope_system);
            leave = 0;
          }
          break;
        }
        int l = 0;
        if (lane == 0) l = s != 0 || global_timer_ns() - idle_since > (1ull << 62);
        if (__shfl_sync(0xffffffffu, l, 0)) {
          if (lane == 0) leave = 1;
          break;
        }
      }
    }
    if constexpr (kThreads > 32) __syncthreads(); else __syncwarp();
    if (leave) return;
    const uint32_t op = word[0], bytes = word[1];
    const uint64_t address = (static_cast<uint64_t>(word[3]) << 32) | word[2];
    unsigned char* a = reinterpret_cast<unsigned char*>(address);
    if (op == kWrite && tid < bytes) a[tid] = reinterpret_cast<const unsigned char*>(&word[6])[tid];
    if (op == kRead && tid < bytes) __stwt(r->payload + (address & 15) + tid, __ldcg(a + tid));
    if constexpr (kThreads > 32) __syncthreads(); else __syncwarp();
    if (tid == 0) {
      SysRef(r->done).store(make_word(ticket, 0), cuda::memory_order_release);
      idle_since = global_timer_ns();
    }
    ++ticket;
  }
}

// ---------------------------------------------------------------- host side

enum class Host { OneWord, Words, Publish, Execute };  // see the top comment
struct Variant {
  const char* id;
  const char* what;
  const char* base;  // the variant this one extends (nullptr: none)
  int kernel;        // 0, 1, 2: one_word_kernel<kernel>; 32, 256: lanes_kernel<kernel>
  Host host;
  Op op;
};

// channel.cpp's Backoff with the default spin_us = 20 (sleeps not doubled here).
struct Backoff {
  Clock::time_point start = Clock::now();
  void pause() {
    const auto waited = Clock::now() - start;
    if (waited < std::chrono::microseconds(20)) CPU_RELAX();
    else if (waited < std::chrono::microseconds(220)) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
};

// Stand-ins for the Channel::Impl members that a request touches.
struct Book {
  std::atomic<int> active{0};
  std::atomic<bool> closing{false}, broken{false};
  std::atomic<uint64_t> next_ticket{1}, slot_turn{1}, launched{0}, requests{0};
};

// check_device_range(): channel.cpp's 6-attribute query and its checks.
static void validate(const void* p, size_t n, int device) {
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                 CU_POINTER_ATTRIBUTE_IS_MANAGED,  CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                 CU_POINTER_ATTRIBUTE_RANGE_SIZE,  CU_POINTER_ATTRIBUTE_BUFFER_ID};
  unsigned memory_type = 0, managed = 0;
  int ordinal = -1;
  CUdeviceptr start = 0;
  size_t size = 0;
  unsigned long long buffer_id = 0;
  void* data[] = {&memory_type, &ordinal, &managed, &start, &size, &buffer_id};
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (cuPointerGetAttributes(6, attrs, data, a) != CUDA_SUCCESS || memory_type != CU_MEMORYTYPE_DEVICE ||
      managed || ordinal != device || size == 0 || a < start || n > start + size - a)
    die("cuPointerGetAttributes: unexpected attributes for the cudaMalloc buffer");
}

// One request with ticket t, started at t0 (its deadline: t0 + 2 s).
static void round_trip(Ring* r, const Variant& v, uint32_t t, Clock::time_point t0, unsigned char* dbuf,
                       int device, Book& book, cudaStream_t stream) {
  const auto deadline = t0 + kTimeout;
  const bool execute = v.host == Host::Execute;
  if (execute) {  // ping()'s clock read or write()/read()'s validation, Active, execute()'s prologue
    if (v.op == kNop) (void)Clock::now();
    book.active.fetch_add(1, std::memory_order_seq_cst);
    if (book.closing.load(std::memory_order_seq_cst) || book.broken.load(std::memory_order_acquire)) die("book");
    if (v.op != kNop) validate(dbuf, 4, device);
    (void)(Clock::now() + kTimeout);  // execute()'s deadline
    book.next_ticket.fetch_add(1, std::memory_order_relaxed);
    Backoff b;
    while (book.slot_turn.load(std::memory_order_acquire) != t) b.pause();
  }
  uint32_t d[32] = {};  // pack_request()
  d[0] = v.op;
  if (v.op != kNop) {
    const uint64_t a = reinterpret_cast<uintptr_t>(dbuf);
    d[1] = 4, d[2] = static_cast<uint32_t>(a), d[3] = static_cast<uint32_t>(a >> 32);
    if (v.op == kWrite) d[6] = t;  // the 4 bytes written: the ticket
  }
  if (v.host == Host::OneWord) {
    SysRef(r->req[0]).store(make_word(t, d[0]), cuda::memory_order_relaxed);
  } else if (v.host == Host::Words) {
    for (int i = 0; i < 32; ++i) SysRef(r->req[i]).store(make_word(t, d[i]), cuda::memory_order_relaxed);
  } else {  // publish(), then execute()'s seq_cst fence
    for (int i = 31; i > 0; --i) SysRef(r->req[i]).store(make_word(t, d[i]), cuda::memory_order_release);
    SysRef(r->req[0]).store(make_word(t, d[0]), cuda::memory_order_release);
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  SysRef done(r->done);
  if (!execute) {
    const auto mo = v.host == Host::Publish ? cuda::memory_order_acquire : cuda::memory_order_relaxed;
    for (unsigned spins = 1; tag_of(done.load(mo)) != t; ++spins)
      if (spins % 1024 == 0 && Clock::now() > deadline) die("no answer from the kernel within 2 s");
    return;
  }
  {  // ensure_serving(): generation 0 is running
    Backoff b;
    const uint64_t s = SysRef(r->state).load(cuda::memory_order_acquire);
    if ((s >> 2) != book.launched.load(std::memory_order_acquire) || (s & 3) != 1) die("state");
  }
  Backoff b;  // await_done()
  auto next_stream_check = Clock::now() + std::chrono::milliseconds(1);
  while (tag_of(done.load(cuda::memory_order_acquire)) != t) {
    if (book.broken.load(std::memory_order_acquire)) die("broken");
    const auto now = Clock::now();
    if (now >= next_stream_check) {
      const cudaError_t e = cudaStreamQuery(stream);
      if (e != cudaSuccess && e != cudaErrorNotReady) die("the kernel's stream reports an error");
      next_stream_check = now + std::chrono::milliseconds(1);
    }
    if (now >= deadline) die("no answer from the kernel within 2 s");
    b.pause();
  }
  if (v.op == kRead) {
    uint32_t got;
    std::memcpy(&got, r->payload + (reinterpret_cast<uintptr_t>(dbuf) & 15), 4);
    if (got != 0xA1B2C3D4u) die("a read returned the wrong bytes");
  }
  book.slot_turn.store(t + 1, std::memory_order_release);
  book.requests.fetch_add(1, std::memory_order_relaxed);
  book.active.fetch_sub(1, std::memory_order_seq_cst);
  if (v.op == kNop) (void)Clock::now();  // ping()'s second clock read
}

static void launch(int kernel, Ring* dring, cudaStream_t s) {
  switch (kernel) {
    case 0: one_word_kernel<0><<<1, 1, 0, s>>>(dring); break;
    case 1: one_word_kernel<1><<<1, 32, 0, s>>>(dring); break;
    case 2: one_word_kernel<2><<<1, 32, 0, s>>>(dring); break;
    case 32: lanes_kernel<32><<<1, 32, 0, s>>>(dring); break;
    default: lanes_kernel<256><<<1, 256, 0, s>>>(dring); break;
  }
  CK(cudaGetLastError());
}

struct Stats { double median, p10, p99, min; };
static Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[static_cast<size_t>(q * (v.size() - 1) + 0.5)]; };
  return {at(0.5), at(0.1), at(0.99), v.front()};
}

// ns per call: the mean of a batch of n calls (no clock read between them),
// and the median / p99 of n more, each timed alone (one clock read included).
struct HostCost { const char* what; double mean; Stats each; };
template <class F>
static HostCost time_calls(const char* what, int n, F&& f) {
  const auto start = Clock::now();
  for (int i = 0; i < n; ++i) f();
  const double mean = std::chrono::duration<double, std::nano>(Clock::now() - start).count() / n;
  std::vector<double> ns;
  for (int i = 0; i < n; ++i) {
    const auto a = Clock::now();
    f();
    ns.push_back(std::chrono::duration<double, std::nano>(Clock::now() - a).count());
  }
  return {what, mean, stats(std::move(ns))};
}

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 5000, warm = argc > 2 ? std::atoi(argv[2]) : 200;
  if (iters < 1 || warm < 0) die("usage: channel-latency [timed_round_trips] [warmup]");
  const int device = 0;
  CK(cudaSetDevice(device));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, device));
  char clocksource[64] = "?";  // steady_clock is a vDSO read only with tsc / kvm-clock
  if (FILE* f = std::fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r")) {
    if (std::fscanf(f, "%63s", clocksource) != 1) std::strcpy(clocksource, "?");
    std::fclose(f);
  }
  std::printf("%s (bus %02x), host clocksource %s; %d warm-up + %d timed round trips per variant\n", prop.name,
              prop.pciBusID, clocksource, warm, iters);

  int least = 0, greatest = 0;
  CK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t stream;
  CK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest));
  Ring *ring = nullptr, *dring = nullptr;
  CK(cudaHostAlloc(reinterpret_cast<void**>(&ring), sizeof(Ring), cudaHostAllocMapped | cudaHostAllocPortable));
  CK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dring), ring, 0));
  unsigned char* dbuf = nullptr;  // the device buffer writes and reads address (16-byte aligned)
  CK(cudaMalloc(reinterpret_cast<void**>(&dbuf), 4096));
  uint32_t pageable = 0, *pinned = nullptr;
  CK(cudaMallocHost(reinterpret_cast<void**>(&pinned), 4));

  // Host-side costs, no kernel running.
  const HostCost host[] = {
      time_calls("steady_clock::now()", 10000, [] { (void)Clock::now(); }),
      time_calls("cuPointerGetAttributes, channel.cpp's 6 attributes", 10000, [&] { validate(dbuf + 16, 4, device); }),
      time_calls("cudaPointerGetAttributes", 10000, [&] {
        cudaPointerAttributes a{};
        CK(cudaPointerGetAttributes(&a, dbuf + 16));
      }),
      time_calls("cudaMemcpy 4 B H2D, pageable", 2000, [&] { CK(cudaMemcpy(dbuf, &pageable, 4, cudaMemcpyHostToDevice)); }),
      time_calls("cudaMemcpy 4 B D2H, pageable", 2000, [&] { CK(cudaMemcpy(&pageable, dbuf, 4, cudaMemcpyDeviceToHost)); }),
      time_calls("cudaMemcpy 4 B H2D, pinned", 2000, [&] { CK(cudaMemcpy(dbuf, pinned, 4, cudaMemcpyHostToDevice)); }),
      time_calls("cudaMemcpy 4 B D2H, pinned", 2000, [&] { CK(cudaMemcpy(pinned, dbuf, 4, cudaMemcpyDeviceToHost)); }),
  };

  // [n]: the suspect a step isolates: 1 validation, 2 polling 32 words + stop, 3 acquire
  // fence, 4 release store + __syncthreads, 5 256-thread block, 6 host publishes 32
  // words with release stores, 7 host polls with acquire loads.
  const Variant variants[] = {
      {"A", "minimal: 1 thread, volatile, membar.sys", nullptr, 0, Host::OneWord, kNop},
      {"B", "A with acquire fence + release store (sys) [3,4]", "A", 1, Host::OneWord, kNop},
      {"B2", "B without the acquire fence [3]", "B", 2, Host::OneWord, kNop},
      {"B3", "B, host publishes 32 words like channel [6]", "B", 1, Host::Publish, kNop},
      {"C", "B, 32 lanes poll 32 words + stop word [2]", "B", 32, Host::Words, kNop},
      {"D", "C in 256 threads, shared, 2 syncthreads [4,5]", "C", 256, Host::Words, kNop},
      {"E", "D, host publishes like channel.cpp [6,7]", "D", 256, Host::Publish, kNop},
      {"F", "D + 4-byte write", "D", 256, Host::Words, kWrite},
      {"G", "E + channel.cpp host path (~ ping) [7]", "E", 256, Host::Execute, kNop},
      {"H", "G + validation + 4-byte write (~ write) [1]", "G", 256, Host::Execute, kWrite},
      {"R", "G + validation + 4-byte read (~ read) [1]", "G", 256, Host::Execute, kRead},
  };
  constexpr int kVariants = sizeof variants / sizeof variants[0];
  Stats result[kVariants];
  for (int i = 0; i < kVariants; ++i) {
    const Variant& v = variants[i];
    const uint32_t pattern = 0xA1B2C3D4u;  // what R must read
    CK(cudaMemcpy(dbuf, &pattern, 4, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());  // a pageable H2D copy may return before it lands
    std::memset(ring, 0, sizeof(Ring));  // every tag 0; the first ticket is 1
    ring->state = 1;                     // generation 0, running
    std::atomic_thread_fence(std::memory_order_seq_cst);
    g_ring = ring;
    launch(v.kernel, dring, stream);
    Book book;
    std::vector<double> us;
    for (uint32_t t = 1; t <= static_cast<uint32_t>(warm + iters); ++t) {
      const auto t0 = Clock::now();
      round_trip(ring, v, t, t0, dbuf, device, book, stream);
      const auto t1 = Clock::now();
      if (t > static_cast<uint32_t>(warm)) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    SysRef(ring->stop).store(1, cuda::memory_order_seq_cst);
    const auto deadline = Clock::now() + kTimeout;
    cudaError_t e;
    while ((e = cudaStreamQuery(stream)) == cudaErrorNotReady)
      if (Clock::now() > deadline) die("a kernel did not leave within 2 s of the stop flag");
    CK(e);
    g_ring = nullptr;
    if (v.op == kWrite) {
      uint32_t got = 0;
      CK(cudaMemcpy(&got, dbuf, 4, cudaMemcpyDeviceToHost));
      if (got != static_cast<uint32_t>(warm + iters)) die("the device buffer does not hold the last write");
    }
    result[i] = stats(std::move(us));
    std::printf("  %s: median %.2f us\n", v.id, result[i].median);
    std::fflush(stdout);
  }

  std::printf("\nRound trips, us (vs: the variant it extends; +: the median's difference)\n"
              "%-3s %-48s %7s %7s %7s %7s %3s %6s\n", "id", "variant", "median", "p10", "p99", "min", "vs", "+");
  for (int i = 0; i < kVariants; ++i) {
    const Variant& v = variants[i];
    double base = 0;
    for (int j = 0; j < i; ++j)
      if (v.base && !std::strcmp(variants[j].id, v.base)) base = result[j].median;
    std::printf("%-3s %-48s %7.2f %7.2f %7.2f %7.2f %3s %+6.2f\n", v.id, v.what, result[i].median, result[i].p10,
                result[i].p99, result[i].min, v.base ? v.base : "-", v.base ? result[i].median - base : 0.0);
  }
  std::printf("\nHost calls, ns per call (mean: batch / n; median, p99: each call timed alone)\n%-52s %8s %8s %8s\n",
              "call", "mean", "median", "p99");
  for (const HostCost& h : host)
    std::printf("%-52s %8.0f %8.0f %8.0f\n", h.what, h.mean, h.each.median, h.each.p99);

  CK(cudaFree(dbuf));
  CK(cudaFreeHost(pinned));
  CK(cudaFreeHost(ring));
  CK(cudaStreamDestroy(stream));
  return 0;
}
